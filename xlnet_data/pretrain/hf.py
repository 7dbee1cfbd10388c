"""Hugging Face Transformers' XLNet: our checkpoints to a `from_pretrained` directory, and back.

A directory holds `config.json` (Transformers' XLNetConfig), `model.safetensors` (the weights under
Transformers' parameter names) and the tokenizer files (dataformat/hf_tokenizer.py). Both ways need only
numpy and safetensors (and TensorFlow to read our checkpoints, imported only then: train_torch writes its
checkpoints with `write` and never loads TensorFlow): neither PyTorch nor Transformers.

How the names map (ours are the original's, see modeling.variable_shapes; L = layer):

    model/transformer/word_embedding/lookup_table     transformer.word_embedding.weight (lm_loss.weight is tied to it)
    model/transformer/mask_emb/mask_emb               transformer.mask_emb
    model/transformer/layer_L/rel_attn/{q,k,v,o,r}/kernel   transformer.layer.L.rel_attn.{q,k,v,o,r}  (same layout)
    model/transformer/r_{w,r,s}_bias  [n_layer,] n_head, d_head   transformer.layer.L.rel_attn.r_{w,r,s}_bias
    model/transformer/seg_embed  [n_layer, 2, n_head, d_head]      transformer.layer.L.rel_attn.seg_embed
    model/transformer/layer_L/{rel_attn,ff}/LayerNorm/{gamma,beta}  transformer.layer.L.{rel_attn,ff}.layer_norm.{weight,bias}
    model/transformer/layer_L/ff/layer_{1,2}/kernel   transformer.layer.L.ff.layer_{1,2}.weight  (transposed: torch Linear)
    model/transformer/layer_L/ff/layer_{1,2}/bias     transformer.layer.L.ff.layer_{1,2}.bias
    model/lm_loss/bias                                lm_loss.bias

Transformers keeps the attention biases per layer always: with untie_r=False (one shared bias) every layer
gets a copy on export, and on import they must be equal. Our GELU is the original's tanh approximation,
Transformers' "gelu_new"; its "gelu" is the exact one, so a model of ours exports as "gelu_new".
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import NamedTuple, Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import corpus_info, hf_tokenizer
from xlnet_data.pretrain.config import LAYER_NORM_EPSILON, ExportConfig, RunConfig, XLNetConfig

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # sharded weights (Transformers' large saves)
CONFIG_FILE = "config.json"
# The training run's memory and attention settings, which config.json leaves at fine-tuning's: train_gpu
# --init_checkpoint=DIR continues pretraining with them.
PRETRAINING_FILE = "xlnet_pretraining.json"
PRETRAINING_KEYS = ("mem_len", "reuse_len", "bi_data", "clamp_len", "same_length", "attn_type")
MODEL_CARD_FILE = "README.md"
# Transformers' ff_activation names that are ours; "gelu" (exact erf) differs from ours by < 1e-3.
_ACTIVATION_FROM_HF = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu"}
_ACTIVATION_TO_HF = {"relu": "relu", "gelu": "gelu_new"}


class HFFormatError(UserError, ValueError):
    """A Transformers directory that does not fit the model: names the file and the parameter."""


class Link(NamedTuple):
    """One Transformers tensor and where it lives in ours."""

    hf: str  # Transformers' parameter name
    ours: str  # our (the original's) variable name
    layer: Optional[int]  # the index into our variable stacked per layer, None: the whole variable
    transpose: bool = False  # torch Linear weights are [out, in], our kernels [in, out]


def links(config: XLNetConfig) -> list[Link]:
    """Every Transformers tensor of XLNetLMHeadModel (except the tied lm_loss.weight), in a fixed order."""
    out = [Link("transformer.word_embedding.weight", "model/transformer/word_embedding/lookup_table", None),
           Link("transformer.mask_emb", "model/transformer/mask_emb/mask_emb", None)]
    for i in range(config.n_layer):
        ours, hf = f"model/transformer/layer_{i}", f"transformer.layer.{i}"
        out += [Link(f"{hf}.rel_attn.{proj}", f"{ours}/rel_attn/{proj}/kernel", None) for proj in "qkvor"]
        out += [Link(f"{hf}.rel_attn.{bias}", f"model/transformer/{bias}", i if config.untie_r else None)
                for bias in ("r_r_bias", "r_s_bias", "r_w_bias")]
        out.append(Link(f"{hf}.rel_attn.seg_embed", "model/transformer/seg_embed", i))
        for block in ("rel_attn", "ff"):
            out += [Link(f"{hf}.{block}.layer_norm.weight", f"{ours}/{block}/LayerNorm/gamma", None),
                    Link(f"{hf}.{block}.layer_norm.bias", f"{ours}/{block}/LayerNorm/beta", None)]
        for dense in ("layer_1", "layer_2"):
            out += [Link(f"{hf}.ff.{dense}.weight", f"{ours}/ff/{dense}/kernel", None, transpose=True),
                    Link(f"{hf}.ff.{dense}.bias", f"{ours}/ff/{dense}/bias", None)]
    out.append(Link("lm_loss.bias", "model/lm_loss/bias", None))
    return out


def _hf_shape(link: Link, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    shape = tuple(shapes[link.ours][1:] if link.layer is not None else shapes[link.ours])
    return tuple(reversed(shape)) if link.transpose else shape


def to_hf(weights: Mapping[str, np.ndarray], config: XLNetConfig) -> dict[str, np.ndarray]:
    """Our weights (by variable name) as Transformers' tensors (float32, contiguous, as safetensors wants)."""
    out = {}
    for link in links(config):
        value = np.asarray(weights[link.ours], dtype=np.float32)
        if link.layer is not None:
            value = value[link.layer]
        out[link.hf] = np.ascontiguousarray(value.T if link.transpose else value)
    return out


