"""Checks that the parts of a save_dir agree, for every reader (train_gpu, the input pipeline, dump).

    check_corpus_info   corpus_info.json against the record_info JSONs (their names and create_settings)
                        and against the first records (their length, their ids against vocab_size)
    check_unit          a record_info's num_batch x bsz_per_host against the records its files hold
    check_record_files  check_unit for every records file that has a record_info beside it
    check_units_agree   the record_infos of a folder were made by one run (data flags, SentencePiece model)
    missing_passes      the passes a folder lacks: of --num_passes, or of the create run that wrote it (killed)

Each contradiction is a SaveDirError (or a RecordError naming the file, the record and the byte)
whose one line names the file and the field. The checks are cheap (the record frames are walked,
not read; only the first batch of a file is parsed), so they run before any training; a record
damaged further in is found by the CRC check of whoever reads it.
"""

import collections
import dataclasses
import os
from typing import Optional

from xlnet_data.dataformat import provenance, record_info, save_dir
from xlnet_data.dataformat.corpus_info import CorpusInfo, recorded
from xlnet_data.dataformat.record_reader import RecordError, count_records, parse_example, read_records
from xlnet_data.dataformat.save_dir import SaveDirError

# corpus_info.json's fields that a record_info's file name encodes too.
_NAMED_FIELDS = tuple(field.name for field in dataclasses.fields(save_dir.RecordSettings))


def _disagreements(info: CorpusInfo, info_path: str, unit: dict) -> list[str]:
    """`key=value` of the record_info `info_path` (its name, its create_settings) where corpus_info `info` differs."""
    found = []
    parsed = save_dir.parse_name(info_path)
    if parsed is not None:
        for key in _NAMED_FIELDS:
            theirs = getattr(parsed.settings, key)
            if getattr(info, key) is not None and theirs is not None and getattr(info, key) != theirs:
                found.append(f"{key}={theirs} in its name")
    created = unit.get("create_settings")
    if isinstance(created, dict):
        cores = record_info.created_num_core(created)
        if info.num_core_per_host is not None and cores is not None and info.num_core_per_host != cores:
            found.append(f"num_core_per_host={cores} in its create_settings")
        if info.use_eod is not None and "use_eod" in created and info.use_eod != created["use_eod"]:
            found.append(f"use_eod={created['use_eod']} in its create_settings")
        if recorded(info, "keep_accents") != recorded(created, "keep_accents"):
            found.append(f"keep_accents={recorded(created, 'keep_accents')} in its create_settings")
    return found


def check_corpus_info(corpus_info_path: str, info: CorpusInfo, tfrecords_dir: str, split: str = "train") -> None:
    """corpus_info.json against the record_infos of `split` in tfrecords_dir and their first records.

    A folder may hold records of several settings (their names differ); corpus_info.json must agree with
    at least one record_info, and the first batch of that unit's records must have seq_len positions and
    ids below vocab_size.
    """
    info_paths = [path for path in save_dir.record_info_paths(tfrecords_dir)
                  if getattr(save_dir.parse_name(path), "split", None) in (None, split)]
    if not info_paths:
        return
    closest = None
    for info_path in info_paths:
        unit = save_dir.read_json(info_path)
        problems = _disagreements(info, info_path, unit)
        if not problems:
            _check_first_records(corpus_info_path, info, info_path, unit)
            return
        if closest is None or len(problems) < len(closest[1]):
            closest = (info_path, problems)
    info_path, problems = closest
    first = problems[0].split("=")[0]
    raise SaveDirError(f"{corpus_info_path}: {first}={recorded(info, first)} contradicts {info_path} "
                       f"({'; '.join(problems)}), "
                       f"and no record_info in {tfrecords_dir} agrees with it; re-create the save_dir, or fix "
                       f"corpus_info.json")


def _check_first_records(corpus_info_path: str, info: CorpusInfo, info_path: str, unit: dict) -> None:
    """The first batch of the unit's first file has corpus_info's seq_len positions and ids below its vocab_size."""
    files = save_dir.record_files(info_path, unit)
    if not files:
        return
    seq_len, vocab_size = info.seq_len, info.vocab_size
    for index, offset, payload in read_records(files[0]):
        features = parse_example(payload, None, None, files[0], index, offset)
        where = f"{files[0]}: record {index} (byte {offset})"
        if seq_len is not None and len(features["input"]) != seq_len:
            raise SaveDirError(f"{corpus_info_path}: seq_len={seq_len} contradicts the records: {where} has "
                               f"{len(features['input'])} positions; re-create the save_dir, or fix corpus_info.json")
        largest = int(max(features["input"].max(), features["target"].max()))
        if vocab_size is not None and largest >= vocab_size:
            raise SaveDirError(f"{corpus_info_path}: vocab_size={vocab_size} contradicts the records: {where} holds "
                               f"id {largest}; re-create the save_dir, or fix corpus_info.json")
        if index + 1 >= (info.bsz_per_host or 1):
            break


def read_num_batch(info_path: str, unit: dict) -> int:
    """A record_info's num_batch; SaveDirError names the file when it is missing or not a count."""
    value = unit.get("num_batch")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SaveDirError(f"{info_path}: num_batch={value!r} is not a count of batches; re-create the unit")
    return value


def check_unit(info_path: str, num_batch: int, files: list[str], bsz_per_host: Optional[int] = None) -> None:
    """The files of a record_info hold exactly num_batch x bsz_per_host records (bsz_per_host: from the
    record_info's name when not given); RecordError names the file, the record and the byte where not."""
    if bsz_per_host is None:
        parsed = save_dir.parse_name(info_path)
        if parsed is None:
            return
        bsz_per_host = parsed.settings.bsz_per_host
    expected = num_batch * bsz_per_host
    lists = f"{info_path} lists num_batch {num_batch} x bsz_per_host {bsz_per_host} = {expected}"
    total = 0
    for path in files:
        count, end = count_records(path)
        if total + count > expected:
            raise RecordError(path, expected - total, f"a record more than {lists}; re-create the unit",
                              _offset_of(path, expected - total))
        total += count
    if total < expected:
        raise RecordError(files[-1], count, f"the file ends here, after {total} records, but {lists}: it was cut "
                          "short; re-create the unit", end)


