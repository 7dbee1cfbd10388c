"""What a model_dir holds besides the checkpoints, and what it refuses, for both trainers (train_gpu, train_torch):
no TensorFlow, no PyTorch.

    model_dir_lock         one run per model_dir (common/run_lock.py), whichever trainer
    check_model_dir        xlnet_config.json (the model must be the one there) and run_config.json (this run's settings,
                           for export_hf; the records must not contradict those the checkpoints learnt from)
    check_same_sources     a resume refuses sources swapped or reordered (by what their records were made from)
    check_trained_from     an --init_checkpoint of ours trained on records these contradict
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.common.run_lock import FolderLock
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.pretrain.config import TrainConfig, XLNetConfig
from xlnet_data.pretrain.layout import source_identity

RUN_CONFIG = "run_config.json"
XLNET_CONFIG = "xlnet_config.json"


def model_dir_lock(program: str) -> FolderLock:
    """The model_dir's lock (one file for both trainers: one run writes a model_dir at a time), naming `program`."""
    return FolderLock(".train.lock", program, "--model_dir")


def check_model_dir(cfg: TrainConfig, chief: bool, trained: bool, write: bool = True) -> None:
    """Writes model_dir/xlnet_config.json (the chief of several workers), or checks that the one there is
    this model's; then run_config.json, refusing records that contradict those the checkpoints already there
    learnt from (`trained`: the model_dir holds a checkpoint). `write` False (the dry run): only the checks."""
    path = os.path.join(cfg.model_dir, XLNET_CONFIG)
    if os.path.exists(path):
        try:
            there = XLNetConfig.from_json(path)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{path} is not an xlnet_config.json ({str(err).splitlines()[0]}): a model_dir of "
                              "another run? Use a new --model_dir") from None
        if there != cfg.model:
            changed = ", ".join(f"{key}={value} (here {getattr(cfg.model, key)})"
                                for key, value in dataclasses.asdict(there).items()
                                if value != getattr(cfg.model, key))
            raise ConfigError(f"--model_dir={cfg.model_dir} holds another model: {changed}; use a new model_dir")
    elif chief and write:
        os.makedirs(cfg.model_dir, exist_ok=True)
        try:
            cfg.model.to_json(path)
        except OSError as err:
            raise OSError(f"cannot write {path}: {err.strerror or err}") from None
    if not chief:
        return
    # This run's settings, for export_hf's config.json (memory, attention) and tokenizer (uncased, keep_accents);
    # rewritten by every run, since a resumed run may change them, but never those of the records it learnt from.
    trained_from = records_trained_from(cfg)
    run_config = os.path.join(cfg.model_dir, RUN_CONFIG)
    if trained and os.path.exists(run_config):
        recorded = save_dir.read_json(run_config)
        contradiction = contradicts(recorded, trained_from)
        if contradiction:
            raise ConfigError(f"--model_dir={cfg.model_dir} was trained on records of {contradiction} ({run_config}): "
                              "its checkpoints learnt those pieces; resume with records made as before, or train "
                              "these in a new --model_dir")
        if not write:
            return
        # What the checkpoints learnt from stays recorded where these records do not say (an older create's).
        trained_from["sp_model_sha256"] = sorted({*(recorded.get("sp_model_sha256") or []),
                                                  *trained_from["sp_model_sha256"]})
        if "keep_accents" in recorded:
            trained_from.setdefault("keep_accents", recorded["keep_accents"])
    if not write:
        return
    settings = {**dataclasses.asdict(cfg.run), "seq_len": cfg.data.seq_len, "perm_size": cfg.data.perm_size,
                "train_batch_size": cfg.data.bsz_per_host,  # with seq_len, the tokens of a step (curves.py)
                "num_predict": cfg.data.num_predict,
                # how the last run took its steps (it changes no number: a resume may take others)
                "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "recompute": cfg.recompute,
                # the records (absolute: export_hf reads them from anywhere), and what they were made from
                "record_info_dir": ",".join(os.path.abspath(d) for d in cfg.record_info_dir.split(",")),
                **trained_from}
    fileio.write_text_atomic(run_config, json.dumps(settings, indent=2) + "\n")


