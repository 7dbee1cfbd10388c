"""create, faults round three (issue 27): a save_dir that knows what it was made from, flags checked before any
work, counts per input. Each test checks the exit status or the error, the one line (with the path), the files
left and, where the run can be repeated, that its records equal an uninterrupted run's.

Most runs are in-process (create_records, one worker); a few go through the command for the exit status."""

import json
import shutil

import pytest
from conftest import SAMPLE_CORPUS, run_module
from test_create_faults import assert_same_records, error_lines, listing

from xlnet_data.datagen import job
from xlnet_data.datagen.config import ConfigError, CreateConfig
from xlnet_data.datagen.plan import CreateError

SMALL = dict(seq_len=64, reuse_len=32, bsz_per_host=4, num_predict=10, use_tpu=False)
ARGS = ["--seq_len=64", "--reuse_len=32", "--bsz_per_host=4", "--num_predict=10", "--use_tpu=False", "--num_workers=1"]


def create(spm, input_glob, save_dir, overwrite=False, **flags):
    config = CreateConfig(input_glob=str(input_glob), sp_path=str(spm), save_dir=str(save_dir),
                          **{**SMALL, **flags}).validate()
    return job.create_records(config, overwrite=overwrite, num_workers=1)


def create_cli(spm, input_glob, save_dir, *extra):
    return run_module("xlnet_data.create", f"--input_glob={input_glob}", f"--sp_path={spm}", f"--save_dir={save_dir}",
                      *ARGS, *extra)


