"""A cache-backed save_dir (create --write_records=false): train_gpu's input pipeline makes the records from the
token cache, and its batches equal, bit for bit, those it reads from the records create writes."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN, golden_flags, needs_shared

from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples import generated
from xlnet_data.dataformat.token_cache import TokenCacheError
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import inputs as ip

CASES = sorted(p.name for p in GOLDEN.glob("g*")) if GOLDEN.is_dir() else []


def golden_config(case, save_dir, **changes):
    """The CreateConfig of a golden case's flags.txt (paths resolved against its folder)."""
    case_dir = GOLDEN / case
    fields = {field.name: field.type for field in dataclasses.fields(CreateConfig)}
    values = {}
    for flag in golden_flags(case_dir):
        name, value = flag[2:].split("=", 1)
        kind = type(getattr(CreateConfig(), name))
        if kind is bool:
            value = value == "True"
        elif name in ("input_glob", "sp_path"):
            value = str((case_dir / value).resolve()) if name == "sp_path" else str(case_dir / value)
        elif kind is int or "int" in str(fields[name]):
            value = int(value)
        values[name] = value
    return CreateConfig(**{**values, "save_dir": str(save_dir), **changes}).validate()


def input_config(config: CreateConfig, **changes):
    return C.InputConfig(seq_len=config.seq_len, reuse_len=config.reuse_len, perm_size=config.reuse_len // 2,
                         bsz_per_host=config.bsz_per_host, num_predict=config.num_predict,
                         num_core_per_host=config.num_core, bi_data=config.bi_data, mask_alpha=config.mask_alpha,
                         mask_beta=config.mask_beta, uncased=config.uncased, split=config.split, **changes)


@pytest.fixture(scope="module")
def cache_dirs(tmp_path_factory):
    """{golden case: (its cache-backed save_dir, its CreateConfig)}, made once."""
    out = {}
    for case in CASES:
        save_dir = tmp_path_factory.mktemp(f"cache_{case}")
        config = golden_config(case, save_dir, write_records=False)
        create_records(config, num_workers=1)
        out[case] = (str(save_dir), config)  # train_gpu reads save_dir/tfrecords (save_dir.tfrecords_dir)
    return out


def expected_dir(case):
    return str(GOLDEN / case / "expected" / "tfrecords")


def assert_same_batches(got, want):
    count = 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in b:
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=f"batch {count} {key}")
        count += 1
    return count


@needs_shared
@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_the_cache_gives_the_golden_records_batches_over_whole_passes(cache_dirs, case):
    save_dir, config = cache_dirs[case]
    assert not list(Path(save_dir, "tfrecords").glob("*.tfrecords*"))  # no records written
    assert [p.name for p in Path(save_dir, "token_cache").iterdir()]  # the cache kept
    for info_path in Path(save_dir, "tfrecords").glob("record_info-*.json"):
        info = json.loads(info_path.read_text())
        want = json.loads((Path(expected_dir(case)) / info_path.name).read_text())
        assert info["num_batch"] == want["num_batch"] and info["filenames"] == [] and "token_cache" in info
    data = input_config(config)
    got = ip.make_dataset(os.path.join(save_dir, "tfrecords"), data, seed=7, repeat=False)
    want = ip.make_dataset(expected_dir(case), data, seed=7, repeat=False)
    batches = assert_same_batches(got, want)
    total = sum(json.loads(p.read_text())["num_batch"] for p in Path(expected_dir(case)).glob("record_info-*.json"))
    assert batches == total * config.num_core  # every pass whole (a batch is a core's)