def _offset_of(path: str, index: int) -> int:
    """The byte where record `index` of a file starts."""
    return next(offset for i, offset, _ in read_records(path, skip_data=True) if i == index)


def check_record_files(paths: list[str]) -> None:
    """check_unit for every records file among `paths` that has a record_info beside it (files without one,
    e.g. renamed copies, are not checked)."""
    checked = set()
    for path in paths:
        info_path = save_dir.record_info_of(path)
        if info_path in checked or not os.path.isfile(info_path):
            continue
        checked.add(info_path)
        unit = save_dir.read_json(info_path)
        check_unit(info_path, read_num_batch(info_path, unit), save_dir.record_files(info_path, unit))


def missing_files(tfrecords_dir: str) -> Optional[str]:
    """One line when a record_info of the folder lists a records file that is not there (deleted, moved), else None:
    the folder's other files then read as if they were the whole (train_gpu refuses such a unit: check_unit)."""
    for info_path in save_dir.record_info_paths(tfrecords_dir):
        info = save_dir.read_json(info_path)
        if record_info.is_cache_backed(info):
            continue
        try:
            save_dir.record_files(info_path, info)
        except FileNotFoundError as err:
            return f"{err}: this unit's records are gone, the others are read without them; re-create it"
    return None


def check_units_agree(tfrecords_dir: str) -> Optional[str]:
    """Every record_info of a tfrecords/ folder names the same data flags (`create_settings`; units of another
    split, such as create --split=dev's, may differ in record_info.PER_SPLIT's) and the same
    SentencePiece model (`made_from`'s model_sha256, see provenance.py): units of two runs of create
    would be read as one corpus. SaveDirError names two that differ. Returns the model's sha256, or None
    where no record_info records it (an older create)."""
    first: dict = {}
    for info_path in save_dir.record_info_paths(tfrecords_dir):
        unit = save_dir.read_json(info_path)
        settings = record_info.recorded_create_settings(unit)
        # A split's units share all their settings; another split's (create --split=dev) all but PER_SPLIT's.
        split = getattr(save_dir.parse_name(info_path), "split", None)
        facts = {record_info.SETTINGS_KEY: record_info.shared_settings(settings),
                 ("split", split): settings,
                 "model_sha256": (unit.get(provenance.MADE_FROM) or {}).get("model_sha256")}
        for key, value in facts.items():
            if value is None:
                continue
            if key not in first:
                first[key] = (value, info_path)
                continue
            theirs, where = first[key]
            if value != theirs:
                if key != "model_sha256":
                    what = "; ".join(f"{name}={theirs.get(name)!r} there, {value.get(name)!r} here"
                                     for name in sorted(set(theirs) | set(value)) if theirs.get(name) != value.get(name))
                else:
                    what = "another SentencePiece model (sha256 of sp_path)"
                raise SaveDirError(f"{info_path} and {where} were made by different runs of create ({what}); a "
                                   "save_dir must hold one run's units: make it again with create --overwrite")
    return first.get("model_sha256", (None,))[0]


def missing_passes(tfrecords_dir: str, info_paths: list[str], num_passes: Optional[int] = None) -> Optional[str]:
    """What the units (`info_paths`, of one run's settings) of a folder lack of passes 0..num_passes-1, or
    without num_passes of the passes their create run was to make (record_info.PASSES_KEY: a killed run), in
    words with the fix; None when every task that has units has them all (a task too small for one batch has
    none, and another --task may not have run: tasks without units are not counted)."""
    # Each split is its own create run (train --num_passes=2, then --split=dev --num_passes=1): its own plan.
    passes, planned = collections.defaultdict(set), collections.Counter()
    for path in info_paths:
        name = save_dir.parse_name(path)
        passes[name.split, name.task].add(name.pass_id)
        recorded_passes = save_dir.read_json(path).get(record_info.PASSES_KEY)
        planned[name.split] = max(planned[name.split], recorded_passes if isinstance(recorded_passes, int) else 0)
    lacking = {(split, task): sorted(set(range(num_passes or planned[split])) - found)
               for (split, task), found in sorted(passes.items())}
    lacking = {unit: missing for unit, missing in lacking.items() if missing}
    if not lacking:
        return None
    (split, task), missing = next(iter(lacking.items()))
    planned = planned[split]
    complete = min(missing[0] for (their_split, _), missing in lacking.items() if their_split == split)
    of_split = "" if split == "train" else f" of split {split}"
    lacks = (f"task {task}{of_split} lacks pass(es) {', '.join(map(str, missing[:5]))}"
             f"{' ...' if len(missing) > 5 else ''}")
    complete_ones = "" if not complete else (f"; {f'passes 0-{complete - 1} are' if complete > 1 else 'pass 0 is'} "
                                             f"complete (train_gpu --num_passes={complete} reads only those)")
    if num_passes:
        return (f"--num_passes={num_passes}, but {tfrecords_dir} holds fewer passes ({lacks}): make them with create "
                f"--num_passes={num_passes} (it adds the missing units){complete_ones}")
    return (f"{tfrecords_dir} is incomplete: the create run that wrote it was to make {planned} passes "
            f"(--num_passes={planned}) and {lacks} (killed, or still running?): run that create command again to "
            f"finish it (complete units are kept){complete_ones}")
