"""The encode stage: each task encoded once into a token cache that all its passes read back, in any order."""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN, golden_flags, needs_shared, run_module
from test_beam import needs_beam
from test_golden import assert_same_records

from xlnet_data.dataformat import provenance, save_dir, token_cache
from xlnet_data.datagen import corpus, encode
from xlnet_data.datagen.config import CreateConfig


def id_file(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(map(str, line)) + "\n" for line in lines))


def encode_files(tmp_path, sample_spm, files, **settings):
    """Encodes `files` as task 0 (ids input); returns (config, cache key)."""
    import sentencepiece as spm
    config = CreateConfig(input_glob="unused", sp_path=sample_spm, save_dir=str(tmp_path / "out"), from_raw_text=False,
                          **settings)
    key = encode.cache_key(encode.EncodeSettings.of(config), files, provenance.sha256_of(sample_spm))
    encode.encode_task(config.save_dir, encode.EncodeSettings.of(config), 0, files, key,
                       spm.SentencePieceProcessor(model_file=sample_spm))
    return config, key


def test_shards_are_flipped_so_that_files_never_merge_sentences(tmp_path, sample_spm):
    id_file(tmp_path / "a.txt", [[1], [2]])             # flags True, False
    id_file(tmp_path / "b.txt", [[3, 4], [5]])          # True, True, False
    id_file(tmp_path / "c.txt", [[6, 7]])               # True, True
    config, key = encode_files(tmp_path, sample_spm, [str(tmp_path / n) for n in ("a.txt", "b.txt", "c.txt")])
    index = token_cache.read_index(config.save_dir, 0, key)
    ids, flags, _ = token_cache.read_stream(config.save_dir, index, [0, 1, 2], 1000)
    assert ids.tolist() == [1, 2, 3, 4, 5, 6, 7] and flags.tolist() == [True, False, True, True, False, True, True]
    ids, flags, _ = token_cache.read_stream(config.save_dir, index, [2, 0, 1], 1000)  # c ends True, a starts True: a flipped
    assert ids.tolist() == [6, 7, 1, 2, 3, 4, 5]
    assert flags.tolist() == [True, True, False, True, False, False, True]


def test_read_stream_equals_the_files_concatenated_at_any_bit_offset(tmp_path, sample_spm, monkeypatch):
    """Files of odd token counts (flags packed across bytes and blocks), read back in pieces of 16 flags."""
    rng = np.random.default_rng(0)
    shards = []
    for i in range(5):
        lines = [rng.integers(0, 1000, rng.integers(1, 9)).tolist() for _ in range(rng.integers(20, 60))]
        id_file(tmp_path / f"f{i}.txt", lines)
        shards.append(corpus.read_shard(str(tmp_path / f"f{i}.txt"), None, from_raw_text=False, uncased=False,
                                        use_eod=True, vocab_size=1000))
    monkeypatch.setattr(token_cache, "CHUNK_TOKENS", 16)
    config, key = encode_files(tmp_path, sample_spm, [str(tmp_path / f"f{i}.txt") for i in range(5)])
    index = token_cache.read_index(config.save_dir, 0, key)
    order = [3, 0, 4, 2, 1]
    want_ids, want_flags, prev_last = [], [], None
    for i in order:  # the rule, written out: a file starting with the previous file's last flag is inverted
        flags = np.concatenate(shards[i].sent_ids)
        if prev_last is not None and flags[0] == prev_last:
            flags = ~flags
        want_ids += np.concatenate(shards[i].ids).tolist()
        want_flags += flags.tolist()
        prev_last = flags[-1]
    ids, flags, _ = token_cache.read_stream(config.save_dir, index, order, 1000)
    assert ids.tolist() == want_ids and flags.tolist() == want_flags
    with token_cache.mapped_stream(config.save_dir, index, order, 1000) as mapped:  # what the units read: the file mapped
        assert mapped.seg_ids.size == 5 and mapped.id_bytes == 2
        ids, flags, _ = mapped.arrays()
    assert ids.tolist() == want_ids and flags.tolist() == want_flags
    data_path, _ = save_dir.token_cache_paths(config.save_dir, 0, key)
    tokens = len(want_ids)
    assert os.path.getsize(data_path) <= 2 * tokens + tokens / 8 + len(order) * 3  # uint16 ids, packed flags, padding