@needs_shared
def test_a_cache_units_records_are_createss_bytes(cache_dirs, tmp_path):
    """The serialized records themselves: those create writes with the same flags (g3: two TPU cores, bi)."""
    from xlnet_data.dataformat import record_reader
    save_dir, config = cache_dirs["g3_tpu_cores"]
    create_records(dataclasses.replace(config, save_dir=str(tmp_path), write_records=True), num_workers=1)
    for info_path in sorted(Path(save_dir, "tfrecords").glob("record_info-*.json")):
        info = json.loads(info_path.read_text())
        unit = generated.cache_unit(str(info_path), info, info["num_batch"])
        record_file = tmp_path / "tfrecords" / info_path.name[len("record_info-"):].replace(".json", ".tfrecords")
        want = [payload for _, _, payload in record_reader.read_records(str(record_file))]
        assert list(generated.unit_payloads(unit)) == want


@needs_shared
@pytest.mark.slow
def test_the_stream_starts_anywhere_and_cycles_like_the_records(cache_dirs):
    """start (a resume's first record, mid-pass, past the end) and repeat, as the records' skip and repeat."""
    save_dir, config = cache_dirs["g6_num_passes"]
    data = input_config(config, num_passes=2)
    record_dir = os.path.join(save_dir, "tfrecords")
    total = ip.find_records(record_dir, data).num_batch * config.bsz_per_host
    for start in (0, 1000 * 4 + 4, total - 8, total + 40):
        got = ip.make_dataset(record_dir, data, seed=1, start=start).take(6)
        want = ip.make_dataset(expected_dir("g6_num_passes"), data, seed=1, start=start).take(6)
        assert assert_same_batches(got, want) == 6


@needs_shared
def test_a_missing_or_stale_cache_is_one_line(cache_dirs, tmp_path):
    source, config = cache_dirs["g1_blog"]
    save_dir = tmp_path / "copy"
    shutil.copytree(source, save_dir)
    data = input_config(config)
    info_path = next(Path(save_dir, "tfrecords").glob("record_info-*.json"))
    info = json.loads(info_path.read_text())
    unit = generated.cache_unit(str(info_path), info, info["num_batch"])
    cache = next(Path(save_dir, "token_cache").glob("*.bin"))

    with open(cache, "ab") as f:  # another cache under the same name (a re-encode, a copy gone wrong)
        f.write(b"\0" * 8)
    with pytest.raises(TokenCacheError, match=r"stale token cache: it holds \d+ tokens in \d+ bytes, but .* was "
                                              r"counted from \d+ tokens in \d+ bytes; re-run create"):
        generated.check_cache(unit)
    os.remove(cache)
    with pytest.raises(TokenCacheError, match=r"its token cache .*\.bin is missing; re-run create with the same "
                                              r"flags, --nowrite_records and --overwrite"):
        list(ip.make_dataset(str(save_dir / "tfrecords"), data, repeat=False).take(1))
    for message in (str(err) for err in [TokenCacheError("x")]):
        assert "\n" not in message


@needs_shared
def test_dump_shows_a_cache_units_examples_as_the_records_ones(cache_dirs, tmp_path):
    from conftest import run_module
    save_dir, config = cache_dirs["g6_num_passes"]
    records_dir = tmp_path / "records"
    create_records(dataclasses.replace(config, save_dir=str(records_dir), write_records=True), num_workers=1)
    shown = []
    for where in (save_dir, records_dir):
        result = run_module("xlnet_data.dump", where, "--pass_id=2", "--task=0", "--format=json", "--skip=600",
                            "--limit=30")
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        shown.append([{key: value for key, value in line.items() if key != "file"} for line in lines])
    assert len(shown[0]) == 30 and shown[0] == shown[1]

    broken = tmp_path / "broken"
    shutil.copytree(save_dir, broken)
    for cache in Path(broken, "token_cache").glob("*.bin"):
        os.remove(cache)
    result = run_module("xlnet_data.dump", broken, "--pass_id=1")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("dump: error: ") and "token cache" in result.stderr and "is missing" in result.stderr