def from_hf(tensors: Mapping[str, np.ndarray], config: XLNetConfig, source: str) -> dict[str, np.ndarray]:
    """Transformers' tensors as our weights, every one checked against the model's shapes. HFFormatError (one
    line, naming `source` and the parameter) for a missing or misshapen tensor, or shared biases that differ
    between layers. A missing lm_loss.bias (a save of XLNetModel or of a classifier) becomes zeros."""
    from xlnet_data.pretrain.modeling import variable_shapes

    shapes = variable_shapes(config)
    parts: dict[str, list] = {}
    for link in links(config):
        want = _hf_shape(link, shapes)
        value = tensors.get(link.hf)
        if value is None and link.hf == "lm_loss.bias":
            value = np.zeros(want, np.float32)
        if value is None:
            raise HFFormatError(f"{source}: no {link.hf} (shape {list(want)}) for {link.ours}")
        if tuple(value.shape) != want:
            raise HFFormatError(f"{source}: {link.hf} has shape {list(value.shape)}, the model needs {list(want)} "
                                f"({_shape_meaning(config)})")
        value = np.asarray(value, dtype=np.float32)
        parts.setdefault(link.ours, []).append((link, value.T if link.transpose else value))
    out = {}
    for name, pieces in parts.items():
        first_link, first = pieces[0]
        if first_link.layer is not None:
            out[name] = np.stack([value for _, value in pieces])
        else:
            for link, value in pieces[1:]:  # a shared bias: Transformers' copies must all be equal
                if not np.array_equal(value, first):
                    raise HFFormatError(f"{source}: {link.hf} differs from {first_link.hf}, but the model shares one "
                                        f"{name.rsplit('/', 1)[-1]} across layers; use --untie_r")
            out[name] = first
    tied = tensors.get("lm_loss.weight")
    if tied is not None and not np.array_equal(tied, tensors["transformer.word_embedding.weight"]):
        raise HFFormatError(f"{source}: lm_loss.weight differs from transformer.word_embedding.weight; XLNet ties them")
    return out


def _shape_meaning(config: XLNetConfig) -> str:
    return (f"n_layer={config.n_layer}, d_model={config.d_model}, n_head={config.n_head}, d_head={config.d_head}, "
            f"d_inner={config.d_inner}, n_token={config.n_token}")


# ----- config.json ----------------------------------------------------------------------------------

def hf_config(model: XLNetConfig, run: RunConfig) -> dict:
    """Transformers' config.json of the model, with the run settings (memory, bi_data, clamping) given."""
    if model.n_head * model.d_head != model.d_model:
        raise HFFormatError(f"Transformers' XLNet needs d_head = d_model / n_head; this model has d_model="
                            f"{model.d_model}, n_head={model.n_head}, d_head={model.d_head}")
    return {
        "architectures": ["XLNetLMHeadModel"], "model_type": "xlnet",
        "vocab_size": model.n_token, "d_model": model.d_model, "n_layer": model.n_layer, "n_head": model.n_head,
        "d_head": model.d_head, "d_inner": model.d_inner, "ff_activation": _ACTIVATION_TO_HF[model.ff_activation],
        "untie_r": model.untie_r, "attn_type": run.attn_type,
        "mem_len": run.mem_len or None, "reuse_len": run.reuse_len or None, "bi_data": run.bi_data,
        "clamp_len": run.clamp_len, "same_length": run.same_length, "use_mems_eval": bool(run.mem_len),
        "use_mems_train": False, "dropout": run.dropout, "initializer_range": run.init_std,
        "layer_norm_eps": LAYER_NORM_EPSILON, "pad_token_id": 5, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": True, "dtype": "float32",
    }