def test_a_file_written_block_by_block_is_the_bytes_and_checksums_of_its_regions_written_whole():
    """ShardWriter (the encode stage writes each block of a file as it is read) against the format: ids, then the
    flags and the word starts packed, each region checksummed a chunk of `chunk_tokens` at a time."""
    import io

    from xlnet_data.dataformat.crc32c import crc32c
    rng = np.random.default_rng(2)
    ids, flags, starts = rng.integers(0, 1000, 1000), rng.random(1000) < 0.5, rng.random(1000) < 0.5
    out = io.BytesIO(b"x" * 10)
    out.seek(10)
    writer = token_cache.ShardWriter(out, 10, "<u2", True, chunk_tokens=64)
    cuts = [0, *sorted(rng.choice(np.arange(1, 1000), 30, replace=False)), 1000]  # blocks of any size, some > 64
    for begin, end in zip(cuts, cuts[1:]):
        writer.add(ids[begin:end], flags[begin:end], starts[begin:end])
    entry, offset = writer.finish()
    writer.close()
    regions = [ids.astype("<u2").tobytes(), *(b"".join(np.packbits(bits[k:k + 64]).tobytes() for k in range(0, 1000, 64))
                                              for bits in (flags, starts))]
    assert out.getvalue() == b"x" * 10 + b"".join(regions) and offset == 10 + sum(map(len, regions))
    assert [entry[f"{name}_offset"] for name in token_cache.REGIONS] == [10, 2010, 2010 + 125]
    want_crcs = [[int(crc32c(np.frombuffer(regions[0], np.uint8)[2 * k:2 * k + 128])) for k in range(0, 1000, 64)],
                 *([int(crc32c(np.packbits(bits[k:k + 64]))) for k in range(0, 1000, 64)] for bits in (flags, starts))]
    assert [entry[f"{name}_crc32c"] for name in token_cache.REGIONS] == want_crcs


def test_a_file_read_in_small_blocks_gives_the_same_cache(tmp_path, sample_spm, monkeypatch):
    """The encode stage reads a file a block at a time (corpus.READ_BLOCK_BYTES), never whole: blocks of 64
    bytes give the bytes and the index of one block, with blank lines (<eod>) across the cuts."""
    rng = np.random.default_rng(3)
    lines = [rng.integers(0, 1000, rng.integers(0, 9)).tolist() for _ in range(300)]
    id_file(tmp_path / "a.txt", lines)
    files = [str(tmp_path / "a.txt")]
    caches = []
    for block_bytes in (corpus.READ_BLOCK_BYTES, 64):
        monkeypatch.setattr(corpus, "READ_BLOCK_BYTES", block_bytes)
        config, key = encode_files(tmp_path / str(block_bytes), sample_spm, files, use_eod=True)
        data_path, index_path = save_dir.token_cache_paths(config.save_dir, 0, key)
        index = json.loads(Path(index_path).read_text())
        index["shards"][0].pop("chars")  # the line breaks counted less one a block: a share's denominator
        caches.append((Path(data_path).read_bytes(), index))
    assert caches[0] == caches[1] and caches[0][1]["shards"][0]["lines"] == 300