@needs_shared
def test_beam_writes_the_local_runners_cache_backed_units(cache_dirs, tmp_path):
    """--runner=beam honours --write_records=false (its units run units.run_unit too): the same record_infos,
    the cache kept, no records."""
    from test_beam import IN_PROCESS_RUNNER, needs_beam
    if needs_beam.args[0]:
        pytest.skip(needs_beam.kwargs["reason"])
    local_dir, config = cache_dirs["g6_num_passes"]
    create_records(dataclasses.replace(config, save_dir=str(tmp_path)), beam_args=[f"--runner={IN_PROCESS_RUNNER}"])
    names = sorted(p.name for p in Path(local_dir, "tfrecords").iterdir())
    assert sorted(p.name for p in (tmp_path / "tfrecords").iterdir()) == names
    for name in names:
        assert json.loads((tmp_path / "tfrecords" / name).read_text()) == json.loads(
            Path(local_dir, "tfrecords", name).read_text())
    assert sorted(p.name for p in (tmp_path / "token_cache").iterdir()) == sorted(
        p.name for p in Path(local_dir, "token_cache").iterdir())


@needs_shared
def test_a_records_run_keeps_the_cache_that_other_cache_backed_units_need(cache_dirs, tmp_path):
    source, config = cache_dirs["g6_num_passes"]
    shutil.copytree(source, tmp_path / "s")
    create_records(dataclasses.replace(config, save_dir=str(tmp_path / "s"), write_records=True, num_passes=None,
                                       pass_id=0), num_workers=1)
    assert [p.name.split(".")[0] for p in (tmp_path / "s" / "tfrecords").glob("*.tfrecords")] == ["train-0-0"]
    assert len(generated.find_cache_units(str(tmp_path / "s"))) == 2  # passes 1 and 2
    for unit in generated.find_cache_units(str(tmp_path / "s")):
        generated.check_cache(unit)  # still there
    with pytest.raises(ValueError, match="holds both records and cache-backed units"):
        ip.find_records(str(tmp_path / "s" / "tfrecords"), input_config(config))


@needs_shared
def test_corpus_info_is_checked_against_the_cache(cache_dirs, tmp_path, sample_spm):
    source, _ = cache_dirs["g1_blog"]
    save_dir = tmp_path / "copy"
    shutil.copytree(source, save_dir)
    info_path = save_dir / "corpus_info.json"
    info = CorpusInfo.read(str(info_path))
    (unit,) = generated.find_cache_units(str(save_dir))
    generated.check_corpus_info(str(info_path), info, unit)  # as create wrote it: fine
    with pytest.raises(TokenCacheError, match=r"vocab_size=1000 contradicts the token cache's SentencePiece model "
                                              r".* \(32000 pieces\)"):
        generated.check_corpus_info(str(info_path), dataclasses.replace(info, vocab_size=1000), unit)
    with pytest.raises(TokenCacheError, match=r"sp_path=.* is not the SentencePiece model .* was made with"):
        generated.check_corpus_info(str(info_path), dataclasses.replace(info, sp_path=sample_spm), unit)


def test_the_compiled_loop_releases_the_gil():
    """The input pipeline runs it in a tf.data thread beside the training step: compiled with numba's nogil."""
    from xlnet_data.dataformat.examples import loop
    assert loop._write_steps.targetoptions.get("nogil") is True


