"""Compiles the package's numba code into its on-disk cache before the test workers start (conftest's
pytest_configure runs it, on pytest-xdist's controller only): in a fresh clone the cache is empty, and every
process that runs create before the cache is written (each xdist worker, each create subprocess and pool worker of
a test) compiles the same code again, about a minute of CPU each on a 2-core machine.

One run covers what the suite compiles: create in memory (the encoder, the normaliser, the example loop, the
records writer) and into its token cache, the records made back from that cache, and a records file's checksum read back.
The caller runs it twice at once, on the two cores: with the usual cache, and with NUMBA_BOUNDSCHECK=1 in the
bounds-checked code's own cache (fuzz_files.boundscheck_cache(), test_fuzz_files' and test_unigram's).

    python tests/numba_warmup.py        # from the checkout; its exit status says whether it worked
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def warm(folder: Path) -> None:
    from xlnet_data.dataformat import crc32c
    from xlnet_data.dataformat.examples import generated
    from xlnet_data.datagen import tokenizer
    from xlnet_data.datagen.config import CreateConfig
    from xlnet_data.datagen.job import create_records

    lines = (ROOT / "sample_corpus" / "austen_emma.txt").read_text().splitlines()[:300]
    (folder / "text.txt").write_text("\n".join(lines) + "\n")
    model = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(  # XLNet's special ids, a charsmap (nmt_nfkc)
        input_files=(str(folder / "text.txt"),), model_prefix=str(folder / "warm"), vocab_size=300, num_threads=1))
    for name, write_records in (("records", True), ("cache", False)):
        config = CreateConfig(input_glob=str(folder / "text.txt"), sp_path=str(model),
                              save_dir=str(folder / name), bsz_per_host=4, num_core_per_host=1, seq_len=32,
                              reuse_len=16, num_predict=5, write_records=write_records)
        create_records(config.validate(), num_workers=1)
    units = generated.find_cache_units(str(folder / "cache" / "tfrecords"))
    assert units and next(generated.GeneratedStream(units, repeat=False).chunks(), None) is not None
    assert not crc32c.crc_matches(b"warm" + bytes(4), 4)  # masked_crc32c called on its own (records read back)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="numba-warmup-") as work:
        warm(Path(work))
