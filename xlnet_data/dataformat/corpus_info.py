"""corpus_info.json: the settings a save_dir's records were made with, its schema and its format version.

The original's data_utils.py writes thirteen keys (vocab_size ... input_glob, in CorpusInfo's field order);
create adds keep_accents, word_boundaries (where it is not `spaces`) and format_version after them, and
input_counts (its per-file counts) last.

    format_version absent   the original's (and an older create's): read as version 0, a missing key meaning
                            what ABSENT_MEANS says (the original always removed accents)
    format_version 1        this layout
    a newer one             refused in one line: a newer xlnet-data wrote it

Reading checks each field's type (one line naming the file and the key); writing keeps the key order, so a
corpus_info read and written again is the same JSON.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from xlnet_data.dataformat import save_dir
from xlnet_data.dataformat.save_dir import SaveDirError

FORMAT_VERSION = 1
VERSION_KEY = "format_version"
# What a corpus_info.json (or a record_info's create_settings) without the key means: written before the key
# existed, or by the original, whose text step always removed accents.
ABSENT_MEANS = {"keep_accents": False, "word_boundaries": "spaces"}


class NewerFormatError(SaveDirError):
    """A corpus_info.json of a newer xlnet-data: neither read nor written over."""


def recorded(info: Mapping[str, Any], key: str):
    """corpus_info's (or create_settings') `key`, ABSENT_MEANS's value where it lacks it; else None."""
    value = info.get(key) if isinstance(info, Mapping) else getattr(info, key)
    return ABSENT_MEANS.get(key) if value is None else value


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    """The content of a corpus_info.json; None: the key is not there (an edited or a partial file)."""

    # The original's keys, in its order.
    vocab_size: Optional[int] = None
    bsz_per_host: Optional[int] = None
    num_core_per_host: Optional[int] = None
    seq_len: Optional[int] = None
    reuse_len: Optional[int] = None
    uncased: Optional[bool] = None
    bi_data: Optional[bool] = None
    mask_alpha: Optional[int] = None
    mask_beta: Optional[int] = None
    num_predict: Optional[int] = None
    use_eod: Optional[bool] = None
    sp_path: Optional[str] = None
    input_glob: Optional[str] = None
    # Ours.
    keep_accents: Optional[bool] = None
    word_boundaries: Optional[str] = None  # where spans can start (create --word_boundaries; absent: spaces)
    format_version: int = FORMAT_VERSION
    # Keys written by a later step (create's input_counts), kept as they are.
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, config, vocab_size: int) -> "CorpusInfo":
        """What create writes for `config` (a CreateConfig: num_core is the cores the rows were laid out for);
        vocab_size is the SentencePiece model's real size."""
        return cls(vocab_size=vocab_size, bsz_per_host=config.bsz_per_host, num_core_per_host=config.num_core,
                   seq_len=config.seq_len, reuse_len=config.reuse_len, uncased=config.uncased,
                   bi_data=config.bi_data, mask_alpha=config.mask_alpha, mask_beta=config.mask_beta,
                   num_predict=config.num_predict, use_eod=config.use_eod, sp_path=config.sp_path,
                   input_glob=config.input_glob, keep_accents=config.keep_accents,
                   word_boundaries=None if config.word_boundaries == "spaces" else config.word_boundaries)

    @classmethod
    def from_dict(cls, info: Mapping[str, Any], path: str) -> "CorpusInfo":
        """A corpus_info.json's object; SaveDirError (one line naming `path` and the key) for a value of the
        wrong type, or a format_version newer than this xlnet-data reads."""
        version = info.get(VERSION_KEY, 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise SaveDirError(f"{path}: {VERSION_KEY}={version!r} is not a format version; re-create the save_dir, "
                               "or fix it")
        if version > FORMAT_VERSION:
            raise NewerFormatError(f"{path}: {VERSION_KEY}={version} is newer than this xlnet-data reads "
                               f"({FORMAT_VERSION}): upgrade xlnet-data (pip install -U xlnet-data)")
        values = {}
        for field in _SETTINGS:
            value = info.get(field.name)
            if value is not None:
                _check_type(path, field.name, value, SETTING_TYPES[field.name])
            values[field.name] = value
        extra = {key: value for key, value in info.items() if key not in _KEYS}
        return cls(**values, format_version=version, extra=extra)

    @classmethod
    def read(cls, path: str) -> "CorpusInfo":
        """The corpus_info.json at `path` (SaveDirError: not JSON, a wrong type, too new; OSError: unreadable)."""
        return cls.from_dict(save_dir.read_json(path), path)

    def to_dict(self) -> dict:
        """The JSON object: the keys that are there in the original's order, ours after them, then `extra`
        (format_version 0 is no key, as the original writes)."""
        info = {field.name: getattr(self, field.name) for field in _SETTINGS if getattr(self, field.name) is not None}
        if self.format_version:
            info[VERSION_KEY] = self.format_version
        return {**info, **self.extra}

    def write(self, path: str) -> None:
        save_dir.write_json(path, self.to_dict())

    def value(self, key: str):
        """A setting as the records were made with it: the recorded value, ABSENT_MEANS's where it is missing."""
        return recorded(self, key)

    def settings(self) -> dict:
        """{key: value} of the settings that are recorded (ABSENT_MEANS's filled in): what another run of create
        on the same save_dir must repeat."""
        return {field.name: self.value(field.name) for field in _SETTINGS if self.value(field.name) is not None}


_SETTINGS = [field for field in dataclasses.fields(CorpusInfo) if field.name not in (VERSION_KEY, "extra")]
_KEYS = {field.name for field in _SETTINGS} | {VERSION_KEY}
# Each field's JSON type: its annotation without the Optional.
SETTING_TYPES = {field.name: next(kind for kind in field.type.__args__ if kind is not type(None)) for field in _SETTINGS}


def _check_type(path: str, key: str, value, kind: type) -> None:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise SaveDirError(f"{path}: {key}={value!r} is not a positive integer; re-create the save_dir, or fix it")
    if kind is bool and not isinstance(value, bool):
        raise SaveDirError(f"{path}: {key}={value!r} is not true or false; re-create the save_dir, or fix it")
    if kind is str and not isinstance(value, str):
        raise SaveDirError(f"{path}: {key}={value!r} is not a string; re-create the save_dir, or fix it")
