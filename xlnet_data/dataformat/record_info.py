"""A unit's record_info JSON beyond the original's keys (`filenames`, `num_batch`): what create adds to it."""

import dataclasses
from typing import Optional

from xlnet_data.dataformat.corpus_info import ABSENT_MEANS

COUNTS = ("files", "lines", "tokens", "records", "num_batch", "dropped_tokens", "invalid_utf8_lines", "skipped_files")
COUNTS_KEY = "create_counts"  # record_info's key for a unit's COUNTS, read back by runners without metrics
TOKEN_CACHE_KEY = "token_cache"  # record_info's key of a cache-backed unit (no records): which cache makes them
INPUT_COUNTS_KEY = "input_counts"
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
RUN_ONLY = ("save_dir", "pass_id", "num_passes", "task", "strict", "allow_binary", "write_records", "encoder")


def create_settings(config) -> dict:
    """SETTINGS_KEY's value for a config (create's CreateConfig, a dataclass): every flag but RUN_ONLY's, in the
    config's field order. Written by create; read back by its re-runs (to recognise a unit), by validation (units
    of one run) and by examples.generated (a cache-backed unit's records made again)."""
    settings = dataclasses.asdict(config)
    for run_only in RUN_ONLY:
        settings.pop(run_only)
    return settings


def created_num_core(settings: dict) -> Optional[int]:
    """The cores a SETTINGS_KEY value's rows were laid out for (the original forces 1 without a TPU); None where
    it does not say."""
    if "num_core_per_host" not in settings:
        return None
    return settings["num_core_per_host"] if settings.get("use_tpu", True) else 1


def recorded_create_settings(info: dict):
    """A record_info's SETTINGS_KEY value, with a setting added since it was written taking its old meaning
    (ABSENT_MEANS); None, or what is there, where it is not a dict."""
    settings = info.get(SETTINGS_KEY)
    return {**ABSENT_MEANS, **settings} if isinstance(settings, dict) else settings
