"""A unit's record_info JSON beyond the original's keys (`filenames`, `num_batch`): what create adds to it."""

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
