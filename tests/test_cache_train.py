"""Training from a cache-backed save_dir (create --write_records=false) takes the steps it takes from the records of
the same flags, bit for bit on CPU: straight, resumed mid-pass, on two replicas, and per input pipeline."""

import dataclasses
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import SAMPLE_CORPUS, fork_server, two_logical_cpus
from test_train import tiny_config

from xlnet_data.dataformat import records as R
from xlnet_data.dataformat.examples import generated
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.pretrain import checkpoints, resume
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import training as T


def _create(sample_spm, text_glob, save_dir, write_records):
    config = CreateConfig(input_glob=str(text_glob), sp_path=sample_spm, save_dir=str(save_dir), bsz_per_host=8,
                          num_core_per_host=1, seq_len=64, reuse_len=32, bi_data=True, num_predict=10, uncased=True,
                          num_passes=2, write_records=write_records)
    create_records(config.validate(), num_workers=1)
    return str(save_dir)


@pytest.fixture(scope="module")
def both(sample_spm, tmp_path_factory):
    """(records save_dir, cache-backed save_dir) of the same flags: two passes of ~18 steps each."""
    text_dir = tmp_path_factory.mktemp("text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:60]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path_factory.mktemp("both")
    return (_create(sample_spm, text_dir / "*.txt", out / "records", True),
            _create(sample_spm, text_dir / "*.txt", out / "cache", False))


def config(save_dir, model_dir, dropout=0.1, **changes):
    """test_train's tiny config on one layer, with dropout (its generator's state is part of what must resume). One
    layer: these tests check that the cache gives the records' rows (a wrong row changes the loss at any depth)."""
    cfg = tiny_config(save_dir, model_dir, **{"n_layer": 1, **changes})
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dropout=dropout))


def _steps(save_dir):
    return ip.find_records(os.path.join(save_dir, "tfrecords"), tiny_config(save_dir, "unused").data).num_batch


@pytest.fixture(scope="module")
def whole(both, tmp_path_factory):
    """The losses of a run on the records, past both passes (into the stream's second cycle)."""
    records, _ = both
    steps = _steps(records) + 2
    return T.train(config(records, tmp_path_factory.mktemp("whole"), train_steps=steps)).losses


def test_training_from_the_cache_gives_the_records_losses_bit_for_bit(both, whole, tmp_path):
    records, cache = both
    assert _steps(cache) == _steps(records) and len(whole) == _steps(records) + 2
    got = T.train(config(cache, tmp_path / "cache", train_steps=len(whole)))
    np.testing.assert_array_equal(got.losses, whole)


@pytest.mark.slow
def test_a_run_resumed_mid_pass_starts_the_generator_where_the_checkpoint_was(both, whole, tmp_path, monkeypatch,
                                                                              caplog):
    _, cache = both
    monkeypatch.setattr(generated, "CHUNK_BYTES", 2 * 8 * R.max_record_bytes(64))  # chunks of 2 steps
    n = 7
    cfg = config(cache, tmp_path / "pieces", train_steps=len(whole), save_steps=n)
    first = T.train(cfg, stop_after=n + 3)
    saved = checkpoints.read_prefixed(tf.train.latest_checkpoint(cfg.model_dir), resume.STATE)
    assert _steps(cache) > 4 * n  # two passes, each longer than n + 3: the checkpoint is mid-pass
    assert int(saved[f"{resume.STATE}source_0/generator/step"]) == n - 1  # the chunk of steps 6-7 holds step 7
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        second = T.train(cfg)
    assert "making its first" not in caplog.text  # not made again from the start of the pass
    np.testing.assert_array_equal(first.losses, whole[:n + 3])
    np.testing.assert_array_equal(second.losses, whole[n:])


