"""train_torch's checkpoints: every one a Transformers directory, and the model_dir itself the latest one.

    model_dir/
      config.json, model.safetensors, xlnet_pretraining.json,     the latest checkpoint's weights, so that
      spiece.model, tokenizer.json, tokenizer_config.json,        XLNetLMHeadModel.from_pretrained(model_dir) and
      README.md (the model card)                                  AutoTokenizer.from_pretrained(model_dir) load it
      checkpoint-<step>/     the same files, and training_state.pt: what else the next step depends on (the
                             optimiser's slots and step, each source's position and memories per replica, the torch,
                             numpy and Python random states: dropout draws from torch's), for an exact resume
      xlnet_config.json, run_config.json, .train.lock     as train_gpu's (pretrain/model_dir.py)

Each directory is written by pretrain/hf.py's one writer (hf.write, export_hf's too): a checkpoint-<step>/ is made
under a temporary name and renamed when whole, so a listed checkpoint is complete; the root's files are each
renamed into place, config.json last. The last --max_save checkpoint dirs are kept.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import shutil
from typing import Optional

import numpy as np
import torch

from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.dataformat import save_dir
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.pretrain import hf, hf_card
from xlnet_data.pretrain.config import ExportConfig, TrainConfig
from xlnet_data.pretrain.model_dir import records_keep_accents

log = logging.getLogger("xlnet_data")

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "training_state.pt"
TIED = "lm_loss.weight"  # the embedding, not saved twice (Transformers ties it back on load)
_CHECKPOINT_DIR = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")


@dataclasses.dataclass(frozen=True)
class DirectorySettings:
    """What every checkpoint's Transformers directory holds besides the weights: export_hf's ExportConfig (config.json
    with fine-tuning's settings, the run's in xlnet_pretraining.json, the records' tokenizer) and the records for the
    model card."""

    export: ExportConfig
    records: tuple[tuple[str, CorpusInfo], ...]


def directory_settings(cfg: TrainConfig) -> DirectorySettings:
    """The run's DirectorySettings: the tokenizer of the records' SentencePiece model (--sp_path, else their
    corpus_info.json's sp_path where it still is; none found: no tokenizer files, with a warning)."""
    paths = [p for p in map(save_dir.find_corpus_info, cfg.record_info_dir.split(",")) if p]
    records = tuple((path, CorpusInfo.read(path)) for path in dict.fromkeys(paths))
    sp_path = cfg.data.sp_path or next((info.sp_path for _, info in records
                                        if info.sp_path and os.path.isfile(info.sp_path)), "")
    if not sp_path:
        log.warning("the records' SentencePiece model is not found (--sp_path gives it): the checkpoints get no "
                    "tokenizer files")
    export = ExportConfig(checkpoint="", model=cfg.model, run=hf.fine_tuning_run(cfg.run), pretraining=cfg.run,
                          sp_path=sp_path, output_dir="", uncased=cfg.data.uncased,
                          keep_accents=bool(records_keep_accents(cfg.record_info_dir)))
    return DirectorySettings(export, records)


def listed(model_dir: str) -> list[tuple[int, str]]:
    """The complete checkpoint dirs of model_dir, (step, path), oldest first."""
    if not os.path.isdir(model_dir):
        return []
    found = [(int(m.group(1)), os.path.join(model_dir, name)) for name in os.listdir(model_dir)
             if (m := _CHECKPOINT_DIR.fullmatch(name))]
    return sorted((step, path) for step, path in found if os.path.isfile(os.path.join(path, STATE_FILE)))


def latest(model_dir: str) -> Optional[str]:
    found = listed(model_dir)
    return found[-1][1] if found else None


def weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's state_dict as float32 numpy arrays under Transformers' names, the tied lm_loss.weight left out."""
    return {name: value.detach().float().cpu().numpy() for name, value in model.state_dict().items() if name != TIED}


def write_weights(directory: str, model: torch.nn.Module, settings: DirectorySettings, name: str) -> None:
    """The model's weights as a Transformers directory (hf.write: config.json last), its card naming them `name`."""
    export = dataclasses.replace(settings.export, checkpoint=name, output_dir=directory)
    card = hf_card.model_card(export, list(settings.records), "not measured while training (export_hf measures it)")
    hf.write(export, weights(model), card)


def save(model_dir: str, step: int, model: torch.nn.Module, state: dict, settings: DirectorySettings,
         max_save: int) -> str:
    """Writes model_dir/checkpoint-<step>/ (the weights as a Transformers directory, `state` in training_state.pt),
    then the same directory's files into model_dir itself; keeps the last max_save checkpoint dirs. Returns the
    checkpoint dir."""
    final = os.path.join(model_dir, f"{CHECKPOINT_PREFIX}{step}")
    temporary = os.path.join(model_dir, f".{CHECKPOINT_PREFIX}{step}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        write_weights(temporary, model, settings, final)
        torch.save(state, os.path.join(temporary, STATE_FILE))
        if os.path.isdir(final):  # an older run's checkpoint of this step (its model_dir was trained past it)
            shutil.rmtree(final)
        os.replace(temporary, final)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    write_weights(model_dir, model, settings, final)
    for _, old in listed(model_dir)[:-max_save]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_weights(model: torch.nn.Module, directory: str) -> None:
    """The weights of a Transformers directory (ours, export_hf's, a Transformers save of XLNet) into `model`;
    one line naming the directory when it does not fit the model."""
    tensors = {name: torch.from_numpy(np.asarray(value, dtype=np.float32)) for name, value in
               hf.read_tensors(directory).items()}
    tensors.setdefault("lm_loss.bias", torch.zeros_like(model.lm_loss.bias))  # a save of XLNetModel or a classifier
    wanted = {name: tuple(value.shape) for name, value in model.state_dict().items() if name != TIED}
    problems = [f"{name}: missing" for name in wanted if name not in tensors]
    problems += [f"{name}: shape {list(tensors[name].shape)}, the model's {list(shape)}"
                 for name, shape in wanted.items() if name in tensors and tuple(tensors[name].shape) != shape]
    if problems:
        raise hf.HFFormatError(f"{directory} does not fit the model ({'; '.join(problems[:3])}"
                               f"{'; ...' if len(problems) > 3 else ''})")
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name != TIED:
                value.copy_(tensors[name])


def initialise(model: torch.nn.Module, init_checkpoint: str) -> str:
    """Weights from --init_checkpoint: a Transformers directory (export_hf's, a train_torch model_dir or checkpoint
    dir), or a TensorFlow checkpoint (a train_gpu model_dir or prefix, a released XLNet's), read without TensorFlow.
    Returns what was read."""
    if hf.is_hf_dir(init_checkpoint):
        load_weights(model, init_checkpoint)
        return init_checkpoint
    from xlnet_data.pretrain_torch import tf_checkpoint

    return tf_checkpoint.load_original(model, init_checkpoint)


# ----- the rest of what a step depends on --------------------------------------------------------------------

def random_states() -> dict:
    """torch's (dropout's), CUDA's, numpy's and Python's global random states, as torch.load(weights_only) reads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
            "python": random.getstate()}


def set_random_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])


def read_state(path: str, cfg: TrainConfig) -> dict:
    """training_state.pt of checkpoint dir `path`; another --seed is refused (it draws the factorization orders,
    the mixing schedule and the initial weights)."""
    try:
        state = torch.load(os.path.join(path, STATE_FILE), weights_only=True)
    except (OSError, RuntimeError, EOFError) as err:
        raise UserError(f"cannot read {os.path.join(path, STATE_FILE)} ({str(err).splitlines()[0]}): delete {path} "
                        "to resume from the checkpoint before it") from None
    if state["seed"] != cfg.seed:
        raise ConfigError(f"--seed={cfg.seed}, but {path} was trained with --seed={state['seed']} (it draws the "
                          f"factorization orders and the mixing schedule): resume with --seed={state['seed']}, or "
                          "use a new --model_dir")
    return state
