"""The save_dir layout, for the writer (create) and every reader (dump, train_gpu, the input pipeline).

    save_dir/corpus_info.json
    save_dir/tfrecords/{split}-{task}-{pass}.{settings}.tfrecords            (or .tfrecords.gz)
    save_dir/tfrecords/record_info-{split}-{task}-{pass}.{settings}.json
    save_dir/token_cache/tokens-{task}.{key}.bin, .json                      (during a run of create only)

`settings` is the original's scheme, e.g. `bsz-8.seqlen-128.reuse-64.uncased.bi.alpha-6.beta-1.fnp-21`.
corpus_info.json holds the run's settings (see create); a record_info holds the original's `filenames`
and `num_batch` (plus `create_settings`, and `create_counts`: the unit's counts for create's summary), and
its presence marks its unit complete.
"""

import dataclasses
import json
import os
import re
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError

CORPUS_INFO = "corpus_info.json"
TFRECORDS = "tfrecords"
TOKEN_CACHE = "token_cache"


class SaveDirError(UserError, ValueError):
    """A save_dir, corpus_info.json or record_info file that cannot be read as the layout says."""


@dataclasses.dataclass(frozen=True)
class RecordSettings:
    """What the original encodes in a records file name."""

    bsz_per_host: int
    seq_len: int
    bi_data: bool
    mask_alpha: int = 5
    mask_beta: int = 1
    reuse_len: Optional[int] = None
    uncased: bool = False
    num_predict: Optional[int] = None

    @classmethod
    def of(cls, config) -> "RecordSettings":
        """The settings of any config with these fields' names (create's, the input pipeline's)."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})

    def name(self, prefix: str, suffix: str) -> str:
        """The original's file name, e.g. `train-0-0.bsz-8.seqlen-128.reuse-64.bi.alpha-6.beta-1.fnp-21.tfrecords`."""
        reuse = "" if self.reuse_len is None else f"reuse-{self.reuse_len}."
        uncased = "uncased." if self.uncased else ""
        direction = "bi" if self.bi_data else "uni"
        fnp = "" if self.num_predict is None else f"fnp-{self.num_predict}."
        return (f"{prefix}.bsz-{self.bsz_per_host}.seqlen-{self.seq_len}.{reuse}{uncased}{direction}"
                f".alpha-{self.mask_alpha}.beta-{self.mask_beta}.{fnp}{suffix}")


_NAME_RE = re.compile(
    r"(?:^(?:record_info-)?(?P<split>\w+?)-(?P<task>\d+)-(?P<pass>\d+)\.)?"
    r"bsz-(?P<bsz>\d+)\.seqlen-(?P<seq>\d+)\.(?:reuse-(?P<reuse>\d+)\.)?(?P<uncased>uncased\.)?"
    r"(?P<dir>bi|uni)\.alpha-(?P<alpha>\d+)\.beta-(?P<beta>\d+)\.(?:fnp-(?P<fnp>\d+)\.)?(?:tfrecords|json)")


@dataclasses.dataclass(frozen=True)
class ParsedName:
    """What a records or record_info file name says (split, task and pass are None in a renamed file)."""

    settings: RecordSettings
    split: Optional[str] = None
    task: Optional[int] = None
    pass_id: Optional[int] = None


def parse_name(path: str) -> Optional[ParsedName]:
    """The split, task, pass and settings in a records/record_info file name, or None if it has none."""
    match = _NAME_RE.search(os.path.basename(path))
    if not match:
        return None
    settings = RecordSettings(
        bsz_per_host=int(match["bsz"]), seq_len=int(match["seq"]), bi_data=match["dir"] == "bi",
        mask_alpha=int(match["alpha"]), mask_beta=int(match["beta"]),
        reuse_len=int(match["reuse"]) if match["reuse"] else None, uncased=bool(match["uncased"]),
        num_predict=int(match["fnp"]) if match["fnp"] else None)
    if match["split"] is None:
        return ParsedName(settings)
    return ParsedName(settings, match["split"], int(match["task"]), int(match["pass"]))


def unit_paths(save_dir: str, split: str, task: int, pass_id: int, settings: RecordSettings) -> tuple[str, str]:
    """(tfrecords path, record_info path) of one (task, pass) unit."""
    base = f"{split}-{task}-{pass_id}"
    folder = os.path.join(save_dir, TFRECORDS)
    return (os.path.join(folder, settings.name(base, "tfrecords")),
            os.path.join(folder, settings.name(f"record_info-{base}", "json")))


def record_info_glob(tfrecords_dir: str, split: str, settings: RecordSettings) -> str:
    """The glob of every unit's record_info in a tfrecords/ folder, for these settings."""
    return os.path.join(tfrecords_dir, settings.name(f"record_info-{split}-*", "json"))


