"""The package's shape: commands import together, the record-making library never loads TensorFlow,
the Python API works in one call, the README's code map lists exactly the modules there are, and every
relative link of README.md and docs/ leads somewhere."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SAMPLE_CORPUS

PACKAGE = ROOT / "xlnet_data"


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_command_imports_in_one_process():
    result = run_python("import xlnet_data.create, xlnet_data.train_gpu, xlnet_data.dump, xlnet_data.spm_train; "
                        "from absl import flags; print(len(list(flags.FLAGS)))")
    assert result.returncode == 0, result.stderr


def _imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_the_record_making_library_never_imports_tensorflow():
    for path in sorted((PACKAGE / "datagen").rglob("*.py")):
        tf_imports = [name for name in _imported_modules(path) if name.split(".")[0] in ("tensorflow", "keras")]
        assert not tf_imports, (path, tf_imports)
    # And at run time: importing every datagen (prepare/ included) and common module loads neither TensorFlow
    # nor pretrain/.
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for sub in ("datagen", "common") for p in sorted((PACKAGE / sub).rglob("*.py"))]
    assert "xlnet_data.datagen.prepare.readers" in modules
    result = run_python(f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
                        "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'xlnet_data.pretrain'))))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_layers_import_downwards_only():
    """common/ is below both libraries and imports neither; datagen/ (prepare/ included) never imports
    pretrain/; neither imports a command module. Imports inside functions count too."""
    allowed = {"common": ("xlnet_data.common",), "datagen": ("xlnet_data.common", "xlnet_data.datagen")}
    checked = 0
    for folder, prefixes in allowed.items():
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            ours = [name for name in _imported_modules(path) if name.split(".")[0] == "xlnet_data"]
            upward = [name for name in ours if not name.startswith(tuple(p + "." for p in prefixes))
                      and name not in prefixes]
            assert not upward, (str(path.relative_to(ROOT)), upward)
            checked += bool(ours)
    assert checked > 20  # the walk saw the package's own imports


def test_import_xlnet_data_is_cheap_and_the_api_resolves_lazily():
    result = run_python("import sys, xlnet_data\n"
                        "heavy = [m for m in ('tensorflow', 'numba', 'sentencepiece') if m in sys.modules]\n"
                        "print(heavy, xlnet_data.create_records.__module__, xlnet_data.TrainConfig.__module__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "xlnet_data.datagen.job", "xlnet_data.pretrain.training"]


def test_create_records_in_one_call_and_read_them_back(tmp_path, sample_spm):
    import xlnet_data as xd

    config = xd.CreateConfig(input_glob=str(SAMPLE_CORPUS / "*.txt"), sp_path=sample_spm,
                             save_dir=str(tmp_path / "out"), seq_len=64, reuse_len=32, bsz_per_host=4,
                             num_core_per_host=1, use_tpu=False, num_predict=10, num_passes=2).validate()
    summary = xd.create_records(config, num_workers=1)
    assert [(r.unit.task, r.unit.pass_id) for r in summary.units] == [(0, 0), (0, 1)]
    examples = list(xd.read_examples(str(tmp_path / "out")))
    assert len(examples) == summary.total("records") == 4 * summary.total("num_batch") > 0
    assert all(ex["input"].shape == (64,) and int(ex["is_masked"].sum()) == 10 for ex in examples)
    decoded = xd.decode_example(examples[0], reuse_len=32)
    assert decoded.layout_ok and decoded.target_check.num_violations == 0
    assert summary.line(1.0).startswith(f"done: 2 unit(s), {summary.total('tokens')} tokens")


def test_readme_code_map_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Code map", 1)[1].split("\n## ", 1)[0]
    listed, folders = set(), []  # folders: (indent, path) of the folder lines above, innermost last
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        folders = [(i, path) for i, path in folders if i < indent]
        match = re.match(r"^ +(\w+)/\s", line)
        if match and indent > 4:
            folders.append((indent, (folders[-1][1] if folders else "") + match.group(1) + "/"))
            continue
        for name in re.findall(r"\b([a-z_][a-z0-9_]*\.py)\b", line):
            listed.add((folders[-1][1] if folders else "") + name)
    actual = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert listed == actual, (sorted(actual - listed), sorted(listed - actual))


def _markdown_prose(path):
    """The lines of a Markdown file outside code blocks (fenced, or indented by 4 spaces after a blank line)."""
    lines, fenced, indented, previous = [], False, False, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            indented = line.startswith("    ") and (indented or not previous.strip())
            if not indented:
                lines.append(line)
        previous = line
    return lines


def _heading_anchors(path):
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in _markdown_prose(path):
        if match := re.match(r"^#+ (.*)", line):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-"))
    return anchors


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file_and_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 10
    broken, checked = [], 0
    for page in pages:
        for line in _markdown_prose(page):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):  # https:, mailto:
                    continue
                checked += 1
                file, _, anchor = target.partition("#")
                linked = (page.parent / file).resolve() if file else page
                if not linked.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
                elif anchor and anchor not in _heading_anchors(linked):
                    broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert checked > 50
    assert not broken, broken


def test_the_compiled_code_cache_is_keyed_on_every_compiled_source(tmp_path, monkeypatch):
    """numba checks a cached function against its own file only; a change to a function it inlines from
    another file (units._write_steps inlines records.put_record) must lead to another cache folder."""
    import shutil

    from xlnet_data.common import compiled
    package = tmp_path / "xlnet_data"
    for folder in ("common", "datagen"):
        shutil.copytree(Path(compiled._PACKAGE) / folder, package / folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(compiled, "_PACKAGE", str(package))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    before = compiled._cache_dir()
    assert before.startswith(str(tmp_path / "cache"))
    assert compiled._cache_dir() == before
    with open(package / "common" / "records.py", "a") as f:
        f.write("\n# a change\n")
    after_records = compiled._cache_dir()
    assert after_records != before
    with open(package / "common" / "crc32c.py", "a") as f:  # put_record inlines masked_crc32c from here
        f.write("\n# a change\n")
    assert compiled._cache_dir() not in (before, after_records)