def one_error(result):
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def units(save_dir):
    return [name for name in listing(save_dir) if name.startswith("tfrecords/")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three small files (40 lines of a book each): every test copies it before changing it."""
    folder = tmp_path_factory.mktemp("corpus")
    for i, path in enumerate(sorted(SAMPLE_CORPUS.glob("*.txt"))[:3]):
        lines = path.read_text(encoding="utf-8").splitlines()
        (folder / f"part{i}.txt").write_text("\n".join(line for line in lines[:200] if line.strip()) + "\n",
                                             encoding="utf-8")
    return folder


@pytest.fixture
def texts(corpus, tmp_path):
    copy = tmp_path / "texts"
    shutil.copytree(corpus, copy)
    return copy


@pytest.fixture(scope="module")
def two_by_two(corpus, sample_spm, tmp_path_factory):
    """An uninterrupted run of 2 tasks x 2 passes on `corpus`."""
    save_dir = tmp_path_factory.mktemp("whole") / "out"
    create(sample_spm, corpus / "*.txt", save_dir, num_task=2, num_passes=2)
    assert len(units(save_dir)) == 8
    return save_dir


# ---- provenance ----

@pytest.mark.slow
def test_every_unit_records_its_flags_files_model_and_size(two_by_two, corpus, sample_spm):
    from xlnet_data.dataformat import provenance
    info_paths = sorted((two_by_two / "tfrecords").glob("record_info-train-1-*.json"))
    assert len(info_paths) == 2
    for info_path in info_paths:
        info = json.loads(info_path.read_text())
        made_from = info["made_from"]
        assert made_from["model_sha256"] == provenance.sha256_of(str(sample_spm))
        part1 = corpus / "part1.txt"
        assert made_from["files"] == [{"path": str(part1), "size": part1.stat().st_size,
                                       "mtime_ns": part1.stat().st_mtime_ns, "sha256": provenance.sha256_of(part1)}]
        records = info_path.parent / info["filenames"][0].rsplit("/", 1)[1]
        assert made_from["record_bytes"] == records.stat().st_size
        assert info["create_settings"]["seq_len"] == 64 and info["create_settings"]["num_task"] == 2


@pytest.mark.parametrize("change, why", [
    ("append", "{path} changed ({before} bytes then, {after} now)"),
    ("same_size", "{path} changed (its content differs)"),
    ("new_file", "{path} is new (not among the files it was made from)"),
    ("removed", "{path} is gone (it was made from it)"),
])
def test_a_changed_input_is_refused_naming_it_and_overwrite_makes_the_save_dir_again(texts, sample_spm, tmp_path,
                                                                                      change, why):
    save_dir = tmp_path / "out"
    create(sample_spm, texts / "*.txt", save_dir, num_passes=2)
    before_listing = {name: (save_dir / name).read_bytes() for name in units(save_dir)}
    path = texts / "part1.txt"
    before = path.stat().st_size
    if change == "append":
        with open(path, "a", encoding="utf-8") as f:
            f.write("A new line at the end.\n")
    elif change == "same_size":
        data = path.read_bytes()
        path.write_bytes(data[:10] + bytes([data[10] ^ 0x20]) + data[11:])  # one letter's case
    elif change == "new_file":
        path = texts / "part3.txt"
        path.write_text("Another file, added later.\n")
    else:
        path = texts / "part2.txt"
        path.unlink()
    with pytest.raises(CreateError) as refused:
        create(sample_spm, texts / "*.txt", save_dir, num_passes=2)
    after = path.stat().st_size if path.exists() else 0
    assert str(refused.value).startswith(why.format(path=path, before=before, after=after) + ": ")
    assert "--overwrite makes it again from the inputs as they are" in str(refused.value)
    assert {name: (save_dir / name).read_bytes() for name in units(save_dir)} == before_listing  # untouched
    create(sample_spm, texts / "*.txt", save_dir, overwrite=True, num_passes=2)
    create(sample_spm, texts / "*.txt", tmp_path / "fresh", num_passes=2)
    assert_same_records(tmp_path / "fresh", save_dir)


@pytest.mark.slow
def test_a_replaced_sentencepiece_model_is_refused_by_create_and_by_dump(texts, sample_spm, tmp_path):
    from xlnet_data.datagen import tokenizer
    model = tmp_path / "model.model"
    shutil.copy(sample_spm, model)
    save_dir = tmp_path / "out"
    create(model, texts / "*.txt", save_dir)
    left = units(save_dir)
    other = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=(str(texts / "part0.txt"),), model_prefix=str(tmp_path / "other"), vocab_size=1000, num_threads=2,
        uncased=False))  # cased, as sample_spm
    shutil.copy(other, model)  # another model (of the same size) at the same path
    line = one_error(create_cli(model, texts / "*.txt", save_dir))
    assert line.startswith(f"create: error: the SentencePiece model {model} is not the one it was made with (sha256 ")
    assert units(save_dir) == left
    line = one_error(run_module("xlnet_data.dump", save_dir, "--limit=1"))
    assert line == (f"dump: error: {model} (corpus_info.json's sp_path) is not the SentencePiece model the records "
                    "were made with (it changed since): pass that model's --sp_path, or make the records again")


@pytest.mark.slow
def test_a_run_with_other_data_flags_is_refused_naming_the_first_runs_flags(texts, sample_spm, tmp_path):
    save_dir = tmp_path / "out"
    first = ["--num_task=2", "--task=1", "--seq_len=128", "--reuse_len=64"]
    assert create_cli(sample_spm, texts / "*.txt", save_dir, *first).returncode == 0
    left = units(save_dir)
    line = one_error(create_cli(sample_spm, texts / "*.txt", save_dir, "--num_task=2", "--task=0"))
    info = save_dir / "tfrecords" / "record_info-train-1-0.bsz-4.seqlen-128.reuse-64.uncased.bi.alpha-6.beta-1.fnp-10.json"
    assert line.startswith(f"create: error: {save_dir} holds units made with other data flags ({info}: ")
    assert "; a save_dir holds one run's units" in line and line.endswith("or --overwrite to replace them")
    assert "--seq_len=128 there, 64 here; --reuse_len=64 there, 32 here)" in line
    assert units(save_dir) == left and not (save_dir / "corpus_info.json").exists()
    # The first run's flags complete it, as an uninterrupted two-task run.
    create(sample_spm, texts / "*.txt", save_dir, num_task=2, seq_len=128, reuse_len=64)
    create(sample_spm, texts / "*.txt", tmp_path / "whole", num_task=2, seq_len=128, reuse_len=64)
    assert_same_records(tmp_path / "whole", save_dir)


@pytest.mark.slow
def test_train_and_dump_refuse_a_save_dir_holding_units_of_two_runs(two_by_two, tmp_path):
    from xlnet_data.dataformat import validation
    from xlnet_data.dataformat.save_dir import SaveDirError
    mixed = tmp_path / "mixed"
    shutil.copytree(two_by_two, mixed)
    info_path = sorted((mixed / "tfrecords").glob("record_info-train-1-1.*.json"))[0]
    info = json.loads(info_path.read_text())
    info["create_settings"]["input_glob"] = "/elsewhere/*.txt"  # as another run would have written it
    info_path.write_text(json.dumps(info))
    with pytest.raises(SaveDirError) as refused:
        validation.check_units_agree(str(mixed / "tfrecords"))
    assert f"{info_path} and " in str(refused.value)
    assert "were made by different runs of create (input_glob=" in str(refused.value)
    assert "make it again with create --overwrite" in str(refused.value)
    line = one_error(run_module("xlnet_data.dump", mixed, "--limit=1"))
    assert line == f"dump: error: {refused.value}"
    from xlnet_data.dataformat import settings
    with pytest.raises(SaveDirError, match="were made by different runs of create"):
        settings.find_record_dirs(str(mixed))


def test_overwrite_with_fewer_tasks_and_passes_leaves_no_unit_of_the_earlier_run(two_by_two, corpus, sample_spm,
                                                                                 tmp_path):
    save_dir = tmp_path / "out"
    shutil.copytree(two_by_two, save_dir)
    create(sample_spm, corpus / "*.txt", save_dir, overwrite=True)
    create(sample_spm, corpus / "*.txt", tmp_path / "fresh")
    assert len(units(save_dir)) == 2
    assert_same_records(tmp_path / "fresh", save_dir)


def test_overwrite_of_one_task_keeps_the_other_tasks_of_the_same_flags(two_by_two, corpus, sample_spm, tmp_path):
    save_dir = tmp_path / "out"
    shutil.copytree(two_by_two, save_dir)
    create(sample_spm, corpus / "*.txt", save_dir, overwrite=True, num_task=2, num_passes=2, task=1)
    assert_same_records(two_by_two, save_dir)


def test_a_unit_cut_short_is_redone_not_complete_already(two_by_two, corpus, sample_spm, tmp_path, caplog):
    save_dir = tmp_path / "out"
    shutil.copytree(two_by_two, save_dir)
    records = sorted((save_dir / "tfrecords").glob("train-0-1.*.tfrecords"))[0]
    size = records.stat().st_size
    with open(records, "r+b") as f:
        f.truncate(size // 2)
    caplog.set_level("INFO", logger="xlnet_data")
    summary = create(sample_spm, corpus / "*.txt", save_dir, num_task=2, num_passes=2)
    assert f"task 0 pass 1 is redone: {records} is {size // 2} bytes, its record_info says {size}" in caplog.text
    assert [(r.unit.task, r.unit.pass_id) for r in summary.written] == [(0, 1)]
    assert_same_records(two_by_two, save_dir)


# ---- counts, an empty corpus, the save_dir inside the glob ----

def test_a_bad_line_is_counted_once_whatever_the_number_of_passes(texts, sample_spm, tmp_path):
    with open(texts / "part0.txt", "ab") as f:
        f.write(b"A line with a bad byte \xff in it.\n")
    summary = create(sample_spm, texts / "*.txt", tmp_path / "out", num_passes=3)
    assert len(summary.units) == 3
    assert ", 1 invalid UTF-8 lines replaced, 0 files without tokens skipped" in summary.line(0)


@pytest.mark.slow
def test_an_empty_corpus_is_an_error_and_writes_nothing(tmp_path, sample_spm):
    (tmp_path / "in").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "in" / name).write_text("")
    line = one_error(create_cli(sample_spm, tmp_path / "in" / "*.txt", tmp_path / "out"))
    assert line == (f"create: error: the corpus is empty: the 2 file(s) of --input_glob={tmp_path / 'in' / '*.txt'} "
                    "hold no byte; nothing written")
    assert not (tmp_path / "out").exists()
    (tmp_path / "in" / "a.txt").write_text("\n\n\n")  # blank lines only: no token without --use_eod
    with pytest.raises(CreateError, match="the corpus is empty: the files of --input_glob=.* hold no token"):
        create(sample_spm, tmp_path / "in" / "*.txt", tmp_path / "out", use_eod=False)
    assert units(tmp_path / "out") == [] and not (tmp_path / "out" / "corpus_info.json").exists()


def test_the_save_dir_inside_the_input_glob_is_left_out_of_it(texts, sample_spm, tmp_path):
    save_dir = texts / "out"  # --input_glob='texts/*' --save_dir=texts/out
    create(sample_spm, texts / "*", save_dir, num_passes=2)
    summary = create(sample_spm, texts / "*", save_dir, num_passes=2)  # the re-run: complete already
    assert summary.units == ()
    create(sample_spm, texts / "*.txt", tmp_path / "elsewhere", num_passes=2)
    assert_same_records(tmp_path / "elsewhere", save_dir)


# ---- every flag checked before any work ----

@pytest.mark.parametrize("flag, message", [
    ("--save_dir=", "--save_dir is empty: give a path"),
    ("--num_predict=0", "--num_predict=0 must be in [1, 65536]"),
    ("--mask_alpha=4611686018427387904", "--mask_alpha=4611686018427387904 must be in [1, 1048576]"),
    ("--mask_alpha=100000000000000000000", "--mask_alpha=100000000000000000000 must be in [1, 1048576]"),
    ("--seq_len=2000000000", "--seq_len=2000000000 must be in [1, 65536]"),
])
def test_a_flag_out_of_range_is_one_line_before_any_work(texts, sample_spm, tmp_path, flag, message):
    line = one_error(create_cli(sample_spm, texts / "*.txt", tmp_path / "out", flag))
    assert line == f"create: error: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes, message", [
    (dict(bsz_per_host=1 << 17), "--bsz_per_host=131072 must be in [1, 65536]"),
    (dict(mask_beta=0), "--mask_beta=0 must be in [1, 1048576]"),
    (dict(bsz_per_host=1 << 16, seq_len=1 << 9, reuse_len=256), "tokens per batch"),
    (dict(pass_id=1 << 40), "--pass_id=1099511627776 is too large"),
    (dict(input_glob=""), "--input_glob is empty"),
])
def test_more_flags_out_of_range(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        CreateConfig(**{**SMALL, "sp_path": "m", **changes}).validate()


def test_the_largest_mask_alpha_runs_without_a_hang(texts, sample_spm, tmp_path):
    summary = create(sample_spm, texts / "part0.txt", tmp_path / "out", mask_alpha=1 << 20, mask_beta=1)
    assert summary.total("records") > 0
