"""What a `create` run will do: the checks made before anything is written, and the units left to run.

Shared by the local runner (worker processes) and the Beam runner, so both skip the same complete
units, refuse the same conflicting save_dir, and write corpus_info.json the same way.
"""

import dataclasses
import logging
import os

from xlnet_data.common import fileio, save_dir, validation
from xlnet_data.common.vocab import load_sentencepiece
from xlnet_data.datagen import corpus, token_cache, tokenizer, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.corpus import InputError

log = logging.getLogger("xlnet_data")


class CreateError(Exception):
    """A problem with flags, inputs or outputs, reported as one line before anything is written."""


@dataclasses.dataclass
class Plan:
    corpus_info: dict
    units: list[tuple[units.Unit, list[str]]]  # (unit, its files) still to run
    input_bytes: int
    token_caches: dict[int, str] = dataclasses.field(default_factory=dict)  # task -> its cache key, tasks to run

    def encode_jobs(self):
        """(task, files, cache key) of each task with units to run: the encode stage, before their passes."""
        files = {unit.task: task_files for unit, task_files in self.units}
        return [(task, files[task], key) for task, key in self.token_caches.items()]


def _check_save_dir(config, info, overwrite):
    path = save_dir.corpus_info_path(config.save_dir)
    if overwrite or not fileio.exists(path):
        return
    try:
        existing = save_dir.read_json(path)
    except (OSError, ValueError):
        return
    there = {**validation.ABSENT_MEANS, **existing}  # a corpus_info of an older create lacks the newer keys
    differ = [f"{k} {there.get(k)!r} there, {v!r} here" for k, v in info.items() if there.get(k) != v]
    if differ:
        raise CreateError(f"{config.save_dir} holds data made with other flags ({'; '.join(differ)}); "
                          "use another --save_dir, or --overwrite")


def unit_is_complete(config, unit):
    """A unit is complete when its record_info exists (it is written last) and names the same settings."""
    record_path, info_path = units.record_paths(config, unit)
    if not fileio.exists(info_path):
        return False
    try:
        info = save_dir.read_json(info_path)
    except (OSError, ValueError):
        return False
    created = info.get("create_settings")
    if isinstance(created, dict):  # a unit written before a setting existed has its old meaning
        created = {**validation.ABSENT_MEANS, **created}
    if created != units.record_settings(config):
        raise CreateError(f"{info_path} was written with other flags; use another --save_dir, or --overwrite")
    if units.TOKEN_CACHE in info:  # cache-backed: complete while its cache is there, and if no records are asked
        return not config.write_records and token_cache.referenced_cache_exists(config, info[units.TOKEN_CACHE])
    return config.write_records and fileio.exists(record_path)


def _size(path):
    try:
        return fileio.size(path)
    except Exception:  # an unknown size only blurs the progress line's ETA
        return 0


def make_plan(config: CreateConfig, overwrite=False) -> Plan:
    """Checks the model, the inputs and the save_dir; lists the units to run. Writes nothing."""
    sp = load_sentencepiece(config.sp_path)
    mismatch = config.from_raw_text and tokenizer.text_settings_mismatch(config.sp_path, config.uncased,
                                                                        config.keep_accents)
    if mismatch:
        log.warning("%s", mismatch)
    paths = fileio.glob(config.input_glob)
    if not paths:
        raise CreateError(f"no file matches --input_glob={config.input_glob}")
    for path in paths:
        if not fileio.is_remote(path) and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            why = "is not a file" if not os.path.isfile(path) else "cannot be read (permissions)"
            raise InputError(f"{path} {why}; fix --input_glob={config.input_glob} or the file")
        corpus.check_first_block(path, config.allow_binary)
    info = units.corpus_info(config, sp.get_piece_size())
    _check_save_dir(config, info, overwrite)
    todo = []
    for unit in units.plan_units(config):
        files = corpus.task_files(paths, unit.task, config.num_task)
        if not files:
            log.info("task %d has no file to process (%d files, %d tasks)", unit.task, len(paths), config.num_task)
        elif not overwrite and unit_is_complete(config, unit):
            log.info("task %d pass %d is complete already (its record_info exists); skipped, "
                     "--overwrite redoes it", unit.task, unit.pass_id)
        else:
            todo.append((unit, files))
    task_files = {unit.task: files for unit, files in todo}  # each task's files are read once, for all passes
    token_caches = {task: token_cache.cache_key(config, files) for task, files in task_files.items()}
    return Plan(info, todo, sum(_size(p) for files in task_files.values() for p in files), token_caches)


def prepare_save_dir(config: CreateConfig, plan: Plan):
    """Makes save_dir/tfrecords and writes corpus_info.json (when task 0 is part of the run, as the original)."""
    fileio.makedirs(os.path.join(config.save_dir, save_dir.TFRECORDS))
    if 0 in config.tasks:
        save_dir.write_json(save_dir.corpus_info_path(config.save_dir), plan.corpus_info)
