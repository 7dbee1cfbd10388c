"""A whole `create` run as one call: check and plan, write corpus_info.json, run the units, sum them up."""

import contextlib
import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Optional

from xlnet_data.common import fileio, run_lock
from xlnet_data.dataformat import record_info, save_dir, save_dir_lock
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples import generated
from xlnet_data.dataformat.examples.loop import Unit
from xlnet_data.dataformat.vocab import load_sentencepiece
from xlnet_data.datagen import resources
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import CreateError, make_plan, prepare_save_dir
from xlnet_data.datagen.units import UnitResult


@dataclasses.dataclass(frozen=True)
class CreateSummary:
    """What a run wrote, over its units (units skipped as complete already are not counted)."""

    units: tuple[UnitResult, ...]
    replaced_records: tuple[int, int] = (0, 0)  # (files, bytes) of records removed: the token cache stands for them

    @property
    def written(self) -> list[UnitResult]:
        return [r for r in self.units if not r.skipped]

    def total(self, field: str, written_only: bool = True) -> int:
        return sum(getattr(r, field) for r in (self.written if written_only else self.units))

    @property
    def input_counts(self) -> dict:
        """record_info.input_counts of every file the run read, each once (the passes of a task share its files)."""
        merged = {}
        for result in self.units:
            merged.update(result.input_counts)
        return merged

    def per_input(self, field: str) -> int:
        """A count about the input files (invalid_utf8_lines, skipped_files), over the tasks: every pass of a
        task reads the same files, so each task counts once."""
        return sum({r.unit.task: getattr(r, field) for r in self.units}.values())

    def line(self, seconds: float) -> str:
        counts = self.input_counts.values()
        unk, marks, arabic = (sum(c[key] for c in counts) for key in ("unk", "marks", "arabic_marks"))
        lost = sum(1 for c in counts if c["marks"] or c["arabic_marks"])
        stripped = (f"{marks} letters lost a mark to the accent removal (and {arabic} Arabic harakat) in {lost} "
                    "file(s), " if lost else "")
        return (f"done: {len(self.written)} unit(s), {self.total('tokens')} tokens ({self.per_input('tokens')} "
                f"encoded, once for all passes), {self.total('records')} records "
                f"in {self.total('num_batch')} batches, {self.total('dropped_tokens')} tail tokens dropped, "
                f"{self.per_input('invalid_utf8_lines')} invalid UTF-8 lines replaced, "
                f"{self.per_input('skipped_files')} files without tokens skipped, {unk} <unk> read, {stripped}"
                f"{self._replaced_text()}{seconds:.1f} s")

    def _replaced_text(self) -> str:
        files, nbytes = self.replaced_records
        return (f"{files} records file(s) of an earlier run removed ({nbytes / 1e6:.1f} MB freed: the token cache "
                "makes the same records), " if files else "")

    def marks_warning(self) -> Optional[str]:
        """One line when the accent removal (keep_accents off) changed at least MARKS_WARNING_SHARE of a file's
        characters (Arabic harakat apart, as they are optional), naming the worst file; else None."""
        shares = {path: c["marks"] / c["chars"] for path, c in self.input_counts.items() if c["marks"] and c["chars"]}
        over = [path for path, share in shares.items() if share >= MARKS_WARNING_SHARE]
        if not over:
            return None
        worst = max(over, key=shares.get)
        others = f" (and {len(over) - 1} more file(s) over {100 * MARKS_WARNING_SHARE:g}%)" if len(over) > 1 else ""
        return (f"the original's accent removal changed {100 * shares[worst]:.1f}% of the characters of {worst}"
                f"{others}: {self.input_counts[worst]['marks']} letters lost a mark (tone marks, viramas, kana "
                "voicing, accents...); pass --keep_accents to keep them (to spm_train too)")

    def unk_warning(self) -> Optional[str]:
        """One line when at least UNK_WARNING_SHARE of the tokens read are <unk>, naming the worst file; else None
        (a model that has no spm_train record beside it is not checked against --keep_accents otherwise)."""
        counts = self.input_counts  # only the files with <unk> (or marks lost)
        tokens, unk = self.per_input("tokens"), sum(c["unk"] for c in counts.values())
        if not tokens or unk < UNK_WARNING_SHARE * tokens:
            return None
        worst = max(counts, key=lambda path: counts[path]["unk"] / max(1, counts[path]["tokens"]))
        return (f"{100 * unk / tokens:.1f}% of the tokens read are <unk> ({worst}: "
                f"{100 * counts[worst]['unk'] / max(1, counts[worst]['tokens']):.1f}%): the SentencePiece model does "
                "not know those characters; is it trained on text with the accents and marks removed while create "
                "keeps them (--keep_accents), or on other text? spm_train one on this text, with create's "
                "--keep_accents")