def test_a_task_encoded_in_memory_gives_the_stream_and_counts_of_its_cache(tmp_path, sample_spm):
    """A task's one unit takes its stream from memory (encode.EncodedTask): the same as the cache's, for
    files of odd sizes and one without tokens, in any order."""
    import sentencepiece as spm
    rng = np.random.default_rng(1)
    files = []
    for i in range(4):
        id_file(tmp_path / f"f{i}.txt", [rng.integers(0, 1000, rng.integers(1, 9)).tolist()
                                         for _ in range(rng.integers(20, 60))])
        files.append(str(tmp_path / f"f{i}.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    files.insert(2, str(tmp_path / "empty.txt"))
    config, key = encode_files(tmp_path, sample_spm, files, use_eod=False)
    index = token_cache.read_index(config.save_dir, 0, key)
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        encoded = encode.encode_in_memory(encode.EncodeSettings.of(config), 0, files,
                                          spm.SentencePieceProcessor(model_file=sample_spm))
        assert encoded.index.skipped_files == index.skipped_files == 1
        assert encoded.index.shards == [{k: v for k, v in shard.items() if not k.endswith(("_offset", "_crc32c"))}
                                        for shard in index.shards]
        ids, flags, _ = encoded.stream(order).arrays()
        want_ids, want_flags, _ = token_cache.read_stream(config.save_dir, index, order, 1000)
        assert ids.tolist() == want_ids.tolist() and flags.tolist() == want_flags.tolist()


def test_a_changed_file_model_or_flag_gives_another_key_and_a_found_cache_is_not_encoded_again(tmp_path, sample_spm,
                                                                                                caplog):
    id_file(tmp_path / "a.txt", [[1, 2], [3]])
    files = [str(tmp_path / "a.txt")]
    config, key = encode_files(tmp_path, sample_spm, files)
    caplog.set_level("INFO", logger="xlnet_data")
    assert encode_files(tmp_path, sample_spm, files)[1] == key
    assert "task 0: token cache found (3 tokens); not encoded again" in caplog.text
    settings, model = encode.EncodeSettings.of(config), provenance.sha256_of(sample_spm)
    assert encode.cache_key(dataclasses.replace(settings, use_eod=False), files, model) != key
    assert encode.cache_key(settings, files, "another model's sha256") != key
    id_file(tmp_path / "a.txt", [[1, 2], [4]])  # same size: the modification time tells
    os.utime(tmp_path / "a.txt", ns=(1, 1))
    assert encode.cache_key(settings, files, model) != key


MULTI_PASS = GOLDEN / "g6_num_passes"  # --num_passes=3, bi_data; expected = the original's three runs


def create_g6(save_dir, *extra):
    flags = [f for f in golden_flags(MULTI_PASS) if not f.startswith("--num_passes")]
    result = run_module("xlnet_data.create", *flags, "--num_passes=3", "--num_task=2", f"--save_dir={save_dir}",
                        *extra, cwd=MULTI_PASS)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("one_worker")
    result = create_g6(save_dir, "--num_workers=1")
    assert result.stderr.count("into its token cache") == 2  # two tasks, each encoded once for its three passes
    assert not (save_dir / "token_cache").exists()
    # the plan again once the first task is encoded, its tokens counted (resources.corrected)
    assert result.stderr.count("input bytes a token, counted on task 0, ") == 1
    return save_dir


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("workers", [2, 4])
def test_multi_pass_runs_are_identical_for_any_number_of_workers(one_worker, tmp_path, workers):
    result = create_g6(tmp_path, f"--num_workers={workers}")
    assert result.stderr.count("into its token cache") == 2 and result.stderr.count(", counted on task ") == 1
    assert_same_records(one_worker, tmp_path)
    assert not (tmp_path / "token_cache").exists()


@pytest.mark.slow
@needs_beam
@needs_shared
def test_multi_pass_run_on_beams_direct_runner_is_identical(one_worker, tmp_path):
    create_g6(tmp_path, "--runner=beam", "--beam_runner=DirectRunner")
    assert_same_records(one_worker, tmp_path)
    assert not (tmp_path / "token_cache").exists()


@pytest.mark.slow
@needs_shared
def test_keep_cache_keeps_it_and_a_later_run_uses_it(one_worker, tmp_path):
    create_g6(tmp_path, "--num_workers=1", "--keep_cache")
    kept = sorted((tmp_path / "token_cache").iterdir())
    assert len(kept) == 4 and all(json.loads(p.read_text())["key"] in p.name for p in kept if p.suffix == ".json")
    again = create_g6(tmp_path, "--num_workers=1", "--overwrite")
    assert again.stderr.count("token cache found") == 2 and "into its token cache" not in again.stderr
    assert_same_records(one_worker, tmp_path)
    assert not (tmp_path / "token_cache").exists()


@pytest.mark.slow
@needs_shared
def test_a_one_pass_run_encodes_in_memory_and_writes_what_the_cache_gives(tmp_path):
    flags = [f for f in golden_flags(MULTI_PASS) if not f.startswith("--num_passes")] + ["--num_task=2"]
    runs = {}
    for name, extra in (("memory", []), ("cache", ["--keep_cache"])):
        runs[name] = run_module("xlnet_data.create", *flags, f"--save_dir={tmp_path / name}", *extra, cwd=MULTI_PASS)
        assert runs[name].returncode == 0, runs[name].stderr
    assert runs["memory"].stderr.count("in memory, for its one unit") == 2 and "token cache" not in runs["memory"].stderr
    assert not (tmp_path / "memory" / "token_cache").exists()
    assert runs["cache"].stderr.count("into its token cache") == 2 and (tmp_path / "cache" / "token_cache").exists()
    assert_same_records(tmp_path / "memory", tmp_path / "cache")


def test_a_range_read_from_the_file_is_what_the_map_holds_and_one_across_files_is_read_through_the_map(tmp_path):
    """layout.copy_read (a B drawn anywhere in its row, read by pread rather than through the mapped cache): ids of 2
    and 4 bytes and word-start bits, rows forwards and reversed, at any offset. The map handed in is zeros, so that
    a range read from the file (one file's segment) is told from one read through the map (across two segments, or
    larger than the scratch buffer)."""
    from xlnet_data.dataformat.examples.layout import BITS, copy_read, copy_values
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 6400, dtype=np.uint8)  # the segments below lie inside it
    path = tmp_path / "cache.bin"
    path.write_bytes(data.tobytes())
    seg_starts = np.array([0, 300, 301, 1100], dtype=np.int64)  # three segments, one of a single token
    zeros = np.zeros_like(data)
    scratch, window = np.empty(64, dtype=np.uint8), np.zeros(3, dtype=np.int64)
    with open(path, "rb") as f:
        for width in (2, 4, BITS):
            seg_offsets = np.array([1201, 7, 3001] if width != BITS else [4001, 3, 4500], dtype=np.int64)
            for _ in range(300):
                row_len = int(rng.integers(1, 400))
                base = int(rng.integers(0, 1100 - row_len + 1))
                begin = int(rng.integers(0, row_len))
                end = int(rng.integers(begin, min(row_len, begin + 40) + 1))
                reverse = bool(rng.integers(0, 2))
                args = (seg_starts, seg_offsets, base, row_len, reverse, begin, end)
                want = np.full(50, -1, np.int32)
                assert copy_values(want, 3, data, width, *args) == 3 + end - begin
                got = np.full(50, -1, np.int32)
                assert copy_read(got, 3, f.fileno(), scratch, window, zeros, width, *args) == 3 + end - begin
                first, last = (base + row_len - end, base + row_len - 1 - begin) if reverse else (base + begin,
                                                                                               base + end - 1)
                one_segment = np.searchsorted(seg_starts, first, "right") == np.searchsorted(seg_starts, last, "right")
                read = one_segment and (end - begin) * (width or 1) <= 64  # what fits the scratch buffer
                assert (got == want).all() if read or begin == end else (got[3:3 + end - begin] == 0).all()
            got = np.full(50, -1, np.int32)  # no file (a stream in memory): through the map
            copy_read(got, 0, -1, scratch, window, zeros, width, seg_starts, seg_offsets, 0, 10, False, 0, 10)
            assert (got[:10] == 0).all()
