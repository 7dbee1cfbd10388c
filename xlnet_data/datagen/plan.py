"""What a `create` run will do: the checks made before anything is written, and the units left to run.

Shared by the local runner (worker processes) and the Beam runner, so both skip the same complete
units, refuse the same conflicting save_dir, and write corpus_info.json the same way.
"""

import collections
import dataclasses
import logging
import os

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import provenance, record_info, save_dir, token_cache, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo, NewerFormatError
from xlnet_data.dataformat.examples.loop import Unit
from xlnet_data.dataformat.record_reader import RecordError
from xlnet_data.dataformat.vocab import load_sentencepiece
from xlnet_data.datagen import corpus, encode, tokenizer
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.corpus import InputError

log = logging.getLogger("xlnet_data")


class CreateError(UserError):
    """A problem with flags, inputs or outputs, reported as one line before anything is written."""


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """A task with units to run: its files, the key of its token cache, what its units are made from, and
    where its ids go. `in_memory`: its one unit to run takes them from its files encoded in memory
    (encode.encode_in_memory), and no token cache is written; else the encode stage writes (or finds) its
    cache, which each of its units reads back."""
    task: int
    files: tuple[str, ...]
    cache_key: str
    made_from: dict  # provenance.made_from
    in_memory: bool = False


@dataclasses.dataclass
class Plan:
    corpus_info: CorpusInfo
    units: list[Unit]  # still to run, by task and pass
    tasks: dict[int, TaskPlan]  # the tasks of `units`
    input_bytes: int

    def cache_tasks(self) -> list[TaskPlan]:
        """The tasks encoded into their token cache (the encode stage), before their units run."""
        return [task for task in self.tasks.values() if not task.in_memory]

    def cache_units(self) -> list[Unit]:
        """The units that read their task's token cache."""
        return [unit for unit in self.units if not self.tasks[unit.task].in_memory]

    def memory_units(self) -> list[Unit]:
        """The units whose task is encoded in memory for them, in the same job."""
        return [unit for unit in self.units if self.tasks[unit.task].in_memory]


def _check_save_dir(save_dir_path, info: CorpusInfo, overwrite):
    """corpus_info.json there against this run's, on every setting but input_glob: that is each split's own
    (create --split=dev reads other files into the same save_dir), and _check_units compares it unit by unit."""
    path = save_dir.corpus_info_path(save_dir_path)
    if overwrite or not fileio.exists(path):
        return
    try:
        there = CorpusInfo.read(path).settings()  # a corpus_info of an older create lacks the newer keys
    except NewerFormatError:  # not to be mixed with units of this version
        raise
    except (OSError, ValueError):
        return
    differ = [f"{k} {there.get(k)!r} there, {v!r} here" for k, v in info.settings().items()
              if there.get(k) != v and k != "input_glob"]
    if differ:
        raise CreateError(f"{save_dir_path} holds data made with other flags ({'; '.join(differ)}); "
                          "use another --save_dir, or --overwrite")


def unit_is_complete(config, unit):
    """A unit is complete when its record_info exists (it is written last), names the same settings, and its
    records file has the size it records (one cut short is redone, with a warning)."""
    record_path, info_path = config.unit_paths(unit)
    if not fileio.exists(info_path):
        return False
    try:
        info = save_dir.read_json(info_path)
    except (OSError, ValueError):
        return False
    if record_info.recorded_create_settings(info) != record_info.create_settings(config):
        raise CreateError(f"{info_path} was written with other flags; use another --save_dir, or --overwrite")
    if record_info.is_cache_backed(info):  # complete while its cache is there, and if no records are asked
        return not config.write_records and token_cache.referenced_cache_exists(
            config.save_dir, info[record_info.TOKEN_CACHE_KEY])
    if not config.write_records or not fileio.exists(record_path):
        return False
    made_from = info.get(provenance.MADE_FROM)
    cut = provenance.records_cut_short(record_path, made_from)
    if made_from is None:  # an older create's record_info, without the size: count the records' frames
        try:
            validation.check_unit(info_path, validation.read_num_batch(info_path, info), [record_path],
                                  config.bsz_per_host)
        except (RecordError, save_dir.SaveDirError) as err:
            cut = str(err)
    if cut:
        log.warning("task %d pass %d is redone: %s", unit.task, unit.pass_id, cut)
        return False
    return True


def _flag_differences(settings, theirs):
    return [f"--{key}={theirs.get(key)!r} there, {value!r} here" for key, value in settings.items()
            if theirs.get(key) != value]