def rewrite_as_format_1(save_dir):
    """The save_dir's token cache rewritten as create wrote it before format 2 (each file's ids int32, then its
    flags packed; no checksums), the record_infos' cache size updated as that create counted them."""
    from xlnet_data.dataformat import token_cache
    (index_path,) = Path(save_dir, "token_cache").glob("*.json")
    written = json.loads(index_path.read_text())
    index = token_cache.read_index(save_dir, written["task"], written["key"])
    shards, parts, offset = [], [], 0
    for i, shard in enumerate(index.shards):
        ids, flags, _ = token_cache.read_stream(save_dir, index, [i], 1 << 16)  # one file: its flags as stored
        ids, flags = ids[:shard["tokens"]], flags[:shard["tokens"]]
        parts += [ids.astype("<i4").tobytes(), np.packbits(flags).tobytes()]
        kept = {key: value for key, value in shard.items() if not key.startswith(("ids_", "flags_", "starts_"))}
        shards.append({**kept, "ids_offset": offset, "flags_offset": offset + 4 * ids.size})
        offset += 4 * ids.size + (ids.size + 7) // 8
    index_path.with_suffix(".bin").write_bytes(b"".join(parts))
    index_path.write_text(json.dumps({"format": 1, "task": index.task, "key": index.key, "files": written["files"],
                                      "skipped_files": index.skipped_files, "shards": shards}))
    for info_path in Path(save_dir, "tfrecords").glob("record_info-*.json"):
        info = json.loads(info_path.read_text())
        info["token_cache"]["bytes"] = offset
        info_path.write_text(json.dumps(info))
    return offset


@needs_shared
def test_a_format_1_cache_is_read_and_a_newer_one_refused_in_one_line(cache_dirs, tmp_path):
    source, _ = cache_dirs["g6_num_passes"]
    want = [list(generated.unit_payloads(unit)) for unit in generated.find_cache_units(source)]
    old = tmp_path / "old"
    shutil.copytree(source, old)
    tokens = generated.find_cache_units(source)[0].reference["tokens"]  # one task, three passes
    assert rewrite_as_format_1(old) >= 4.125 * tokens  # ids int32, flags a bit each
    assert [list(generated.unit_payloads(unit)) for unit in generated.find_cache_units(str(old))] == want

    (index_path,) = Path(old, "token_cache").glob("*.json")
    index_path.write_text(json.dumps({**json.loads(index_path.read_text()), "format": 3}))
    with pytest.raises(TokenCacheError, match=r"token cache format 3 is newer than this xlnet-data reads \(2\); "
                                              "upgrade xlnet-data"):
        generated.check_cache(generated.find_cache_units(str(old))[0])


@needs_shared
def test_the_cache_takes_at_most_2_2_bytes_a_token_ids_flags_and_index(cache_dirs):
    for case in ("g1_blog", "g5_seq512"):  # text and XLNet's model (32,000 pieces), 27k and 30k tokens
        save_dir, _ = cache_dirs[case]
        for index_path in Path(save_dir, "token_cache").glob("*.json"):
            tokens = sum(shard["tokens"] for shard in json.loads(index_path.read_text())["shards"])
            size = index_path.stat().st_size + index_path.with_suffix(".bin").stat().st_size
            assert size / tokens <= 2.2, (case, size / tokens)


@needs_shared
def test_the_mapped_cache_file_is_closed_where_its_unit_ends(cache_dirs, tmp_path, monkeypatch):
    """A unit's token cache file, open beside its map (layout.copy_read's reads), is closed where its owner ends, not
    when the stream is garbage-collected: a cache-backed unit read whole (dump), a stream its consumer stops early
    (the input pipeline), and create's passes from the cache. The streams are held here, so only a close closes."""
    from xlnet_data.dataformat import token_cache
    opened, mapped_stream = [], token_cache.mapped_stream

    def recorded(*args, **kwargs):
        opened.append(mapped_stream(*args, **kwargs))
        return opened[-1]
    monkeypatch.setattr(token_cache, "mapped_stream", recorded)
    save_dir, config = cache_dirs["g6_num_passes"]
    units = generated.find_cache_units(save_dir)
    assert list(generated.unit_payloads(units[0]))
    assert len(opened) == 1 and opened[0].file.closed
    chunks = generated.GeneratedStream(units).chunks()
    next(chunks)
    assert len(opened) == 2 and not opened[1].file.closed  # open while its records are made
    chunks.close()
    assert opened[1].file.closed
    create_records(dataclasses.replace(config, save_dir=str(tmp_path), write_records=True), num_workers=1)
    assert len(opened) == 2 + config.num_passes and all(stream.file.closed for stream in opened[2:])
