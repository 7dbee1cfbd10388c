"""The local runner: a plan's encode stage and units in parallel worker processes, with one progress line for all."""

import collections
import logging
import os

from xlnet_data.common import memory, workers
from xlnet_data.common.progress import Progress
from xlnet_data.dataformat import token_cache
from xlnet_data.dataformat.vocab import load_sentencepiece
from xlnet_data.datagen import encode, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import Plan


def _init_process():
    """A worker process's own settings. Not run in the caller's process (num_workers=1), which a library user
    may share with other work: the create command makes the same settings for itself."""
    memory.release_large_blocks_promptly()
    logging.basicConfig(level=logging.INFO, format="%(levelname).1s %(message)s")


def _report_progress(lines, tokens, nbytes):
    workers.report(lines, tokens, 0, nbytes)


def _report_records(records):
    workers.report(0, 0, records, 0)


def _encode_task(config, task, files, key, encode_threads):
    sp = load_sentencepiece(config.sp_path)
    return encode.encode_task(config, task, files, key, sp, encode_threads=encode_threads,
                              on_progress=_report_progress)


def _run_unit(config, unit, key, made_from):
    sp = load_sentencepiece(config.sp_path)
    return units.run_unit(config, unit, key, sp, on_records=_report_records, made_from=made_from)


def _encode_and_run_unit(config, unit, files, key, made_from, encode_threads):
    """A task's only unit, from its files encoded in memory (no token cache: see encode.EncodedTask)."""
    sp = load_sentencepiece(config.sp_path)
    encoded = encode.encode_in_memory(config, unit.task, files, sp, encode_threads=encode_threads,
                                      on_progress=_report_progress)
    return units.run_unit(config, unit, key, sp, on_records=_report_records, encoded=encoded, made_from=made_from)


def run_local(config: CreateConfig, plan: Plan, num_workers=None, keep_cache=False):
    """Runs the plan, `num_workers` processes at a time (default: the CPU count): first the encode stage (each
    task with units to run, SentencePiece's threads sharing out the cores), then the (task, pass) units.
    A task with one unit to run and no complete token cache (a run of one pass) is encoded and run as one
    job, in memory, unless `keep_cache` asks for the cache. Returns their UnitResults."""
    todo = plan.units
    if not todo:
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    num_workers = min(len(todo), num_workers or cores)
    encode_jobs = plan.encode_jobs()
    encode_threads = max(1, cores // max(1, min(num_workers, len(encode_jobs))))
    units_of_task = collections.Counter(unit.task for unit, _ in todo)
    inputs = {task: (files, key) for task, files, key in encode_jobs}
    in_memory = set() if keep_cache or not config.write_records else {
        task for task, (_, key) in inputs.items()
        if units_of_task[task] == 1 and token_cache.read_index(config.save_dir, task, key) is None}
    single_jobs = [(config, unit, *inputs[unit.task], plan.made_from.get(unit.task), encode_threads)
                   for unit, _ in todo if unit.task in in_memory]
    encode_jobs = [(config, task, files, key, encode_threads) for task, (files, key) in inputs.items()
                   if task not in in_memory]
    unit_jobs = [(config, unit, plan.token_caches[unit.task], plan.made_from.get(unit.task))
                 for unit, _ in todo if unit.task not in in_memory]
    progress = Progress(plan.input_bytes)
    counts = [0, 0, 0, 0]  # lines, tokens, records, bytes read
    done = []

    def on_counts(*more):
        for i, n in enumerate(more):
            counts[i] += n
        progress.update(*counts, len(done), len(todo))

    try:
        if num_workers == 1:  # in this process, as its owner set it up
            with workers.reporting_to(on_counts):
                for job in single_jobs:
                    done.append(_encode_and_run_unit(*job))
                for job in encode_jobs:
                    _encode_task(*job)
                for job in unit_jobs:
                    done.append(_run_unit(*job))
        else:
            with workers.Workers(num_workers, initializer=_init_process) as pool:
                pool.run(_encode_and_run_unit, single_jobs, on_done=lambda index, result: done.append(result),
                         on_counts=on_counts)
                pool.run(_encode_task, encode_jobs, on_done=lambda index, result: None, on_counts=on_counts)
                pool.run(_run_unit, unit_jobs, on_done=lambda index, result: done.append(result), on_counts=on_counts)
    finally:
        progress.close()
    return sorted(done, key=lambda result: (result.unit.task, result.unit.pass_id))
