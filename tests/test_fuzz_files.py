"""Crafted files never reach outside an array (issue 46): crafted SentencePiece models refused in one line, and
random mutants of a model's charsmap and of a token cache's index and regions (tests/fuzz_files.py) through the
loaders that feed the compiled loops, in subprocesses with numba's bounds checks on (NUMBA_BOUNDSCHECK=1, in a
numba cache folder of its own: numba's cache does not key on it) and off, as users run. A fresh seed each run, in
the assert message and the output (XLNET_FUZZ_SEED=S repeats one): an IndexError, any exception but a UserError,
or a signal fails the test."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, SAMPLE_CORPUS
from fuzz_files import boundscheck_cache

from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records

CHARSMAPS, CACHES = 300, 300  # mutants of each a subprocess: 15 s in all here (numba's cache warm)
SETTINGS = 100  # create_settings mutants: most refused before any record is made


@pytest.fixture(scope="module")
def cache_backed(sample_spm, tmp_path_factory):
    """A cache-backed save_dir of three files (three shards), one pass."""
    text_dir = tmp_path_factory.mktemp("fuzz_text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:90]
    for i in range(3):
        (text_dir / f"part{i}.txt").write_text("\n".join(lines[30 * i:30 * i + 30]) + "\n")
    save_dir = tmp_path_factory.mktemp("fuzz") / "cache"
    config = CreateConfig(input_glob=str(text_dir / "*.txt"), sp_path=sample_spm, save_dir=str(save_dir),
                          bsz_per_host=4, num_core_per_host=1, seq_len=32, reuse_len=16, bi_data=True, num_predict=5,
                          num_passes=1, write_records=False)
    create_records(config.validate(), num_workers=1)
    return str(save_dir)


@pytest.mark.slow  # numba code compiled with bounds checks (minutes on a cold cache), 700 mutants
@pytest.mark.parametrize("boundscheck", [1, 0])
def test_mutated_charsmaps_and_token_caches_are_refused_in_one_line_or_read(cache_backed, sample_spm, tmp_path,
                                                                            boundscheck):
    seed = int(os.environ.get("XLNET_FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"fuzz seed {seed} (XLNET_FUZZ_SEED={seed} repeats it), NUMBA_BOUNDSCHECK={boundscheck}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_BOUNDSCHECK=str(boundscheck))
    if boundscheck:
        env["NUMBA_CACHE_DIR"] = boundscheck_cache()
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_files.py"), f"--seed={seed}",
                             f"--charsmaps={CHARSMAPS}", f"--caches={CACHES}", f"--settings={SETTINGS}",
                             f"--model={sample_spm}",
                             f"--save_dir={cache_backed}", f"--work={tmp_path}"],
                            env=env, capture_output=True, text=True, timeout=600)
    where = f"seed {seed}, NUMBA_BOUNDSCHECK={boundscheck}"
    assert result.returncode == 0, f"{where}: exit {result.returncode}: {result.stderr[-3000:]}"
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["failures"], f"{where}: {len(found['failures'])} failures: {found['failures'][:10]}"
    assert found["accepted"] + found["refused"] == CHARSMAPS + CACHES + SETTINGS, found
    assert found["refused"] > (CHARSMAPS + CACHES + SETTINGS) // 2, found  # most mutants are damaged files


def _charsmap_crafts(charsmap):
    size = int.from_bytes(charsmap[:4], "little")
    units = bytearray(charsmap[4:4 + size])
    units[0:4] = (0xFFFFFC00).to_bytes(4, "little")  # the root's children far past the array
    return {"no units": (0).to_bytes(4, "little") + charsmap[4 + size:],  # darts_root read units[0] of nothing
            "no replacement strings": charsmap[:4 + size],  # a buffer grown until memory ran out
            "an offset past the array": charsmap[:4] + bytes(units) + charsmap[4 + size:]}


@pytest.mark.parametrize("craft", ["no units", "no replacement strings", "an offset past the array"])
def test_a_crafted_charsmap_is_refused_before_our_normaliser_walks_it(sample_spm, craft):
    """Issue 46: with sentencepiece 0.1.99 (setup.cfg allowed it) these models loaded, and building our
    normaliser's tables crashed create (SIGSEGV). Our own check refuses them, whatever sentencepiece says."""
    from fuzz_files import with_charsmap

    from xlnet_data.dataformat import spm_model
    from xlnet_data.datagen import spm_normalize
    with open(sample_spm, "rb") as f:
        data = f.read()
    model = spm_model.read_model_proto(data)
    crafted = _charsmap_crafts(model.charsmap)[craft]
    with pytest.raises(spm_model.ModelFormatError, match=r"its normalisation table \(precompiled_charsmap\) is "
                                                         r"damaged: (its array|a node's children)"):
        spm_model.read_model_proto(with_charsmap(data, crafted))
    with pytest.raises(spm_model.ModelFormatError):  # a model made in memory is checked too
        spm_normalize.normalizer_tables(model._replace(charsmap=crafted))


@pytest.fixture(scope="module")
def crafted_models(sample_spm, tmp_path_factory):
    from fuzz_files import with_charsmap, with_piece

    from xlnet_data.dataformat import spm_model
    folder = tmp_path_factory.mktemp("crafted_models")
    with open(sample_spm, "rb") as f:
        data = f.read()
    (folder / "piece.model").write_bytes(with_piece(data, 100, b"\xff\xfeab"))
    charsmap = spm_model.read_model_proto(data).charsmap
    (folder / "charsmap.model").write_bytes(with_charsmap(data, _charsmap_crafts(charsmap)["an offset past the array"]))
    return folder


@pytest.mark.parametrize("model, encoder, said", [
    ("piece.model", "auto", r"piece 100 b'\\xff\\xfeab' is not valid UTF-8"),
    ("piece.model", "ours", r"piece 100 b'\\xff\\xfeab' is not valid UTF-8"),
    ("piece.model", "sentencepiece", r"piece 100 b'\\xff\\xfeab' is not valid UTF-8"),
    ("charsmap.model", "auto", r"(its normalisation table \(precompiled_charsmap\) is damaged|INTERNAL)"),
])
def test_create_with_a_crafted_model_is_one_line_in_every_encoder_mode(crafted_models, tmp_path, model, encoder, said):
    """A piece that is not UTF-8 was a UnicodeDecodeError traceback in every encoder mode."""
    from conftest import run_module
    save_dir = tmp_path / "out"
    result = run_module("xlnet_data.create", f"--input_glob={SAMPLE_CORPUS / 'austen_emma.txt'}",
                        f"--sp_path={crafted_models / model}", f"--save_dir={save_dir}", f"--encoder={encoder}",
                        "--seq_len=64", "--reuse_len=32", "--bsz_per_host=4", "--num_core_per_host=1", "--num_predict=10")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert re.match(rf"create: error: .*{re.escape(str(crafted_models / model))}: {said}", line), line
    assert not list(save_dir.glob("tfrecords/*")), "nothing written"


def test_the_sentencepiece_floor_is_a_release_that_refuses_a_damaged_charsmap():
    """0.2.2 is the first release that refuses the crafted charsmaps above on load (0.1.99, 0.2.0: loaded; 0.2.1:
    two of three); docs/faults.md says how that was found."""
    import configparser

    from packaging.requirements import Requirement
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    requirements = [Requirement(line) for line in parser["options"]["install_requires"].splitlines()
                    if line.strip() and not line.strip().startswith("#")]
    (floor,) = [r.specifier for r in requirements if r.name == "sentencepiece"]
    assert "0.2.2" in floor and "0.2.1" not in floor and "0.1.99" not in floor