def fine_tuning_run(run: RunConfig) -> RunConfig:
    """config.json's settings by default: fine-tuning's, as the original's run_classifier.py has them (no memory,
    dropout 0.1 where pretraining's default is 0). Transformers reads bi_data=True as a batch of forward and backward
    halves (a batch of one text gives empty logits), mem_len as memories returned, reuse_len as positions cached."""
    return dataclasses.replace(run, mem_len=0, reuse_len=0, bi_data=False, dropout=0.1, dropatt=0.1)


def read_pretraining(directory: str) -> Optional[dict]:
    """The training run's settings (PRETRAINING_KEYS) that an export keeps beside config.json, None without
    the file (an export from before it, or a Transformers save)."""
    path = os.path.join(directory, PRETRAINING_FILE)
    if not fileio.exists(path):
        return None
    try:
        data = json.loads(fileio.read_text(path))
        return {key: data[key] for key in PRETRAINING_KEYS}
    except (ValueError, KeyError, TypeError) as err:
        raise HFFormatError(f"{path} is not export_hf's {PRETRAINING_FILE} ({type(err).__name__}: {err})") from None


def read_config(directory: str) -> tuple[XLNetConfig, RunConfig]:
    """The model shape and run settings of a Transformers directory's config.json."""
    path = os.path.join(directory, CONFIG_FILE)
    try:
        data = json.loads(fileio.read_text(path))
    except (OSError, ValueError) as err:
        raise HFFormatError(f"cannot read {path}: {err}") from None
    if data.get("model_type", "xlnet") != "xlnet":
        raise HFFormatError(f"{path}: model_type is {data['model_type']!r}, not an XLNet")
    missing = [key for key in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner") if key not in data]
    if missing:
        raise HFFormatError(f"{path}: missing {', '.join(missing)}")
    activation = data.get("ff_activation", "gelu")
    if activation not in _ACTIVATION_FROM_HF:
        raise HFFormatError(f"{path}: ff_activation {activation!r} is not one XLNet here has (relu, gelu, gelu_new)")
    model = XLNetConfig(n_layer=data["n_layer"], d_model=data["d_model"], n_head=data["n_head"],
                        d_head=data.get("d_head") or data["d_model"] // data["n_head"], d_inner=data["d_inner"],
                        ff_activation=_ACTIVATION_FROM_HF[activation], untie_r=data.get("untie_r", True),
                        n_token=data["vocab_size"])
    run = RunConfig(mem_len=data.get("mem_len") or 0, reuse_len=data.get("reuse_len") or 0,
                    bi_data=bool(data.get("bi_data", False)), clamp_len=data.get("clamp_len", -1),
                    same_length=bool(data.get("same_length", False)), attn_type=data.get("attn_type", "bi"))
    return model, run


# ----- directories --------------------------------------------------------------------------------------

def is_hf_dir(path: Optional[str]) -> bool:
    """Whether path is a Transformers directory (config.json beside model.safetensors or its index)."""
    return bool(path) and fileio.exists(os.path.join(path, CONFIG_FILE)) and any(
        fileio.exists(os.path.join(path, name)) for name in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE))


_SETTING_WORDS = {"uncased": ("lower-cases", "keeps case"), "keep_accents": ("keeps accents", "strips accents")}


def check_tokenizer_fits_records(directory: str, records: list[tuple[str, dict]], name: str) -> None:
    """HFFormatError (one line) when the tokenizer of a Transformers directory normalises text otherwise than
    create did for the records ([(corpus_info.json path, its CorpusInfo or content)]; a key missing there is
    False: records of the original or from before the setting): the model learnt other pieces than the records
    hold."""
    settings = hf_tokenizer.tokenizer_settings(directory)
    if settings is None:
        return
    for path, info in records:
        for key, value in settings.items():
            recorded = bool(corpus_info.recorded(info, key))
            if recorded != value:
                raise HFFormatError(
                    f"{name}: its tokenizer {_SETTING_WORDS[key][not value]} ({key}={str(value).lower()}), the "
                    f"records were made with {key}={str(recorded).lower()} ({path}): the model learnt other pieces "
                    f"than these records hold; use records made with{'' if value else 'out'} create --{key}, or "
                    "another model")


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _safetensors_numpy():
    try:
        from safetensors import numpy as st_numpy
    except ImportError:
        raise HFFormatError("Transformers directories need the safetensors package: pip install safetensors "
                            "(or xlnet-data[hf])") from None
    return st_numpy