def test_without_a_saved_position_a_resume_makes_the_pass_again_and_says_so(both, whole, tmp_path, caplog):
    _, cache = both
    n = 5
    cfg = config(cache, tmp_path / "pieces", train_steps=2 * n, save_steps=n)
    T.train(cfg, stop_after=n)
    path = tf.train.latest_checkpoint(cfg.model_dir)
    tensors = checkpoints.read_prefixed(path, "")
    kept = {name: value for name, value in tensors.items() if "/generator/" not in name}
    checkpoints.save(path, {name: tf.constant(value) for name, value in kept.items()}, 5)
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        second = T.train(cfg)
    assert f"making its first {n} steps again to resume" in caplog.text
    np.testing.assert_array_equal(second.losses, whole[n:2 * n])


@pytest.mark.parametrize("replicas, pipelines", [(2, 2), (4, 2)])
def test_each_input_pipeline_makes_only_its_rows_and_gets_the_records_batches(both, tmp_path, replicas, pipelines):
    records, cache = both
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=replicas)
        want = T.replica_batches(os.path.join(records, "tfrecords"), tiny_config(records, tmp_path), replicas,
                                 start_step=3, input_context=context)
        feed = T.CacheFeed()
        got = T.replica_batches(os.path.join(cache, "tfrecords"), tiny_config(cache, tmp_path), replicas,
                                start_step=3, input_context=context, feed=feed)
        assert feed.keep.sum() == 8 // pipelines
        for a, b in zip(got.take(6), want.take(6)):
            for key in b:
                np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)


def check_two_replicas(records, cache, records_model_dir, cache_model_dir):
    """Run in a fresh TensorFlow: 6 steps on two replicas from the records, and from the cache, equal bit for bit.
    One layer: what is checked is which rows each replica reads, not the model."""
    two_logical_cpus()
    losses = []
    for save_dir, model_dir in ((records, records_model_dir), (cache, cache_model_dir)):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        cfg = config(save_dir, model_dir, train_steps=6, strategy="mirrored")  # one layer, as config() makes
        losses.append(T.train(cfg, strategy=strategy).losses)
    assert len(losses[0]) == 6
    np.testing.assert_array_equal(losses[1], losses[0])


@pytest.mark.slow
def test_two_replicas_from_the_cache_give_the_records_losses(both, tmp_path):
    # Forked from the test process's one TensorFlow import; its teardown skipped (freeing a cache iterator can wait
    # a minute, CPU idle).
    result = fork_server().run("test_cache_train", *both, tmp_path / "r", tmp_path / "c",
                                  function="check_two_replicas")
    assert result.returncode == 0, result.stderr[-5000:]


def test_cache_unit_positions_index_the_stream(both):
    """The stream's steps are counted as the records': unit after unit, cycling."""
    _, cache = both
    found = ip.find_records(os.path.join(cache, "tfrecords"), tiny_config(cache, "unused").data)
    stream = generated.GeneratedStream(found.cache_units)
    first = found.cache_units[0].num_batch
    assert stream._locate(0) == (0, 0) and stream._locate(first) == (1, first)
    assert stream._locate(found.num_batch + first + 1) == (1, found.num_batch + first)
    assert dataclasses.is_dataclass(generated.Position)


@pytest.mark.slow
def test_train_gpu_logs_the_records_losses_from_the_cache_and_a_missing_cache_is_one_line(both, whole, command_runs,
                                                                                        tmp_path):
    """What a user checks from the command line: every step's loss line, from the cache, is the records' (the
    run on the records in `whole`, with the flags that make the same config)."""
    import re
    import shutil

    from conftest import run_module
    from test_train import TINY_SHAPE
    _, cache = both
    result = command_runs["logged"][1]["train"]
    assert result.returncode == 0, result.stderr[-3000:]
    logged = re.findall(r"step (\d+) \| loss ([\d.]+)", result.stderr)
    assert logged == [(str(step), f"{loss:.4f}") for step, loss in enumerate(whole, 1)]

    broken = tmp_path / "broken"
    shutil.copytree(cache, broken)
    for path in (broken / "token_cache").glob("*.bin"):
        path.unlink()
    result = run_module("xlnet_data.train_gpu", f"--record_info_dir={broken}", f"--model_dir={tmp_path / 'x'}",
                        "--train_steps=1", *TINY_SHAPE)
    assert result.returncode == 2 and result.stderr.startswith("train: error: "), result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "is missing; re-run create" in result.stderr  # before TF


