"""The records a reader names, checked, with the settings and the SentencePiece model to read them by (dump's
library; the views of one example and the statistics are inspection.py's).

    select           SelectionConfig (PATHs, --task/--pass_id, overrides) -> Selection: the records files (or a
                     cache-backed save_dir's units), each checked against its record_info, their settings
                     (settings.records_settings), corpus_info.json checked against them, the SentencePiece model
    Selection.decoded  the selected examples, decoded, in order
    read_examples    every example of some PATHs as {feature: array} (the Python API's)

No TensorFlow here.
"""

import dataclasses
import glob
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from xlnet_data.common.config_types import check_field_types
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import provenance, record_info, record_reader, save_dir, settings, validation, vocab
from xlnet_data.dataformat.examples import generated
from xlnet_data.dataformat.inspection import DecodedExample, decode_example, is_backward_row
from xlnet_data.dataformat.settings import RecordsSettings


class InspectionError(UserError):
    """Records, settings or a corpus_info.json that cannot be found or read (one line for the user)."""


@dataclasses.dataclass(frozen=True)
class SelectionConfig:
    """What to read: PATHs (save_dirs, tfrecords/ folders, files, globs), which records of them, and what to
    read them by where the user knows better than the records (None: from the records)."""

    paths: tuple[str, ...]
    skip: int = 0
    limit: Optional[int] = None
    task: Optional[int] = None
    pass_id: Optional[int] = None
    split: Optional[str] = None  # train, dev (create --split): None, every split there
    verify_crc: bool = True
    sp_path: Optional[str] = None
    corpus_info: Optional[str] = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # settings.READ_KEYS -> value

    def __post_init__(self):
        check_field_types(self)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The selected records and how to read them; `warnings` are for the user (an unknown setting, a missing
    SentencePiece model)."""

    config: SelectionConfig
    files: list  # records files; a cache-backed save_dir: its units' record_info paths
    cache_units: Optional[list]  # generated.CacheUnit of a cache-backed save_dir, else None
    settings: RecordsSettings
    sp: Any  # a SentencePiece processor, or None: ids are shown
    sp_where: Optional[str]
    warnings: list

    @property
    def keep_accents(self) -> Optional[bool]:
        """How the records' text was made (create --keep_accents), None where no corpus_info.json says."""
        info = self.settings.corpus_info
        return info.value("keep_accents") if info else None

    def keep_accents_text(self) -> str:
        info = self.settings.corpus_info
        if info is None:
            return "unknown (no corpus_info.json)"
        absent = "" if info.keep_accents is not None else ", absent: the original accent removal"
        return f"{self.keep_accents} (corpus_info.json{absent})"

    def decoded(self, with_sp: bool = True) -> Iterator[tuple[int, str, int, DecodedExample]]:
        """(index over the selection, file, record index in it, decoded example) of the selected records, read
        lazily; with_sp: pieces and text too (else ids only, faster)."""
        values = self.settings.values
        vocab_size = self.sp.get_piece_size() if self.sp is not None else None
        for index, (path, record, offset, payload) in _selected_records(self.files, self.config, self.cache_units):
            features = record_reader.parse_example(payload, values.get("seq_len"), vocab_size, path, record, offset)
            reverse = is_backward_row(record, values.get("bsz_per_host"), values.get("num_core_per_host"),
                                      values.get("bi_data"))
            yield index, path, record, decode_example(features, self.sp if with_sp else None, values.get("reuse_len"),
                                                      reverse)

    def record_info_num_batch(self) -> Optional[int]:
        """The batches the record_infos list for the selected files (None where one is missing)."""
        if self.cache_units:
            return sum(unit.num_batch for unit in self.cache_units)
        return record_info_batches(self.files)


def select(config: SelectionConfig) -> Selection:
    """The records of `config`, checked (each file against its record_info, the units one run's, corpus_info.json
    against them), with their settings and SentencePiece model; InspectionError (or the check's error) in one
    line where they cannot be read."""
    files, candidates, cache_units = _find(config)
    model_sha256 = {validation.check_units_agree(folder)  # one run's units (data flags, SentencePiece model)
                    for folder in sorted({os.path.dirname(os.path.abspath(path)) for path in files})} - {None}
    found = settings.records_settings(files, candidates, config.overrides, corpus_info_path=config.corpus_info)
    if found.corpus_info:  # corpus_info.json against the record_infos beside the records and their first records
        validation.check_corpus_info(found.corpus_info_path, found.corpus_info,
                                     os.path.dirname(os.path.abspath(files[0])))
        for unit in cache_units or ():
            generated.check_corpus_info(found.corpus_info_path, found.corpus_info, unit)
    warnings = list(found.warnings)
    for folder in sorted({os.path.dirname(os.path.abspath(path)) for path in files}):  # a killed create's save_dir
        warnings += filter(None, [validation.missing_passes(folder, save_dir.record_info_paths(folder)),
                                  validation.missing_files(folder)])
    sp, sp_where = _sentencepiece(config.sp_path, found, model_sha256, warnings, files, cache_units)
    return Selection(config, files, cache_units, found, sp, sp_where, warnings)