def read_tensors(directory: str) -> dict[str, np.ndarray]:
    """Every tensor of a directory's model.safetensors (or of the shards its index lists), by Transformers'
    name; a save of the bare XLNetModel (names without "transformer.") is given the prefix. bfloat16 tensors
    come as ml_dtypes' bfloat16 (TensorFlow registers it with numpy); from_hf makes every tensor float32."""
    st_numpy = _safetensors_numpy()
    index = os.path.join(directory, WEIGHTS_INDEX_FILE)
    if fileio.exists(os.path.join(directory, WEIGHTS_FILE)):
        files = [WEIGHTS_FILE]
    else:
        try:
            files = sorted(set(json.loads(fileio.read_text(index))["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as err:  # not JSON, or not a safetensors index
            raise HFFormatError(f"{index} is not a safetensors index ({type(err).__name__}: {err})") from None
    tensors = {}
    for name in files:
        path = os.path.join(directory, name)
        try:
            if fileio.is_remote(path):
                with fileio.open_read(path) as f:
                    tensors.update(st_numpy.load(f.read()))
            else:
                tensors.update(st_numpy.load_file(path))
        except Exception as err:  # safetensors' own error for a bad header, OSError for a missing shard
            raise HFFormatError(f"cannot read {path}: {str(err).splitlines()[0]}") from None
    if "word_embedding.weight" in tensors and "transformer.word_embedding.weight" not in tensors:
        tensors = {("" if name.startswith("lm_loss.") else "transformer.") + name: value
                   for name, value in tensors.items()}
    return tensors


def load_weights(directory: str, config: XLNetConfig) -> dict[str, np.ndarray]:
    """Our weights from a Transformers directory, checked against `config` (see from_hf)."""
    return from_hf(read_tensors(directory), config, os.path.join(directory, WEIGHTS_FILE))


class ExportResult(NamedTuple):
    files: list[str]  # the files written, in output_dir
    num_tensors: int
    num_parameters: int


def export(cfg: ExportConfig, model_card: str = "") -> ExportResult:
    """Writes a directory that Transformers' XLNetLMHeadModel and AutoTokenizer load with from_pretrained, from
    the weights of cfg.checkpoint (a TensorFlow checkpoint, or a Transformers directory: train_torch's; see `write`).
    An existing export is refused unless cfg.overwrite."""
    from xlnet_data.pretrain import checkpoints
    from xlnet_data.pretrain.modeling import variable_shapes

    config_path = os.path.join(cfg.output_dir, CONFIG_FILE)
    if not cfg.overwrite and (fileio.exists(config_path) or fileio.exists(os.path.join(cfg.output_dir, WEIGHTS_FILE))):
        raise HFFormatError(f"--output_dir={cfg.output_dir} already holds an export; use --overwrite or a new dir")
    hf_config(cfg.model, cfg.run)  # refuses a shape Transformers cannot hold, before any reading
    if is_hf_dir(cfg.checkpoint):  # train_torch's model_dir or checkpoint dir: Transformers' tensors, checked
        weights = from_hf(read_tensors(cfg.checkpoint), cfg.model, os.path.join(cfg.checkpoint, WEIGHTS_FILE))
    else:
        weights = checkpoints.read(cfg.checkpoint, variable_shapes(cfg.model))
    return write(cfg, to_hf(weights, cfg.model), model_card)


def write(cfg: ExportConfig, tensors: Mapping[str, np.ndarray], model_card: str = "") -> ExportResult:
    """The one writer of a Transformers directory (export_hf's exports, train_torch's checkpoints): `tensors`
    (Transformers' names, float32, without the tied lm_loss.weight) in model.safetensors, config.json with cfg.run,
    the training run's settings (cfg.pretraining) in PRETRAINING_FILE, the tokenizer of cfg.sp_path (none where it
    is empty), `model_card` in README.md. Each file is written under a temporary name and renamed; config.json
    comes last, so a directory without it is incomplete."""
    st_numpy = _safetensors_numpy()
    config = hf_config(cfg.model, cfg.run)
    tokenizer = hf_tokenizer.tokenizer_files(cfg.sp_path, cfg.uncased, cfg.keep_accents) if cfg.sp_path else {}
    if tokenizer:
        num_pieces = len(hf_tokenizer.read_model_proto(tokenizer["spiece.model"]).pieces)
        if num_pieces != cfg.model.n_token:
            raise HFFormatError(f"--sp_path={cfg.sp_path} has {num_pieces} pieces, the model's vocabulary is "
                                f"{cfg.model.n_token} (n_token): give the SentencePiece model the records were made "
                                "with")
    fileio.makedirs(cfg.output_dir)
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}
    contents = {**tokenizer, WEIGHTS_FILE: st_numpy.save(tensors, metadata={"format": "pt"})}
    if cfg.pretraining:
        contents[PRETRAINING_FILE] = _json_bytes({key: getattr(cfg.pretraining, key) for key in PRETRAINING_KEYS})
    if model_card:
        contents[MODEL_CARD_FILE] = model_card.encode("utf-8")
    contents[CONFIG_FILE] = _json_bytes(config)
    for name, content in contents.items():
        with fileio.atomic_write(os.path.join(cfg.output_dir, name)) as f:
            f.write(content)
    return ExportResult(list(contents), len(tensors), sum(value.size for value in tensors.values()))