def damage(save_dir, tmp_path, name):
    """A copy of the cache-backed save_dir with 800 ids of its token cache overwritten in place: the same size."""
    import shutil
    copy = tmp_path / name
    shutil.copytree(save_dir, copy)
    (path,) = (copy / "token_cache").glob("*.bin")
    data = bytearray(path.read_bytes())
    data[200:1800] = np.random.default_rng(0).integers(9, 200, 1600, dtype=np.uint8).tobytes()  # 800 uint16 ids
    path.write_bytes(bytes(data))
    return copy, path


@pytest.fixture(scope="module")
def command_runs(both, whole, tmp_path_factory):
    """The slow tests' command-line runs: a run on the cache-backed save_dir (the flags that make `whole`'s config)
    and runs on damaged copies of it, one after the other, forked from the test process's one TensorFlow import
    (conftest.ForkServer): {name: (the damaged file or None, {program: finished process})}."""
    import shutil

    from test_cache_input import rewrite_as_format_1
    from test_train import TINY_SHAPE
    base = tmp_path_factory.mktemp("command_runs")
    damaged, damaged_file = damage(both[1], base, "damaged")
    # A format-1 cache (no checksums) that holds 400 int32 ids past the vocabulary, in place.
    old = base / "old"
    shutil.copytree(both[1], old)
    rewrite_as_format_1(old)
    (old_file,) = (old / "token_cache").glob("*.bin")
    data = bytearray(old_file.read_bytes())
    data[400:2000] = np.full(400, 60000, dtype="<i4").tobytes()
    old_file.write_bytes(bytes(data))
    name, edit, _ = CRAFTED_CACHES[0]
    negative, negative_index = craft_cache(both[1], base, name, edit)

    def train(save_dir, steps=3):
        return "xlnet_data.train_gpu", [f"--record_info_dir={save_dir}", f"--model_dir={save_dir}_model",
                                        f"--train_steps={steps}", *TINY_SHAPE]

    same_config = [*TINY_SHAPE, "--n_layer=1", "--mem_len=32", "--learning_rate=1e-3", "--warmup_steps=10",
                   "--dropout=0.1", "--strategy=one_device", f"--train_steps={len(whole)}", "--iterations=1"]
    runs = {("logged", "train"): ("xlnet_data.train_gpu", [f"--record_info_dir={both[1]}",
                                                          f"--model_dir={base / 'logged'}", *same_config]),
            ("damaged", "train"): train(damaged), ("damaged", "dump"): ("xlnet_data.dump", [damaged, "--pass_id=0"]),
            ("old", "train"): train(old), ("negative", "dump"): ("xlnet_data.dump", [negative, "--stats"]),
            ("negative", "train"): train(negative, 2)}
    results = {key: fork_server().run(module, *args) for key, (module, args) in runs.items()}
    files = {"logged": None, "damaged": damaged_file, "old": old_file, "negative": negative_index}
    return {name: (path, {program: result for (case, program), result in results.items() if case == name})
            for name, path in files.items()}


@pytest.mark.slow
def test_a_cache_damaged_at_the_same_size_is_refused_by_train_gpu_and_dump(command_runs):
    """As a damaged records file is by its CRCs: one line naming the file and the chunk, exit 2."""
    cache_file, results = command_runs["damaged"]
    want = rf"{cache_file}: chunk 0 of the ids of .*emma.txt \(tokens 0\.\.\d+\) fails its CRC-32C check"
    result = results["train"]
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("train: error: ") and re.search(want, last), result.stderr[-3000:]
    result = results["dump"]
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert result.stderr.startswith("dump: error: ") and re.search(want, result.stderr), result.stderr


