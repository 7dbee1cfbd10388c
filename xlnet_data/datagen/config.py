"""The explicit, frozen configuration of a `create` run, and its validation."""

import dataclasses
import os
from typing import Optional

from xlnet_data.common.config_types import check_field_types
from xlnet_data.common.errors import ConfigError
from xlnet_data.common.fileio import is_remote
from xlnet_data.dataformat.examples.loop import ExampleSettings, check_limit
from xlnet_data.dataformat.save_dir import RecordSettings
from xlnet_data.dataformat.save_dir import unit_paths as named_unit_paths
from xlnet_data.dataformat.words import WORD_BOUNDARIES

SPLITS = ("train", "dev", "test")
ENCODERS = ("auto", "ours", "sentencepiece")  # --encoder; datagen/encoder_check.py says what each does


@dataclasses.dataclass(frozen=True)
class CreateConfig:
    """Everything that decides the records; names and defaults are the original data_utils.py flags."""
    input_glob: str = "data/example/*.txt"
    sp_path: str = ""
    save_dir: str = "proc_data/example"
    use_tpu: bool = True
    bsz_per_host: int = 32
    num_core_per_host: int = 8
    seq_len: int = 512
    reuse_len: int = 256
    uncased: bool = True
    keep_accents: bool = False  # the original's preprocess_text option: no NFKD, no combining mark dropped
    bi_data: bool = True
    mask_alpha: int = 6
    mask_beta: int = 1
    use_eod: bool = True
    from_raw_text: bool = True
    num_predict: int = 85
    split: str = "train"
    pass_id: int = 0
    num_passes: Optional[int] = None  # None: only `pass_id`; N: passes 0..N-1
    num_task: int = 1
    task: Optional[int] = None  # None: every task of `num_task`
    span_unit: str = "piece"
    word_boundaries: str = "spaces"
    strict: bool = False  # invalid UTF-8 stops the run instead of being replaced
    allow_binary: bool = False  # read files with NUL bytes or mostly invalid UTF-8 instead of refusing them
    write_records: bool = True  # False: keep the token cache; train_gpu and dump make the records from it
    allow_accents_mismatch: bool = False  # make records with keep_accents other than the model was trained with
    encoder: str = "auto"  # who encodes the text: "auto" (ours where checked), "ours", "sentencepiece"

    def __post_init__(self):
        check_field_types(self)

    @property
    def num_core(self) -> int:
        """Cores the rows are laid out for; the original forces 1 without a TPU."""
        return self.num_core_per_host if self.use_tpu else 1

    @property
    def tot_len(self) -> int:
        """Room for A and B: seq_len minus the memory part, two <sep> and one <cls>."""
        return self.seq_len - self.reuse_len - 3

    @property
    def tasks(self):
        return list(range(self.num_task)) if self.task is None else [self.task]

    @property
    def pass_ids(self):
        return [self.pass_id] if self.num_passes is None else list(range(self.num_passes))

    def unit_paths(self, unit) -> tuple[str, str]:
        """(tfrecords path, record_info path) of a (task, pass) unit of this run, as dataformat/save_dir.py names
        them."""
        return named_unit_paths(self.save_dir, self.split, unit.task, unit.pass_id, RecordSettings.of(self))

    def with_absolute_paths(self) -> "CreateConfig":
        """This config with its local paths (input_glob, sp_path, save_dir) made absolute against the current
        directory: workers of a Beam runner or of a cluster have other working directories. Remote paths
        (gs://, ...) and an empty sp_path are kept."""
        def absolute(path):
            return path if not path or is_remote(path) else os.path.abspath(path)
        return dataclasses.replace(self, input_glob=absolute(self.input_glob), sp_path=absolute(self.sp_path),
                                   save_dir=absolute(self.save_dir))

    def validate(self) -> "CreateConfig":
        """Raises ConfigError with a one-line explanation for a combination the layout cannot use."""
        for name in ("input_glob", "save_dir"):  # an empty sp_path: load_sentencepiece says so
            if not getattr(self, name).strip():
                raise ConfigError(f"--{name} is empty: give a path")
        check_limit("num_task", self.num_task)
        check_limit("num_core_per_host", self.num_core_per_host)  # ExampleSettings sees 1 without a TPU
        ExampleSettings.of(self).validate()
        if self.pass_id < 0:
            raise ConfigError(f"--pass_id={self.pass_id} must not be negative")
        if self.num_passes is not None and not 1 <= self.num_passes <= 1 << 16:
            raise ConfigError(f"--num_passes={self.num_passes} must be in [1, {1 << 16}]")
        last_pass = self.pass_id if self.num_passes is None else self.num_passes - 1
        if 100 * (self.num_task - 1) + last_pass >= 1 << 32:  # a unit's seed, 100 * task + pass, is a uint32
            raise ConfigError(f"--pass_id={last_pass} is too large: 100 * task + pass must be below 2**32")
        if self.task is not None and not 0 <= self.task < self.num_task:
            raise ConfigError(f"--task={self.task} must be in [0, --num_task={self.num_task})")
        if self.split not in SPLITS:
            raise ConfigError(f"--split={self.split} must be one of {', '.join(SPLITS)}")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"--encoder={self.encoder} must be one of {', '.join(ENCODERS)}")
        if self.word_boundaries not in WORD_BOUNDARIES:
            raise ConfigError(f"--word_boundaries={self.word_boundaries} must be one of {', '.join(WORD_BOUNDARIES)}")
        return self