# English with XLNet's model and a model trained on its own text read 0.00-0.02% <unk>; a model trained without
# --keep_accents on Hindi text that create keeps the marks of, 10%.
UNK_WARNING_SHARE = 0.01

# The share of a file's characters that losing a mark makes a warning: English text with names and loanwords
# (café, José) stays far below it (the Austen sample: 0%), Spanish is 3.2% (sample_corpus's Reina-Valera),
# and the scripts whose marks are letters (Thai, Hindi, Japanese, Vietnamese, Greek...) 3-20%
# (docs/languages.md).
MARKS_WARNING_SHARE = 0.005


def create_records(config: CreateConfig, *, overwrite: bool = False, num_workers: Optional[int] = None,
                   beam_args: Optional[Sequence[str]] = None, keep_cache: bool = False) -> CreateSummary:
    """Makes the records of `config` (a validated CreateConfig) in config.save_dir; returns the summary.
    Local paths in it are made absolute first (corpus_info.json records them so).

    The save_dir is locked for the run (a second run on it raises run_lock.FolderBusy) and the stale
    temporary files of killed runs are removed. Units already complete are skipped unless `overwrite`; the
    token cache (each task encoded once for all its passes) is deleted at the end unless `keep_cache`.
    With write_records off, the records files of units now cache-backed (an earlier run's) are removed at the
    end (CreateSummary.replaced_records).
    Runs on local worker processes (`num_workers`, default: the CPU count), or as an Apache Beam
    pipeline with options `beam_args` (beam_runner.pipeline_args makes and checks them, e.g.
    ["--runner=DirectRunner"]). Raises
    ConfigError, CreateError, InputError or VocabError with a one-line message, before anything is
    written where it can.
    """
    # Absolute before the plan lists the files: a Beam or cluster worker has another working directory.
    config = config.with_absolute_paths()
    run_lock.refuse_if_busy(config.save_dir, save_dir_lock.SAVE_DIR_LOCK)  # first: what a busy save_dir holds is in flux
    # A run that removes records (--overwrite; --nowrite_records replaces them) waits for no reader: a train_gpu or
    # dump reading the save_dir refuses it, and while it runs none starts.
    removes = overwrite or not config.write_records
    if removes:
        run_lock.refuse_if_busy(config.save_dir, save_dir_lock.READERS_LOCK)
    fit = _fit_to_machine(config, _check_before_locking(config, overwrite, keep_cache), num_workers) \
        if beam_args is None else None  # (plan, layout, machine)
    with run_lock.hold(config.save_dir, save_dir_lock.SAVE_DIR_LOCK), \
            (run_lock.hold(config.save_dir, save_dir_lock.READERS_LOCK) if removes else contextlib.nullcontext()):
        plan = make_plan(config, overwrite, keep_cache)  # again: another run may have ended meanwhile
        if fit is not None:
            plan = resources.with_tasks_of(plan, fit[0])
        save_dir_lock.remove_stale_temporaries(config.save_dir)
        save_dir_lock.tell_last_peak(config.save_dir)
        prepare_save_dir(config, plan, overwrite)
        try:
            if beam_args is not None:
                from xlnet_data.datagen.beam_runner import run_beam
                results = run_beam(config, plan, beam_args)
            else:
                from xlnet_data.datagen.local_runner import run_local
                results = run_local(config, plan, num_workers=num_workers, on_encoded=_correction(fit))
        except BaseException:
            # The workers are gone (a signal, a failed unit): under the lock every temporary file of a
            # save_dir output is this run's, even one whose worker died before it could remove it.
            save_dir_lock.remove_stale_temporaries(config.save_dir)
            raise
        # Each task's encoded files, read by all its passes (see datagen/encode.py); kept while cache-backed units
        # (--write_records=false) of the save_dir need them.
        if not keep_cache and config.write_records and not generated.find_cache_units(config.save_dir):
            save_dir.remove_token_caches(config.save_dir, config.tasks)
        if results and not any(r.tokens for r in results):
            _remove_corpus_info_without_units(config.save_dir)
            raise CreateError(f"the corpus is empty: the files of --input_glob={config.input_glob} hold no token "
                              "(only blank lines, without --use_eod); nothing written")
        replaced = (0, 0) if config.write_records else _remove_replaced_records(config)
        summary = CreateSummary(tuple(results), replaced)
        _record_input_counts(config.save_dir, summary.input_counts)
    return summary