@pytest.mark.parametrize("index_text, cause", [("", "JSONDecodeError"), ("[1, 2]", "AttributeError")])
def test_a_damaged_cache_index_is_one_line_for_train_gpu_and_dump(both, tmp_path, index_text, cause):
    import shutil

    from conftest import run_module
    from test_train import TINY_SHAPE
    broken = tmp_path / "broken"
    shutil.copytree(both[1], broken)
    (index,) = (broken / "token_cache").glob("*.json")
    index.write_text(index_text)
    want = (f"{index}: the token cache's index is damaged ({cause}: .*); delete the token_cache folder and run the "
            "same create again")
    for result, program in ((run_module("xlnet_data.dump", broken, "--stats"), "dump"),
                            (run_module("xlnet_data.train_gpu", f"--record_info_dir={broken}",
                                        f"--model_dir={tmp_path / 'm'}", "--train_steps=3", *TINY_SHAPE), "train")):
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert re.fullmatch(f"{program}: error: " + re.escape(want).replace(re.escape(".*"), ".*"), last), last
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_an_id_outside_the_vocabulary_in_a_cache_without_checksums_is_one_line(command_runs):
    """A format-1 cache (no checksums) that holds an id past the vocabulary: train_gpu's failed read locates it."""
    cache_file, results = command_runs["old"]
    result = results["train"]
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.match(rf"train: error: {cache_file}: token 100 of .*emma.txt is id 60000, outside the vocabulary "
                    r"\[0, \d+\) of its SentencePiece model: the token cache is damaged", last), last


def _vocab_ids(index, data, value):
    """Sets ids 100..499 of the first shard to `value` (format 1's int32, or the cache's own type)."""
    shard = index["shards"][0]
    dtype = index.get("ids", "<i4")
    start = shard["ids_offset"] + 100 * np.dtype(dtype).itemsize
    data[start:start + 400 * np.dtype(dtype).itemsize] = np.full(400, value, dtype=dtype).tobytes()


def _as_format_1(edit):
    from fuzz_files import as_format_1

    def edited(index, data):
        new, new_data = as_format_1(index, data)
        index.clear()
        index.update(new)
        data[:] = new_data
        edit(index, data)
    return edited


def _shard(**changes):
    def edit(index, data):
        index["shards"][0].update(changes)
    return edit


def _second_shard_same_bytes(index, data):
    index["shards"].append({**index["shards"][0], "path": index["shards"][0]["path"] + ".copy"})


def _overlapping(index, data):
    shard = index["shards"][0]
    shard["flags_offset"] = shard["ids_offset"] + 2


# (name, edit of the index and data of the cache-backed save_dir, what the one line says): the cases of issue 46,
# each with its checksums made valid again and the record_infos' cache size updated, as a crafted save_dir has them.
CRAFTED_CACHES = [
    ("negative ids, format 1", _as_format_1(lambda index, data: _vocab_ids(index, data, -5)),
     r"token 100 of .*emma.txt is id -5, outside the vocabulary \[0, \d+\)"),
    ("int32 ids of 2e9, format 1", _as_format_1(lambda index, data: _vocab_ids(index, data, 2 * 10 ** 9)),
     r"token 100 of .*emma.txt is id 2000000000, outside the vocabulary"),
    ("uint16 ids past the vocabulary", lambda index, data: _vocab_ids(index, data, 60000),
     r"token 100 of .*emma.txt is id 60000, outside the vocabulary"),
    ("chunk_tokens -1", lambda index, data: index.update(chunk_tokens=-1),
     r"chunk_tokens -1 is not a chunk size"),
    ("chunk_tokens 0", lambda index, data: index.update(chunk_tokens=0), r"chunk_tokens 0 is not a chunk size"),
    ("tokens negative", _shard(tokens=-3), r"shard 0: tokens -3 is not a count of at least 1"),
    ("tokens 10^12", _shard(tokens=10 ** 12), r"shard 0: its ids \(offset 0, 1000000000000 tokens\) do not lie "
                                              r"inside the data file"),
    ("word starts named but absent", lambda index, data: index.update(word_starts=True),
     r"shard 0: its starts \(offset None, \d+ tokens\) do not lie inside"),
    ("negative offset", _shard(flags_offset=-8), r"shard 0: its flags \(offset -8, \d+ tokens\) do not lie inside"),
    ("overlapping regions", _overlapping, r"the ids of .*emma.txt and the flags of .*emma.txt overlap"),
    ("two shards the same bytes", _second_shard_same_bytes, r"the ids of .*emma.txt and the ids of .*copy overlap"),
    ("an id type create never writes", lambda index, data: index.update(ids="<i8"),
     r"ids '<i8' is not an id type create writes in format 2"),
    ("format 0", lambda index, data: index.update(format=0), r"format 0 is not a token cache format"),
]


