"""What each unit of `create` was made from, kept in its record_info, and the checks a re-run makes with it.

A record_info holds, beside the original's keys, `create_settings` (the data flags, see
record_info.create_settings) and `made_from`:

    {"model_sha256": the SentencePiece model's sha256,
     "files": [{"path", "size", "mtime_ns", "sha256" (files up to HASH_LIMIT_BYTES)}, ...]  (the task's files)
     "record_bytes": the size of the unit's tfrecords file}

A re-run of `create` compares every unit in the save_dir with the inputs as they are now (make_plan, before
anything is written) and refuses, in one line naming the file, a save_dir whose units were made from another
model or from files that changed, were added or were removed since: redoing only the changed task would
leave the other tasks' units made from the old corpus (their file lists shift when a file comes or goes),
and a changed file is as often a mistake (a file still being written, the wrong folder mounted) as an
intended update; `--overwrite` makes the save_dir again from the inputs as they are. A unit whose records
file is not record_bytes long (cut short, or rewritten) is redone, with a warning.
"""

import functools
import hashlib
import json
import logging
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.dataformat import save_dir

log = logging.getLogger("xlnet_data")

MADE_FROM = "made_from"  # record_info's key
HASH_LIMIT_BYTES = 1 << 20  # files up to this size are hashed too (cheap); larger ones by size and mtime only


def sha256_of(path) -> str:
    """A file's sha256 (hex), computed once per (path, size, mtime): a run checks its SentencePiece model for
    every unit (the plan, each cache-backed unit's record_info and its reader)."""
    return _sha256(path, fileio.size(path), fileio.modified_ns(path))


@functools.lru_cache(maxsize=1 << 10)
def _sha256(path, size, mtime_ns) -> str:
    digest = hashlib.sha256()
    with fileio.open_read(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1 << 18)
def _identity(path, size, mtime_ns):
    """Cached per (path, size, mtime): make_plan runs twice per run (before and under the save_dir lock)."""
    identity = {"path": path, "size": size, "mtime_ns": mtime_ns}
    if size <= HASH_LIMIT_BYTES:
        identity["sha256"] = _sha256(path, size, mtime_ns)
    return identity


def file_identity(path) -> dict:
    """A file's path, size, modification time and (when small) content hash."""
    return dict(_identity(path, fileio.size(path), fileio.modified_ns(path)))


def made_from(files, model_sha256) -> dict:
    """A task's made_from (without record_bytes, which run_unit adds once the records are written)."""
    return {"model_sha256": model_sha256, "files": [file_identity(path) for path in files]}


def input_change(recorded: dict, files, model_sha256, sp_path) -> Optional[str]:
    """What changed between a unit's made_from and the inputs now (its task's `files`, the model), or None.
    A record_info of an older create (without made_from) is taken as it is."""
    if not recorded:
        return None
    if recorded.get("model_sha256") != model_sha256:
        return f"the SentencePiece model {sp_path} is not the one it was made with (sha256 " \
               f"{str(recorded.get('model_sha256'))[:12]}... then, {model_sha256[:12]}... now)"
    then = {entry["path"]: entry for entry in recorded.get("files", [])}
    for path in files:
        if path not in then:
            return f"{path} is new (not among the files it was made from)"
        current = file_identity(path)
        old = then.pop(path)
        if old.get("size") != current["size"]:
            return f"{path} changed ({old.get('size')} bytes then, {current['size']} now)"
        if "sha256" in old and "sha256" in current:
            if old["sha256"] != current["sha256"]:
                return f"{path} changed (its content differs)"
        elif old.get("mtime_ns") != current["mtime_ns"]:
            return f"{path} changed (modified since)"
    if then:
        return f"{next(iter(then))} is gone (it was made from it)"
    return None


def records_cut_short(record_path, recorded: dict) -> Optional[str]:
    """Why a complete-looking unit's records file is not the one its record_info describes, or None."""
    expected = recorded.get("record_bytes") if recorded else None
    if expected is None or not fileio.exists(record_path):
        return None
    actual = fileio.size(record_path)
    if actual != expected:
        return f"{record_path} is {actual} bytes, its record_info says {expected}"
    return None


def made_from_identity(tfrecords_dirs: list[str], split: Optional[str] = None) -> str:
    """What the units of `tfrecords_dirs` (in order; of `split` only, where given) were made from, wherever they are
    now: a sha256 of their record_infos' made_from (each input file's size and content hash, or its mtime where too
    large to hash; the SentencePiece model's sha256), without their paths; "" where a unit records none (an older
    create) or there is none."""
    made = []
    for tfrecords_dir in tfrecords_dirs:
        for path, unit in unit_files(tfrecords_dir):
            if split is not None and getattr(save_dir.parse_name(path), "split", None) != split:
                continue
            recorded = unit.get(MADE_FROM) or {}
            files = sorted(f"{f.get('size')} {f.get('sha256') or f.get('mtime_ns')}" for f in recorded.get("files", []))
            made.append([recorded.get("model_sha256"), files] if recorded else None)
    if not made or None in made:
        return ""
    return hashlib.sha256(json.dumps(made).encode()).hexdigest()


def unit_files(tfrecords_dir) -> list[tuple[str, dict]]:
    """(path, content) of every record_info in a tfrecords/ folder that can be read."""
    found = []
    for path in save_dir.record_info_paths(tfrecords_dir):
        try:
            found.append((path, save_dir.read_json(path)))
        except (OSError, ValueError):
            continue
    return found