def records_trained_from(cfg: TrainConfig) -> dict:
    """run_config.json's record of the records: uncased, the SentencePiece model(s) (for export_hf to ship the
    very tokenizer) and keep_accents (left out where no corpus_info.json says: export_hf takes its flag)."""
    trained_from = {"uncased": cfg.data.uncased, "sp_model_sha256": records_models(cfg.record_info_dir)}
    keep_accents = records_keep_accents(cfg.record_info_dir)
    if keep_accents is not None:
        trained_from["keep_accents"] = keep_accents
    return trained_from


def contradicts(recorded: dict, trained_from: dict) -> Optional[str]:
    """What of a run_config.json (`recorded`) the records (`trained_from`) contradict, in words, or None. A key
    either lacks (an older run_config.json, records of an older create) contradicts nothing."""
    there, here = recorded.get("sp_model_sha256") or [], trained_from["sp_model_sha256"]
    if there and set(here) - set(there):
        return f"another SentencePiece model (sha256 {', '.join(there)}; these records': {', '.join(here)})"
    for key in ("uncased", "keep_accents"):
        if key in recorded and key in trained_from and bool(recorded[key]) != trained_from[key]:
            return f"{key}={str(bool(recorded[key])).lower()} (these records: {str(trained_from[key]).lower()})"
    return None


def check_trained_from(init_checkpoint: str, where: str, cfg: TrainConfig) -> None:
    """ConfigError when --init_checkpoint (one of ours, with run_config.json in `where`) was trained on records that
    the records of this run contradict (another SentencePiece model, other normalisation): its embeddings are of
    other pieces. Nothing to compare where there is no run_config.json (the original's checkpoints)."""
    run_config = os.path.join(where, RUN_CONFIG)
    if not os.path.isfile(run_config):
        return
    contradiction = contradicts(save_dir.read_json(run_config), records_trained_from(cfg))
    if contradiction:
        raise ConfigError(f"--init_checkpoint={init_checkpoint} was trained on records of {contradiction} "
                          f"({run_config}): its embeddings are of other pieces; use records made with its model and "
                          "settings, or another --init_checkpoint")


def records_models(record_info_dir: str) -> list[str]:
    """The sha256 of the SentencePiece model(s) the records of every comma-separated dir were made with (their
    record_infos' made_from; an older create's records name none), sorted."""
    return sorted({validation.check_units_agree(d) for d in record_info_dir.split(",")} - {None})


def records_keep_accents(record_info_dir: str) -> Optional[bool]:
    """Whether create kept accents in the records (their corpus_info.json; no key: the original's stripping),
    None where no corpus_info.json is found."""
    paths = [path for path in map(save_dir.find_corpus_info, record_info_dir.split(",")) if path]
    return any(CorpusInfo.read(path).value("keep_accents") for path in paths) if paths else None


def check_same_sources(path: str, cfg: TrainConfig, trained: list[tuple[str, str]]) -> None:
    """ConfigError when a source of --record_info_dir holds other records than the one of its place in checkpoint
    `path` (one swapped for another, or the list reordered): its position, memories and generator state would
    continue on other records. `trained`: (source_identity, record dir) of
    each of its sources. Matched by what the records were made from, so moved save_dirs still resume."""
    count = len(cfg.sources)
    here = [source_identity(name) for name in cfg.sources]
    differ = [i for i in range(count) if trained[i][0] and here[i] and trained[i][0] != here[i]]
    if not differ:
        return
    i = differ[0]
    order = [identity for identity, _ in trained]
    how = (f"the same sources in another order: give them as that run did ({','.join(d for _, d in trained)})"
           if sorted(order) == sorted(here) else
           f"its source {i + 1} was {trained[i][1]}, of other records: give the record dirs that run read")
    raise ConfigError(f"--record_info_dir's source {i + 1} ({cfg.sources[i]}) holds other records than the one "
                      f"{path} was trained on in that place ({how}); or train on these in a new --model_dir, with "
                      f"--init_checkpoint={path} to start from its weights")