def _check_units(config, paths, model_sha256):
    """Every unit already in save_dir was made with this run's data flags, this model and the files as they
    are now (provenance); CreateError names the first that was not."""
    settings = record_info.create_settings(config)
    folder = os.path.join(config.save_dir, save_dir.TFRECORDS)
    for info_path, info in provenance.unit_files(folder):
        theirs = record_info.recorded_create_settings(info)
        parsed = save_dir.parse_name(info_path)
        other_split = parsed is not None and parsed.split not in (None, config.split)
        ours = record_info.shared_settings(settings) if other_split else settings  # another split: its own files
        if isinstance(theirs, dict) and (record_info.shared_settings(theirs) if other_split else theirs) != ours:
            raise CreateError(f"{config.save_dir} holds units made with other data flags ({info_path}: "
                              f"{'; '.join(_flag_differences(ours, theirs))}); a save_dir holds one run's units: "
                              "use another --save_dir, or --overwrite to replace them")
        if other_split or parsed is None or parsed.task is None or parsed.task >= config.num_task:
            continue
        change = provenance.input_change(info.get(provenance.MADE_FROM),
                                         corpus.task_files(paths, parsed.task, config.num_task), model_sha256,
                                         config.sp_path)
        if change:
            raise CreateError(f"{change}: {info_path} was made from the inputs as they were, and a save_dir must not "
                              "mix old and new; --overwrite makes it again from the inputs as they are (or restore "
                              "the inputs)")


def _check_other_splits_model(config, model_sha256):
    """CreateError when a unit of another split in save_dir (one this run keeps, even with --overwrite) was made
    with another SentencePiece model: a save_dir of two models' ids is refused whole by train_gpu and dump.
    Refused rather than replaced whole: the other split's units may be days of create that this command never
    named."""
    folder = os.path.join(config.save_dir, save_dir.TFRECORDS)
    for info_path, info in provenance.unit_files(folder):
        parsed = save_dir.parse_name(info_path)
        theirs = (info.get(provenance.MADE_FROM) or {}).get("model_sha256")
        if parsed is None or parsed.split in (None, config.split) or theirs in (None, model_sha256):
            continue
        raise CreateError(f"{config.save_dir}'s {parsed.split} units were made with another SentencePiece model "
                          f"(sha256 {theirs} in {info_path}; --sp_path={config.sp_path}: {model_sha256}): one "
                          f"save_dir holds the ids of one model; use that model, or another --save_dir")


def _own_outputs_excluded(save_dir_path, paths):
    """The glob's matches without what lies in save_dir (a glob such as data/* with --save_dir=data/out)."""
    if fileio.is_remote(save_dir_path):
        return paths
    inside = os.path.realpath(save_dir_path) + os.sep
    kept = [path for path in paths if not (os.path.realpath(path) + os.sep).startswith(inside)]
    if len(kept) < len(paths):
        log.info("%d path(s) under --save_dir=%s left out of --input_glob", len(paths) - len(kept), save_dir_path)
    return kept


def size_or_zero(path):
    try:
        return fileio.size(path)
    except Exception:  # an unknown size only blurs the progress line's ETA
        return 0