def _find(config: SelectionConfig):
    """(files, where corpus_info.json may be, cache units or None) of the PATHs, --task/--pass_id applied;
    each records file checked against its record_info."""
    cache_units = _cache_units(config.paths, config.task, config.pass_id, config.split, config.sp_path)
    if cache_units:  # a cache-backed save_dir: its units' record_infos stand for the files
        return [unit.info_path for unit in cache_units], [save_dir.corpus_info_path(config.paths[0])], cache_units
    files, candidates = resolve_inputs(config.paths)
    files = [path for path in files if _of_unit(path, config.task, config.pass_id, config.split)]
    if not files:
        raise InspectionError(f"no records file of --task={config.task} --pass_id={config.pass_id} "
                              f"--split={config.split} in {list(config.paths)}")
    validation.check_record_files(files)  # each file holds the records its record_info lists
    return files, candidates, None


def _sentencepiece(sp_path, found: RecordsSettings, model_sha256, warnings, files, cache_units):
    """(the SentencePiece model, where it is) to decode ids by: --sp_path, else corpus_info.json's sp_path, else
    a cache-backed unit's (which check_cache found and checked); (None, None) with a warning where there is
    none. Either must be the model the records were made with, where their record_infos say which (sha256):
    another model of the same size would decode every id, into the wrong text."""
    if sp_path:
        sp = vocab.load_sentencepiece(sp_path)
        if model_sha256 and provenance.sha256_of(sp_path) not in model_sha256:
            raise InspectionError(f"--sp_path={sp_path} is not the SentencePiece model the records were made with "
                                  "(their record_info's made_from.model_sha256 is another): pass that model, or "
                                  "leave --sp_path out to use corpus_info.json's")
        return sp, sp_path
    info = found.corpus_info
    declared = info.sp_path if info else None
    where = resolve_sp_path(declared, found.corpus_info_path, info.input_glob if info else None)
    if not where and cache_units:
        where = cache_units[0].sp_path
    elif not where and files:  # the save_dir and its model moved: the unit's record_info knows where
        info_path = save_dir.record_info_of(files[0])
        where = record_info.recorded_model(info_path, save_dir.read_json(info_path)) if os.path.isfile(info_path) else ""
        where = where if where and os.path.isfile(where) else None
    if not where:
        why = f"corpus_info.json's sp_path {declared!r} not found" if declared else "no SentencePiece model known"
        warnings.append(f"{why}: showing ids, no word statistics (pass --sp_path)")
        return None, None
    try:
        sp = vocab.load_sentencepiece(where)
    except vocab.VocabError as error:
        warnings.append(f"{error}; showing ids (pass --sp_path)")
        return None, None
    if model_sha256 and provenance.sha256_of(where) not in model_sha256:
        raise InspectionError(f"{where} (corpus_info.json's sp_path) is not the SentencePiece model the records "
                              "were made with (it changed since): pass that model's --sp_path, or make the records "
                              "again")
    return sp, where


def _selected_records(files, config: SelectionConfig, cache_units=None):
    """(global index, (file, record index, offset, payload)) of the selected records, read lazily (made from the
    token cache for `cache_units`: `files` are then their record_info paths, offsets None)."""
    if cache_units:
        every = ((unit.info_path, index, None, payload) for unit in cache_units
                 for index, payload in enumerate(generated.unit_payloads(unit)))
    else:
        every = ((path, *record) for path in files for record in record_reader.read_records(path, config.verify_crc))
    stop = None if config.limit is None else config.skip + config.limit
    return itertools.islice(enumerate(every), config.skip, stop)


def _of_unit(path, task, pass_id, split=None):
    """Whether a records or record_info file belongs to the --task / --pass_id / --split selection."""
    parsed = save_dir.parse_name(path)
    if task is None and pass_id is None and split is None:
        return True
    return (parsed is not None and task in (None, parsed.task) and pass_id in (None, parsed.pass_id)
            and split in (None, parsed.split))