def _record_input_counts(save_dir_path, counts):
    """Adds the run's per-file counts (<unk>, letters that lost a mark) to corpus_info.json's `input_counts`,
    those of earlier runs on other files (other tasks) kept."""
    path = save_dir.corpus_info_path(save_dir_path)
    if not counts or not fileio.exists(path):
        return
    info = CorpusInfo.read(path)
    earlier = info.extra.get("input_counts", {})
    dataclasses.replace(info, extra={**info.extra, "input_counts": {**earlier, **counts}}).write(path)


def _remove_replaced_records(config):
    """--nowrite_records on a save_dir of records: the records file of each unit whose record_info is cache-backed
    now is removed, since nothing reads it any more (run_unit wrote that record_info, atomically, after its token
    cache was complete: a run that failed before leaves the old record_info and its records). Returns (files,
    bytes) removed."""
    files = nbytes = 0
    for unit in (Unit(task, pass_id) for task in config.tasks for pass_id in config.pass_ids):
        record_path, info_path = config.unit_paths(unit)
        if not fileio.exists(info_path) or not record_info.is_cache_backed(save_dir.read_json(info_path)):
            continue
        for path in (record_path, record_path + ".gz"):
            if fileio.exists(path):
                nbytes += fileio.size(path)
                fileio.remove(path)
                files += 1
    return files, nbytes


def _remove_corpus_info_without_units(save_dir_path):
    """An empty corpus leaves no corpus_info.json that names no unit (a reader would take it for a save_dir)."""
    info_path = save_dir.corpus_info_path(save_dir_path)
    if fileio.exists(info_path) and not save_dir.record_info_paths(os.path.join(save_dir_path, save_dir.TFRECORDS)):
        fileio.remove(info_path)


def _fit_to_machine(config, plan, num_workers):
    """The local run's memory and disk, estimated before anything is encoded (datagen/resources.py): one line
    saying so, or CreateError, one line naming the smallest change that fits, before the save_dir is made. Returns
    (the resources.ResourcePlan, its Layout, the Machine), or None where there is no plan to make."""
    machine = resources.machine_of(config.save_dir)
    if machine is None or not plan.units:
        return None
    from xlnet_data.datagen.local_runner import worker_count
    fit, layout = resources.measured_plan(config, plan, worker_count(plan, num_workers),
                                          load_sentencepiece(config.sp_path), machine)
    why = resources.refusal(fit, layout, machine)
    if why:
        raise CreateError(f"{why}; nothing written")
    logging.getLogger("xlnet_data").info("%s", fit.line(machine))
    return fit, layout, machine


def _correction(fit):
    """run_local's on_encoded: after the first task this run encodes, the plan again with its tokens counted
    (resources.corrected), one line; CreateError where it no longer fits, the caches encoded so far kept."""
    if fit is None:
        return None
    corrected = []

    def on_encoded(result):
        if corrected or not result.encoded:
            return
        line, why = resources.corrected(*fit, result.task, result.tokens)
        corrected.append(line)
        logging.getLogger("xlnet_data").info("%s", line)
        if why:
            raise CreateError(f"{why} (corrected once task {result.task} was encoded); the token caches encoded so "
                              "far are kept: the same command, so changed, goes on from them")
    return on_encoded


def _check_before_locking(config, overwrite, keep_cache):
    """make_plan's checks (it writes nothing) before the lock makes the save_dir, so that a bad flag or
    input leaves no folder behind; quietly, since the plan that runs is made again under the lock. Returns the
    plan."""
    log = logging.getLogger("xlnet_data")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return make_plan(config, overwrite, keep_cache)
    finally:
        log.setLevel(level)