def dump_refusal(save_dir):
    """The UserError's line of reading every record of `save_dir` as dump does (its selection)."""
    from xlnet_data.common.errors import UserError
    from xlnet_data.dataformat.selection import SelectionConfig, select
    with pytest.raises(UserError) as refused:
        for _ in select(SelectionConfig((str(save_dir),))).decoded():
            pass
    return str(refused.value)


def command_refusals(save_dir, tmp_path):
    """(program, finished process) of the dump and train_gpu commands on `save_dir`, as a user runs them."""
    from conftest import run_module
    from test_train import TINY_SHAPE
    return (("dump", run_module("xlnet_data.dump", save_dir, "--stats")),
            ("train", run_module("xlnet_data.train_gpu", f"--record_info_dir={save_dir}",
                                 f"--model_dir={tmp_path / 'm'}", "--train_steps=2", *TINY_SHAPE)))


def craft_cache(save_dir, tmp_path, name, edit):
    """A copy of the cache-backed save_dir whose token cache `edit(index dict, data bytearray)` changed, its
    checksums and the record_infos' cache reference made to match (tests/fuzz_files.py)."""
    import json
    import shutil

    from fuzz_files import recompute_crcs, write_cache_mutant
    copy = tmp_path / name.replace(" ", "_").replace(",", "")
    shutil.copytree(save_dir, copy)
    (index_path,) = (copy / "token_cache").glob("*.json")
    index, data = json.loads(index_path.read_text()), bytearray(index_path.with_suffix(".bin").read_bytes())
    edit(index, data)
    recompute_crcs(index, data)
    infos = {str(path): json.loads(path.read_text()) for path in (copy / "tfrecords").glob("record_info-*.json")}
    write_cache_mutant(str(copy), index, bytes(data), infos)
    return copy, index_path


@pytest.mark.parametrize("name, edit, said", CRAFTED_CACHES, ids=[case[0] for case in CRAFTED_CACHES])
def test_a_crafted_token_cache_is_one_line_in_dump_and_train_gpu_before_any_compiled_read(both, tmp_path, name, edit,
                                                                                        said):
    """Issue 46: before, negative ids crashed both (SIGSEGV in is_start[ids[k]]), chunk_tokens -1 printed
    uninitialised memory, the others were tracebacks or read as if fine. Now each is refused by the library calls
    of dump (the records of the selection) and of train_gpu (the run's checks, then its input pipeline), with the
    line that names the file."""
    from xlnet_data.common.errors import UserError
    crafted, index_path = craft_cache(both[1], tmp_path, name, edit)
    where = re.escape(str(crafted / "token_cache"))
    want = rf"{where}/tokens-.*\.(json: the token cache's index is damaged \(|bin: ){said}"
    dumped = dump_refusal(crafted)
    assert re.match(want, dumped), dumped
    with pytest.raises(UserError) as trained:
        T.train(config(str(crafted), str(tmp_path / "m"), train_steps=2, iterations=1))
    assert re.search(want, str(trained.value)), str(trained.value)


@pytest.mark.slow
def test_negative_ids_in_a_cache_are_one_line_and_exit_2_from_the_dump_and_train_gpu_commands(command_runs):
    """The issue's SIGSEGV (exit -11), through the commands as a user runs them."""
    _, _, said = CRAFTED_CACHES[0]
    for program, result in command_runs["negative"][1].items():
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert re.match(rf"{program}: error: .*tokens-.*\.bin: {said}", last), last
        assert program == "train" or not result.stdout, result.stdout[:3000]


