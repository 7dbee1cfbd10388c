"""A unit's record_info JSON beyond the original's keys (`filenames`, `num_batch`): what create adds to it."""

import dataclasses
import os
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.dataformat.corpus_info import ABSENT_MEANS

COUNTS = ("files", "lines", "tokens", "records", "num_batch", "dropped_tokens", "invalid_utf8_lines", "skipped_files")
COUNTS_KEY = "create_counts"  # record_info's key for a unit's COUNTS, read back by runners without metrics
TOKEN_CACHE_KEY = "token_cache"  # record_info's key of a cache-backed unit (no records): which cache makes them
# A unit's SentencePiece model relative to the save_dir (create_settings' sp_path is absolute, and is compared by
# re-runs): the model is found again where the save_dir and the model moved together (recorded_model).
SP_PATH_KEY = "sp_path_from_save_dir"
INPUT_COUNTS_KEY = "input_counts"
# record_info's key: the --num_passes of the create run that wrote the unit, the passes 0..N-1 it was to make of
# its task (absent with --pass_id alone): a reader tells a save_dir of a killed run from one of fewer passes.
PASSES_KEY = "create_num_passes"
INPUT_COUNTS = ("chars", "tokens", "unk", "marks", "arabic_marks")  # of an input file: see input_counts


def input_counts(shards):
    """{path: {INPUT_COUNTS}} of the files (token cache index entries) with <unk> ids or characters that lost a
    mark to the accent removal (`marks`; Arabic harakat apart, `arabic_marks`); the others need no word.
    Per file, not per unit: the passes of a task share its files."""
    return {shard["path"]: {key: int(shard.get(key, 0)) for key in INPUT_COUNTS} for shard in shards
            if shard.get("unk") or shard.get("marks") or shard.get("arabic_marks")}


def is_cache_backed(info: dict) -> bool:
    """Whether a record_info's unit has no records file: its records are made from a token cache."""
    return TOKEN_CACHE_KEY in info


SETTINGS_KEY = "create_settings"  # record_info's key: the data flags its unit was made with
# create's flags that do not decide a unit's records (where they go, which units run, how input is read), left
# out of SETTINGS_KEY: a re-run with other values of these reuses the complete units.
RUN_ONLY = ("save_dir", "pass_id", "num_passes", "task", "strict", "allow_binary", "write_records",
            "allow_accents_mismatch", "encoder")


def create_settings(config) -> dict:
    """SETTINGS_KEY's value for a config (create's CreateConfig, a dataclass): every flag but RUN_ONLY's, in the
    config's field order. Written by create; read back by its re-runs (to recognise a unit), by validation (units
    of one run) and by examples.generated (a cache-backed unit's records made again)."""
    settings = dataclasses.asdict(config)
    for run_only in RUN_ONLY:
        settings.pop(run_only)
    return settings


# The settings of SETTINGS_KEY that belong to one split (create --split=dev's units read other files into the same
# save_dir): units of two splits must agree on all the others.
PER_SPLIT = ("split", "input_glob")


def shared_settings(settings):
    """A SETTINGS_KEY value without PER_SPLIT's keys: what every split of a save_dir shares (what is not a dict
    is returned as it is)."""
    if not isinstance(settings, dict):
        return settings
    return {key: value for key, value in settings.items() if key not in PER_SPLIT}


def created_num_core(settings: dict) -> Optional[int]:
    """The cores a SETTINGS_KEY value's rows were laid out for (the original forces 1 without a TPU); None where
    it does not say."""
    if "num_core_per_host" not in settings:
        return None
    return settings["num_core_per_host"] if settings.get("use_tpu", True) else 1


def recorded_model(info_path: str, info: dict) -> str:
    """Where a unit's SentencePiece model is by its record_info (`info`, read from save_dir/tfrecords/`info_path`):
    create's sp_path, else, where that is gone, SP_PATH_KEY's path from the save_dir, which still leads to it
    when the save_dir and its model moved (or are mounted elsewhere) together; "" where it names none."""
    settings = info.get(SETTINGS_KEY)
    recorded = settings.get("sp_path", "") if isinstance(settings, dict) else ""
    from_save_dir = info.get(SP_PATH_KEY)
    if isinstance(from_save_dir, str) and not fileio.exists(recorded):
        root = os.path.dirname(os.path.dirname(os.path.abspath(info_path)))
        moved = os.path.normpath(os.path.join(root, from_save_dir))
        if fileio.exists(moved):
            return moved
    return recorded


def recorded_create_settings(info: dict):
    """A record_info's SETTINGS_KEY value, with a setting added since it was written taking its old meaning
    (ABSENT_MEANS); None, or what is there, where it is not a dict."""
    settings = info.get(SETTINGS_KEY)
    return {**ABSENT_MEANS, **settings} if isinstance(settings, dict) else settings
