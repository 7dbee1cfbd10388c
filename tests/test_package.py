"""The package's shape: commands import together, the record-making library never loads TensorFlow,
the Python API works in one call, the README's code map lists exactly the modules there are, and every
relative link of README.md and docs/ leads somewhere."""

import ast
import re
import subprocess
import sys

import pytest
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


@pytest.mark.slow
def test_the_record_making_library_and_the_data_format_never_import_tensorflow():
    for path in sorted((PACKAGE / "datagen").rglob("*.py")) + sorted((PACKAGE / "dataformat").rglob("*.py")):
        tf_imports = [name for name in _imported_modules(path) if name.split(".")[0] in ("tensorflow", "keras")]
        assert not tf_imports, (path, tf_imports)
    # And at run time: importing every datagen (prepare/ included), dataformat and common module loads neither
    # TensorFlow nor pretrain/.
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for sub in ("datagen", "dataformat", "common") for p in sorted((PACKAGE / sub).rglob("*.py"))]
    assert {"xlnet_data.datagen.prepare.readers", "xlnet_data.dataformat.examples.generated"} <= set(modules)
    result = run_python(f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
                        "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'xlnet_data.pretrain'))))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# Each room imports only from itself and the rooms below it: common/ (plumbing) below dataformat/ (what a
# save_dir holds), below datagen/ and pretrain/ side by side, below the command modules.
LAYERS = {
    "common": ("xlnet_data.common",),
    "dataformat": ("xlnet_data.common", "xlnet_data.dataformat"),
    "datagen": ("xlnet_data.common", "xlnet_data.dataformat", "xlnet_data.datagen"),
    "pretrain": ("xlnet_data.common", "xlnet_data.dataformat", "xlnet_data.pretrain"),
}


def test_the_layers_import_downwards_only():
    """common/ imports no other room; dataformat/ only common/; datagen/ (prepare/ included) and pretrain/
    never import each other; none imports a command module. Imports inside functions count too."""
    checked = {}
    for folder, prefixes in LAYERS.items():
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            ours = [name for name in _imported_modules(path) if name.split(".")[0] == "xlnet_data"]
            upward = [name for name in ours if not name.startswith(tuple(p + "." for p in prefixes))
                      and name not in prefixes]
            assert not upward, (str(path.relative_to(ROOT)), upward)
            checked[folder] = checked.get(folder, 0) + bool(ours)
    assert all(checked.get(folder) for folder in LAYERS) and sum(checked.values()) > 30, checked  # the walk saw them


# create's stages within datagen/, each importing only those after it: the run (job) drives the runners, which
# follow the plan and run the units; a unit takes its task's ids from the encode stage. What the plan and the
# units both need lies below them: file names (dataformat/save_dir.py), create_settings (dataformat/record_info.py).
CREATE_STAGES = ("job", "local_runner", "beam_runner", "plan", "units", "encode")


def test_creates_stages_import_one_way():
    for i, stage in enumerate(CREATE_STAGES):
        tree = ast.parse((PACKAGE / "datagen" / f"{stage}.py").read_text())
        named = {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module for alias in node.names} | {alias.name for node in ast.walk(tree)
                                                             if isinstance(node, ast.Import) for alias in node.names}
        earlier = {f"xlnet_data.datagen.{other}" for other in CREATE_STAGES[:i + 1]}
        backward = sorted(name for name in named if name in earlier or name.rsplit(".", 1)[0] in earlier)
        assert not backward, (stage, backward)


def test_dump_needs_only_the_data_format():
    """dump reads records, cache-backed units and corpus_info through dataformat/ alone."""
    ours = {name for name in _imported_modules(PACKAGE / "dump.py") if name.split(".")[0] == "xlnet_data"}
    assert ours and all(name.startswith(("xlnet_data.common", "xlnet_data.dataformat")) or name == "xlnet_data.cli"
                        or name == "xlnet_data" for name in ours), ours


def test_import_xlnet_data_is_cheap_and_the_api_resolves_lazily():
    result = run_python("import sys, xlnet_data\n"
                        "heavy = [m for m in ('tensorflow', 'numba', 'sentencepiece') if m in sys.modules]\n"
                        "print(heavy, xlnet_data.create_records.__module__, xlnet_data.TrainConfig.__module__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "xlnet_data.datagen.job", "xlnet_data.pretrain.config"]


@pytest.mark.slow
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


def test_the_compiled_code_cache_is_keyed_on_the_package_code(tmp_path, monkeypatch):
    """numba checks a cached function against its own file only; a change to a function it inlines from
    another file (loop._write_steps inlines records.put_record), to a constant it reads (vocab.CLS_ID), or
    compiled code moved to a new folder must each lead to another cache folder; a change to a file that no compiled
    code imports must not."""
    import shutil

    from xlnet_data.common import compiled
    package = tmp_path / "xlnet_data"
    shutil.copytree(compiled._PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(compiled, "_PACKAGE", str(package))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    before = compiled._cache_dir()
    assert before.startswith(str(tmp_path / "cache"))
    assert compiled._cache_dir() == before
    seen = {before}
    for changed in ("dataformat/records.py", "dataformat/crc32c.py", "dataformat/vocab.py",
                    "dataformat/examples/loop.py"):
        with open(package / changed, "a") as f:
            f.write("\n# a change\n")
        key = compiled._cache_dir()
        assert key not in seen, changed
        seen.add(key)
    # What compiled code never imports (the trainers, the commands) keeps the key: an edit there recompiles nothing.
    for unrelated in ("train_gpu.py", "pretrain/costs.py", "datagen/job.py"):
        with open(package / unrelated, "a") as f:
            f.write("\n# a change\n")
        assert compiled._cache_dir() == key, unrelated
    (package / "new_room").mkdir()
    shutil.move(package / "dataformat" / "examples" / "masking.py", package / "new_room" / "masking.py")
    assert compiled._cache_dir() not in seen


_COMMAND_WITH_ERRORS = """
import sys
from xlnet_data import cli
from xlnet_data.common.errors import UserError

def main(argv):
    kind = argv[1]
    print("shown before the error")
    if kind == "user":
        raise UserError("the flag was wrong\\nsecond line")
    if kind == "os":
        raise FileNotFoundError(2, "No such file or directory", "/no/such/file")
    raise ValueError("a bug")

cli.run(main, "demo", "a command", lambda: None)
"""


def test_cli_run_is_the_commands_one_handler_of_user_errors():
    """A UserError or OSError out of a command's main is one line and exit 2, after what main printed; any other
    exception is a bug and keeps its traceback."""
    def run(kind):
        return subprocess.run([sys.executable, "-c", _COMMAND_WITH_ERRORS, kind], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    user, missing, bug = run("user"), run("os"), run("bug")
    assert (user.returncode, user.stderr, user.stdout) == (2, "demo: error: the flag was wrong\n",
                                                           "shown before the error\n")
    assert (missing.returncode, missing.stderr) == (2, "demo: error: /no/such/file: No such file or directory\n")
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "ValueError: a bug" in bug.stderr


def test_only_cli_run_catches_the_user_error_root():
    """The command modules leave UserError to cli.run (the one place that turns it into a line)."""
    catching = [path.name for path in sorted(PACKAGE.glob("*.py")) if path.name != "cli.py"
                and re.search(r"except \(?[\w, ]*UserError", path.read_text())]
    assert catching == []


def test_the_readme_tells_a_new_user_what_costs_and_what_to_look_at(sample_spm):
    """What a user on their own corpus needs (issue 36): the one-document-per-file layout, the records' disk cost and
    --nowrite_records, how to look at TensorBoard (an extra), and that the README's example outputs stay out of git;
    languages.md says what decoded Thai gives (SentencePiece's NFKC, not the source's code points)."""
    import configparser

    import sentencepiece as spm

    readme = (ROOT / "README.md").read_text()
    own_corpus = readme.split("On your own corpus:", 1)[1].split("## ", 1)[0]
    for needed in ("--text_layout=file", "--nowrite_records", "bytes a token", "warns when"):
        assert needed in own_corpus, needed
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    assert "tensorboard" in extras["options.extras_require"]["tensorboard"]
    assert "tensorboard --logdir=models" in readme and "| `tensorboard` |" in readme
    paths = ["corpus/a", "spm/a.model", "proc_data/a", "models/a", "hf/a"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == paths, ignored
    assert spm.SentencePieceProcessor(model_file=sample_spm).normalize("\u0e33") == "\u2581\u0e4d\u0e32"
    assert "`ำ` (SARA AM) decodes as `ํ` + `า`" in (ROOT / "docs" / "languages.md").read_text()
