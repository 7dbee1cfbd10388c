"""create against the original data_utils.py on random corpora and random flags.

Needs a checkout of the original named by XLNET_REF (see ../shared/README.md); skipped otherwise (CI
has none). DIFFERENTIAL_CASES sets how many random cases to run (default 6).
"""

import os
import random
import string
import subprocess
import sys

import pytest
from conftest import SHARED, XLNET_SPM, needs_shared, read_save_dir, record_infos, run_module
from test_golden import assert_same_records

XLNET_REF = os.environ.get("XLNET_REF")
pytestmark = [needs_shared, pytest.mark.skipif(not XLNET_REF, reason="XLNET_REF (a checkout of the original) is not set")]

WORDS = ["the", "of", "Alice", "rabbit", "naïve", "café", "Zürich", "résumé", "1,000", "2000,", "19,", "3.5",
         "``quoted''", "(paren)", "well-known", "東京", "한국어", "ไทย", "don't", "e-mail", "$5", "x", "über",
         "façade", "—", "...", "?", "!", "ΟΔΟΣ", "İstanbul", "ﬁnal", "①", "Ǆemal", "straße", "Tiếng Việt", "😀"]


def random_sentence(rng):
    words = [rng.choice(WORDS) if rng.random() < 0.6 else
             "".join(rng.choice(string.ascii_letters + "0123456789,") for _ in range(rng.randint(1, 9)))
             for _ in range(rng.randint(1, 25))]
    sentence = " ".join(words)
    if rng.random() < 0.15:
        sentence += "<eop>"
    if rng.random() < 0.1:
        sentence = "  " + sentence.replace(" ", " \t ") + "  "
    if rng.random() < 0.1:  # whitespace that is not a line break for tf.gfile, but is for str.splitlines
        sentence = sentence.replace(" ", rng.choice(["\u2028", "\x0b", "\x1c", "\x85", "\xa0", "\u3000"]), 2)
    if rng.random() < 0.1:
        sentence += "\r"
    return sentence


def random_corpus(rng, directory, from_raw_text):
    os.makedirs(directory)
    for f in range(rng.randint(1, 5)):
        lines = []
        for _ in range(rng.randint(20, 400)):
            if rng.random() < 0.05:
                lines.append("")
            elif from_raw_text:
                lines.append(random_sentence(rng))
            else:
                lines.append(" ".join(str(rng.randint(0, 31999)) for _ in range(rng.randint(1, 30))))
        with open(os.path.join(directory, f"doc{f}.txt"), "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + ("\n" if rng.random() < 0.8 else ""))


def random_flags(rng):
    seq_len = rng.choice([16, 32, 48, 64, 128])
    num_core = rng.choice([1, 2])
    bi_data = rng.random() < 0.6
    bsz = rng.choice([2, 4, 8]) * (2 * num_core if bi_data else num_core)
    alpha = rng.randint(1, 7)
    beta = rng.randint(1, alpha)
    num_task = rng.choice([1, 1, 2, 3])
    flags = {
        "use_tpu": rng.choice([True, False]), "bsz_per_host": bsz, "num_core_per_host": num_core,
        "seq_len": seq_len, "reuse_len": seq_len // 2, "uncased": rng.choice([True, False]), "bi_data": bi_data,
        "mask_alpha": alpha, "mask_beta": beta, "use_eod": rng.choice([True, False]),
        "from_raw_text": rng.random() < 0.8, "num_predict": rng.randint(0, seq_len // 2),
        "num_task": num_task, "task": rng.randrange(num_task), "pass_id": rng.randint(0, 3),
        "split": rng.choice(["train", "dev"]),
    }
    if not flags["use_tpu"] and bi_data:
        flags["bsz_per_host"] = rng.choice([2, 4, 8])
    return flags


def run_both(args, tmp_path):
    """The original (run_original.py) into tmp_path/original and create into tmp_path/ours, same flags."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    original = subprocess.run([sys.executable, str(SHARED / "tools" / "run_original.py"), *args,
                               f"--save_dir={tmp_path}/original"], env=env, capture_output=True, text=True,
                              timeout=600)
    assert original.returncode == 0, original.stderr[-2000:]
    ours = run_module("xlnet_data.create", *args, f"--save_dir={tmp_path}/ours", "--num_workers=1")
    assert ours.returncode == 0, ours.stderr


@pytest.mark.parametrize("seed", range(int(os.environ.get("DIFFERENTIAL_CASES", "6"))))
def test_random_corpus_and_flags_match_the_original(seed, tmp_path):
    rng = random.Random(seed)
    flags = random_flags(rng)
    random_corpus(rng, tmp_path / "input", flags["from_raw_text"])
    args = [f"--{k}={v}" for k, v in flags.items()] + [f"--input_glob={tmp_path}/input/*.txt", f"--sp_path={XLNET_SPM}"]
    run_both(args, tmp_path)
    infos = record_infos(tmp_path / "original")
    if all(num_batch == 0 for num_batch, _ in infos.values()):
        # The original leaves an empty file behind; we write nothing for a corpus too small for a batch.
        assert read_save_dir(tmp_path / "ours") == {}, flags
        return
    assert_same_records(tmp_path / "original", tmp_path / "ours")
    print(f"seed {seed}: {sum(n for n, _ in infos.values())} batches identical; flags {flags}")


@pytest.mark.parametrize("seed", range(3))
def test_long_lines_without_sentence_boundaries_match_the_original(seed, tmp_path):
    """Rows with few sentence boundaries (lines of thousands of words) give the original's pairs."""
    rng = random.Random(1000 + seed)
    os.makedirs(tmp_path / "input")
    lines = [" ".join(random_sentence(rng) for _ in range(rng.choice([1, 2, 30, 80]))) for _ in range(12)]
    (tmp_path / "input" / "long.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = [f"--input_glob={tmp_path}/input/*.txt", f"--sp_path={XLNET_SPM}", "--seq_len=64", "--reuse_len=32",
            "--bsz_per_host=4", "--num_core_per_host=1", "--use_tpu=False", "--num_predict=10",
            f"--bi_data={seed != 1}", f"--pass_id={seed}"]
    run_both(args, tmp_path)
    assert sum(n for n, _ in record_infos(tmp_path / "original").values()) > 0
    assert_same_records(tmp_path / "original", tmp_path / "ours")