def record_info_paths(tfrecords_dir: str) -> list[str]:
    """Every record_info JSON in a tfrecords/ folder, sorted (of any split and settings)."""
    return fileio.glob(os.path.join(tfrecords_dir, "record_info-*.json"))


def record_info_of(record_file: str) -> str:
    """The record_info path beside a records file (which may be gzipped)."""
    name = os.path.basename(record_file)
    name = name.removesuffix(".gz").removesuffix(".tfrecords")
    return os.path.join(os.path.dirname(record_file), f"record_info-{name}.json")


def record_file_of(record_info_path: str) -> str:
    """The records path beside a record_info (record_info_of's inverse; a gzipped copy adds `.gz`)."""
    name = os.path.basename(record_info_path).removeprefix("record_info-").removesuffix(".json")
    return os.path.join(os.path.dirname(record_info_path), f"{name}.tfrecords")


def is_record_file(name: str) -> bool:
    """A tfrecords file, not its JSON, nor the temporary file of an unfinished (or killed) create."""
    base = os.path.basename(name)
    return ".tfrecord" in base and not base.endswith(".json") and fileio.TMP_MARK not in base


def tfrecords_dir(path: str) -> str:
    """The records folder of `path`: its tfrecords/ when it is a save_dir, else `path` itself."""
    inner = os.path.join(path, TFRECORDS)
    return inner if os.path.isdir(inner) else path


def save_dir_of(tfrecords_dir: str) -> str:
    """The save_dir above a tfrecords/ folder (a folder of records given as such: itself)."""
    path = os.path.abspath(tfrecords_dir)
    return os.path.dirname(path) if os.path.basename(path) == TFRECORDS else path


def token_cache_paths(save_dir: str, task: int, key: str) -> tuple[str, str]:
    """(tokens, index) of a task's token cache; `key` names what the tokens were made from (create's encode stage)."""
    base = os.path.join(save_dir, TOKEN_CACHE, f"tokens-{task}.{key}")
    return base + ".bin", base + ".json"


def token_cache_files(save_dir: str, task: int) -> list[str]:
    """Every complete-named token cache file of a task, whatever its key (temporary files excluded)."""
    return fileio.glob(os.path.join(save_dir, TOKEN_CACHE, f"tokens-{task}.*"))


def remove_token_caches(save_dir: str, tasks) -> None:
    """Deletes the token caches of `tasks`, and the token_cache folder once it is empty (local save_dirs)."""
    for task in tasks:
        for path in token_cache_files(save_dir, task):
            fileio.remove(path)
    folder = os.path.join(save_dir, TOKEN_CACHE)
    if not fileio.is_remote(folder) and os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)


_TOKEN_CACHE_NAME = re.compile(r"tokens-\d+\.[0-9a-f]+\.(bin|json)")


def is_create_output(name: str) -> bool:
    """Whether a file name is one that create writes in a save_dir: corpus_info.json, a unit's records or
    record_info, a token cache file."""
    return name == CORPUS_INFO or bool(parse_name(name)) or bool(_TOKEN_CACHE_NAME.fullmatch(name))


def corpus_info_path(save_dir: str) -> str:
    return os.path.join(save_dir, CORPUS_INFO)


def find_corpus_info(path: str) -> Optional[str]:
    """corpus_info.json of a save_dir or of the save_dir above a tfrecords/ folder, or None."""
    folder = os.path.abspath(path)
    for candidate in (folder, os.path.dirname(folder)):
        if os.path.isfile(os.path.join(candidate, CORPUS_INFO)):
            return os.path.join(candidate, CORPUS_INFO)
    return None


def read_json(path: str) -> dict:
    """A JSON object of the layout (corpus_info or record_info); SaveDirError names the file."""
    try:
        data = json.loads(fileio.read_text(path))
    except ValueError as err:
        raise SaveDirError(f"{path} is not valid JSON ({err}); re-create it, or delete it") from None
    if not isinstance(data, dict):
        raise SaveDirError(f"{path} is not a JSON object; re-create it, or delete it")
    return data


def write_json(path: str, data: dict) -> None:
    """Writes a corpus_info or record_info atomically (a reader never sees half of it)."""
    fileio.write_text_atomic(path, json.dumps(data))


def record_files(record_info_path: str, info: dict) -> list[str]:
    """The records files a record_info names, looked up beside it (as the original does); a gzipped
    copy (`….tfrecords.gz`) is accepted too; FileNotFoundError names a missing one."""
    folder = os.path.dirname(record_info_path)
    found = []
    for name in info.get("filenames", []):
        path = os.path.join(folder, os.path.basename(name))
        for candidate in (path, path + ".gz"):
            if os.path.isfile(candidate):
                found.append(candidate)
                break
        else:
            raise FileNotFoundError(f"{path} (or {path}.gz), listed in {record_info_path}, is missing")
    return found