# (create_settings changed in every record_info (num_core_per_host in corpus_info.json too), what the line says):
# issue 46's last hole; before, reuse_len 40, -3 and seq_len 8 were IndexErrors under bounds checking in the
# compiled loop (reads outside its arrays without), the others too went into the loop unchecked.
CRAFTED_SETTINGS = [
    ({"reuse_len": 64}, r"--reuse_len=64 must be less than --seq_len - 3 = 61"),
    ({"reuse_len": 61}, r"--reuse_len=61 must be less than --seq_len - 3 = 61"),
    ({"reuse_len": -3}, r"--reuse_len=-3 must be in \[1, 65536\]"),
    ({"seq_len": 8}, r"--reuse_len=32 must be less than --seq_len - 3 = 5"),
    ({"num_predict": 500}, r"--num_predict=500 does not fit"),
    ({"bsz_per_host": 5}, r"--bsz_per_host=5 must be divisible by 2 \* num_core_per_host \(bi_data\) = 2"),
    ({"bsz_per_host": 7, "bi_data": False, "num_core_per_host": 2},
     r"--bsz_per_host=7 must be divisible by num_core_per_host = 2"),
    ({"mask_alpha": 1, "mask_beta": 6}, r"--mask_alpha=1 must be >= --mask_beta=6"),
    ({"mask_beta": 0}, r"--mask_beta=0 must be in \[1, 1048576\]"),
    ({"seq_len": 2 ** 40}, r"--seq_len=1099511627776 must be in \[1, 65536\]"),
    ({"seq_len": "64"}, r"seq_len='64' must be an integer"),
    ({"bi_data": None}, r"bi_data=None must be True or False"),
    ({"span_unit": "char"}, r"--span_unit=char must be one of piece, word"),
    ({"num_core_per_host": 5000}, r"--num_core_per_host=5000 must be in \[1, 4096\]"),
]


def craft_settings(save_dir, tmp_path, changes):
    """A copy of the cache-backed save_dir whose record_infos' create_settings say `changes`, as a stranger's
    save_dir might: no checksum covers them. corpus_info.json and the file names are left as they are (they are
    checked against each other), but for num_core_per_host, which the record_infos are checked against."""
    import json
    import shutil
    copy = tmp_path / "crafted"
    shutil.copytree(save_dir, copy)
    for path in [*(copy / "tfrecords").glob("record_info-*.json"), *copy.rglob("corpus_info.json")]:
        info = json.loads(path.read_text())
        target = info["create_settings"] if "create_settings" in info else info
        target.update({key: value for key, value in changes.items()
                       if "create_settings" in info or key == "num_core_per_host"})
        path.write_text(json.dumps(info))
    return copy


@pytest.mark.parametrize("changes, said", CRAFTED_SETTINGS, ids=[str(case[0]) for case in CRAFTED_SETTINGS])
def test_crafted_create_settings_are_refused_by_create_s_rules_before_the_loop(both, tmp_path, changes, said):
    """Each through the library calls of dump (the records of the selection) and of train_gpu's setup (its checks
    of the record dirs, train_gpu.py's settings.find_record_dirs): one line naming the record_info and the flag,
    by the rules CreateConfig.validate applies (ExampleSettings.validate)."""
    from xlnet_data.common.errors import UserError
    from xlnet_data.dataformat.settings import find_record_dirs
    crafted = craft_settings(both[1], tmp_path, changes)
    want = rf"{re.escape(str(crafted / 'tfrecords'))}/record_info-.*\.json: its create_settings are not .*{said}"
    dumped = dump_refusal(crafted)
    assert re.search(want, dumped), dumped
    with pytest.raises(UserError) as trained:
        find_record_dirs(str(crafted))
    assert re.search(want, str(trained.value)), str(trained.value)


def test_crafted_create_settings_are_one_line_and_exit_2_from_the_dump_and_train_gpu_commands(both, tmp_path):
    """train_gpu takes the data flags from the crafted corpus_info.json (none given) and stops at its checks."""
    changes, said = CRAFTED_SETTINGS[0]
    crafted = craft_settings(both[1], tmp_path, changes)
    for program, result in command_refusals(crafted, tmp_path):
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert re.match(rf"{program}: error: .*record_info-.*\.json.*{said}", last), last
        assert not result.stdout, result.stdout[:3000]
