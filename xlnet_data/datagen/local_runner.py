"""The local runner: a plan's encode stage and units in parallel worker processes, with one progress line for all."""

import logging

from xlnet_data.common import memory, workers
from xlnet_data.common.progress import Progress
from xlnet_data.dataformat import save_dir_lock
from xlnet_data.dataformat.vocab import load_sentencepiece
from xlnet_data.datagen import encode, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import Plan, TaskPlan


def _init_process():
    """A worker process's own settings. Not run in the caller's process (num_workers=1), which a library user
    may share with other work: the create command makes the same settings for itself."""
    memory.release_large_blocks_promptly()
    logging.basicConfig(level=logging.INFO, format="%(levelname).1s %(message)s")


def _report_progress(lines, tokens, nbytes):
    workers.report(lines, tokens, 0, nbytes)


def _report_records(records):
    workers.report(0, 0, records, 0)


def _encode_task(config, task: TaskPlan, encode_threads):
    sp = load_sentencepiece(config.sp_path)
    return encode.encode_task(config.save_dir, encode.EncodeSettings.of(config), task.task, task.files,
                              task.cache_key, sp, encode_threads=encode_threads, on_progress=_report_progress)


def _run_unit(config, unit, task: TaskPlan):
    sp = load_sentencepiece(config.sp_path)
    return units.run_unit(config, unit, task.cache_key, sp, on_records=_report_records, made_from=task.made_from)


def _encode_and_run_unit(config, unit, task: TaskPlan, encode_threads):
    """A task's only unit, from its files encoded in memory (the plan's TaskPlan.in_memory: no token cache)."""
    sp = load_sentencepiece(config.sp_path)
    encoded = encode.encode_in_memory(encode.EncodeSettings.of(config), task.task, task.files, sp,
                                      encode_threads=encode_threads, on_progress=_report_progress)
    return units.run_unit(config, unit, task.cache_key, sp, on_records=_report_records, encoded=encoded,
                          made_from=task.made_from)


def worker_count(plan: Plan, num_workers=None) -> int:
    """The worker processes run_local starts for `plan`: `num_workers` (default: the CPU count), at most one a
    unit."""
    return min(len(plan.units), num_workers or workers.process_cores())


def run_local(config: CreateConfig, plan: Plan, num_workers=None, on_encoded=None):
    """Runs the plan, `num_workers` processes at a time (default: the CPU count): first the tasks encoded in
    memory, each with its one unit in the same job, and the encode stage (each other task encoded into its token
    cache, SentencePiece's threads sharing out the cores; `on_encoded(encode.EncodeResult)` after each, in this
    process), then the units that read the caches. Returns the units' UnitResults."""
    todo = plan.units
    if not todo:
        return []
    cores = workers.process_cores()
    num_workers = worker_count(plan, num_workers)
    encode_threads = max(1, cores // max(1, min(num_workers, len(plan.tasks))))
    single_jobs = [(config, unit, plan.tasks[unit.task], encode_threads) for unit in plan.memory_units()]
    encode_jobs = [(config, task, encode_threads) for task in plan.cache_tasks()]
    unit_jobs = [(config, unit, plan.tasks[unit.task]) for unit in plan.cache_units()]
    progress = Progress(plan.input_bytes)
    peak = memory.PeakRecorder(save_dir_lock.peak_path(config.save_dir))  # left behind if the kernel kills the run
    counts = [0, 0, 0, 0]  # lines, tokens, records, bytes read
    done = []

    def on_counts(*more):
        for i, n in enumerate(more):
            counts[i] += n
        progress.update(*counts, len(done), len(todo))
        peak.sample()

    def encoded(index, result):
        if on_encoded:
            on_encoded(result)

    def on_unit_done(index, result):
        done.append(result)
        progress.update(*counts, len(done), len(todo))
        peak.sample()

    try:
        if num_workers == 1:  # in this process, as its owner set it up
            with workers.reporting_to(on_counts):
                for job in single_jobs:
                    on_unit_done(None, _encode_and_run_unit(*job))
                for job in encode_jobs:
                    encoded(None, _encode_task(*job))
                for job in unit_jobs:
                    on_unit_done(None, _run_unit(*job))
        else:
            with workers.Workers(num_workers, initializer=_init_process) as pool:
                pool.run(_encode_and_run_unit, single_jobs, on_done=on_unit_done, on_counts=on_counts)
                pool.run(_encode_task, encode_jobs, on_done=encoded, on_counts=on_counts)
                pool.run(_run_unit, unit_jobs, on_done=on_unit_done, on_counts=on_counts)
    except BaseException:
        progress.close()  # the error is the last line
        peak.close()  # a run that ends, even stopped, leaves no figure: only one the kernel killed does
        raise
    progress.close(*counts, len(done), len(todo))  # the counts the summary has
    peak.close()
    return sorted(done, key=lambda result: (result.unit.task, result.unit.pass_id))