def make_plan(config: CreateConfig, overwrite=False, keep_cache=False) -> Plan:
    """Checks the model, the inputs and the save_dir; lists the units to run and, for each of their tasks, where
    its ids go: TaskPlan.in_memory for a task with one unit to run (a run of one pass), which then takes them
    from memory without writing 4.1 bytes a token and reading them back, unless the cache is asked for
    (`keep_cache`, --nowrite_records) or a complete one is there. Writes nothing."""
    sp = load_sentencepiece(config.sp_path)
    mismatch = config.from_raw_text and tokenizer.text_settings_mismatch(config.sp_path, config.uncased,
                                                                        config.keep_accents)
    if mismatch and not config.allow_accents_mismatch and \
            bool(tokenizer.model_text_settings(config.sp_path).get("keep_accents")) != config.keep_accents:
        # Not a warning: the model never saw the text these records would hold (marks on or off: up to a fifth of
        # the characters of Vietnamese).
        raise CreateError(f"{mismatch}; or pass --allow_accents_mismatch to make the records anyway")
    if mismatch:
        log.warning("%s", mismatch)
    # sorted once: task_files sorts them again per task and per unit already in save_dir, then in linear time
    paths = sorted(_own_outputs_excluded(config.save_dir, fileio.glob(config.input_glob)))
    if not paths:
        raise CreateError(f"no file matches --input_glob={config.input_glob}")
    for path in paths:
        if not fileio.is_remote(path) and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            why = "is not a file" if not os.path.isfile(path) else "cannot be read (permissions)"
            raise InputError(f"{path} {why}; fix --input_glob={config.input_glob} or the file")
        corpus.check_first_block(path, config.allow_binary)
    if not any(size_or_zero(path) for path in paths):
        raise CreateError(f"the corpus is empty: the {len(paths)} file(s) of --input_glob={config.input_glob} "
                          "hold no byte; nothing written")
    info = CorpusInfo.of(config, sp.get_piece_size())
    _check_save_dir(config.save_dir, info, overwrite)
    model_sha256 = provenance.sha256_of(config.sp_path)
    _check_other_splits_model(config, model_sha256)
    if not overwrite:
        _check_units(config, paths, model_sha256)
    todo, task_files = [], {}  # each task's files are read once, for all its passes
    files_of = {task: corpus.task_files(paths, task, config.num_task) for task in config.tasks}
    for unit in (Unit(task, pass_id) for task in config.tasks for pass_id in config.pass_ids):
        files = files_of[unit.task]
        if not files:
            log.info("task %d has no file to process (%d files, %d tasks)", unit.task, len(paths), config.num_task)
        elif not overwrite and unit_is_complete(config, unit):
            log.info("task %d pass %d is complete already (its record_info exists); skipped, "
                     "--overwrite redoes it", unit.task, unit.pass_id)
        else:
            todo.append(unit)
            task_files[unit.task] = tuple(files)
    settings = encode.EncodeSettings.of(config)
    cache_asked = keep_cache or not config.write_records  # --nowrite_records: the cache makes the records
    tasks, units_of_task = {}, collections.Counter(unit.task for unit in todo)
    for task, files in task_files.items():
        key = encode.cache_key(settings, files, model_sha256)
        one_unit = units_of_task[task] == 1
        in_memory = (one_unit and not cache_asked  # a complete cache (a killed run's, a kept one) is read instead
                     and token_cache.read_index(config.save_dir, task, key) is None)
        tasks[task] = TaskPlan(task, files, key, provenance.made_from(files, model_sha256), in_memory)
    return Plan(info, todo, tasks, sum(size_or_zero(p) for files in task_files.values() for p in files))



def _remove_earlier_units(config: CreateConfig):
    """--overwrite: every unit in save_dir goes (record_info first, so none is ever complete-looking without its
    records), except, in a run of one --task, the units of the other tasks made with the same data flags."""
    folder = os.path.join(config.save_dir, save_dir.TFRECORDS)
    settings = record_info.create_settings(config)
    removed = 0
    for info_path, info in provenance.unit_files(folder):
        parsed = save_dir.parse_name(info_path)
        if parsed is not None and parsed.split not in (None, config.split):
            continue  # another split's units (create --split=dev) stay
        other_task = (config.task is not None and parsed is not None and parsed.task not in config.tasks
                      and parsed.task is not None and parsed.task < config.num_task)
        if other_task and info.get(record_info.SETTINGS_KEY) == settings:
            continue
        record_path = save_dir.record_file_of(info_path)
        for path in (info_path, record_path, record_path + ".gz"):
            if fileio.exists(path):
                fileio.remove(path)
        removed += 1
    for path in fileio.glob(os.path.join(folder, "*.tfrecords")):  # records whose record_info was lost
        parsed = save_dir.parse_name(path)
        if parsed and parsed.split in (None, config.split) and not fileio.exists(save_dir.record_info_of(path)):
            fileio.remove(path)
    if removed:
        log.info("--overwrite: %d unit(s) of the earlier run removed from %s", removed, folder)


def prepare_save_dir(config: CreateConfig, plan: Plan, overwrite=False):
    """Makes save_dir/tfrecords and writes corpus_info.json (when task 0 is part of the run, as the original;
    it describes the train split: a run of another split writes it only where there is none)."""
    fileio.makedirs(os.path.join(config.save_dir, save_dir.TFRECORDS))
    if overwrite:
        _remove_earlier_units(config)
    info_path = save_dir.corpus_info_path(config.save_dir)
    if 0 in config.tasks and (config.split == "train" or not fileio.exists(info_path)):
        plan.corpus_info.write(info_path)