def _cache_units(paths, task, pass_id, split=None, sp_path=None):
    """The selected units of a cache-backed save_dir given as the only PATH (sp_path: where its SentencePiece
    model is now, None: where create recorded it), else None."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        return None
    found = generated.find_cache_units(paths[0], sp_path)
    if not found:
        return None
    chosen = [unit for unit in found if _of_unit(unit.info_path, task, pass_id, split)]
    if not chosen:
        raise InspectionError(f"no unit of --task={task} --pass_id={pass_id} --split={split} in {paths[0]}")
    for unit in chosen:  # a missing or stale cache: one line
        generated.check_cache(unit)
    return chosen


# ----- where the records and their corpus_info.json are -------------------------------------------------


def resolve_inputs(paths):
    """Expands PATH arguments (save_dir, tfrecords/ folder, files, globs) into record files.

    Returns (files, corpus_info_candidates): the files in order, without duplicates, and
    where to look for corpus_info.json (the save_dir, or the parent of a tfrecords/ folder).
    """
    if not paths:
        raise InspectionError("give one or more tfrecords files, a glob or a save_dir (see --help)")
    files, info_dirs = [], []
    for path in paths:
        if os.path.isdir(path):
            folder = save_dir.tfrecords_dir(path)
            found = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                           if save_dir.is_record_file(n) and os.path.isfile(os.path.join(folder, n)))
            if not found and generated.find_cache_units(path):
                raise InspectionError(f"{path} is cache-backed (create --nowrite_records: its records are made from "
                                      "its token cache): give it as the only path, alone")
            if not found:
                raise InspectionError(f"no tfrecords files in {folder}")
            files.extend(found)
            info_dirs.append(path)
        elif os.path.isfile(path):
            files.append(path)
        elif glob.has_magic(path):
            found = sorted(p for p in glob.glob(path) if os.path.isfile(p))
            if not found:
                raise InspectionError(f"no file matches {path}")
            files.extend(found)
        else:
            raise InspectionError(f"no such file or directory: {path}")
    for path in files:
        folder = os.path.dirname(os.path.abspath(path))
        info_dirs.append(folder)
        if os.path.basename(folder) == save_dir.TFRECORDS:
            info_dirs.append(os.path.dirname(folder))
    unique = {}
    for path in files:
        unique.setdefault(os.path.abspath(path), path)
    candidates = dict.fromkeys(save_dir.corpus_info_path(folder) for folder in info_dirs)
    return list(unique.values()), list(candidates)



def read_examples(*paths, verify_crc=True, sp_path=None):
    """Every example of the records at `paths` (save_dirs, tfrecords/ folders, files or globs), in order,
    as {feature name: int64 array}; a damaged file raises RecordError naming the file and record. A
    cache-backed save_dir (create --nowrite_records) gives the records it stands for, made from its token
    cache (its SentencePiece model at `sp_path`, if it moved)."""
    cache_units = _cache_units(list(paths), None, None, sp_path=sp_path)
    for unit in cache_units or ():
        for index, payload in enumerate(generated.unit_payloads(unit)):
            yield record_reader.parse_example(payload, unit.settings.seq_len, None, unit.info_path, index)
    if cache_units:
        return
    files, _ = resolve_inputs(list(paths))
    for path in files:
        for _, features in record_reader.read_numbered_examples(path, verify_crc=verify_crc):
            yield features



def record_info_batches(files):
    """Sum of num_batch in the record_info-*.json written beside each records file, or None
    when one of them is missing or unreadable."""
    total = 0
    for path in files:
        try:
            total += int(save_dir.read_json(save_dir.record_info_of(path))["num_batch"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total



def resolve_sp_path(sp_path, corpus_info_path=None, input_glob=None, cwd=None):
    """Where a relative sp_path from corpus_info.json is, or None.

    The original wrote the path relative to the directory it ran in. Tried in order: the
    directory where `input_glob` (also relative to it) matches files, the current
    directory, the save_dir's parent, the save_dir, then the save_dir's further ancestors.
    """
    if not sp_path:
        return None
    if os.path.isabs(sp_path):
        return sp_path if os.path.isfile(sp_path) else None
    cwd = cwd or os.getcwd()
    bases = []
    if corpus_info_path:
        save_dir = os.path.dirname(os.path.abspath(corpus_info_path))
        ancestors = [save_dir] + [str(p) for p in Path(save_dir).parents]
        if input_glob and not os.path.isabs(input_glob):
            bases.extend(a for a in ancestors if glob.glob(os.path.join(a, input_glob)))
        bases.append(cwd)
        bases.extend(ancestors[1:2] + ancestors[:1] + ancestors[2:])
    else:
        bases.append(cwd)
    for base in bases:
        candidate = os.path.normpath(os.path.join(base, sp_path))
        if os.path.isfile(candidate):
            return candidate
    return None
