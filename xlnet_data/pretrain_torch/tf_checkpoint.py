"""TensorFlow checkpoints without TensorFlow: the released XLNet-Base/Large TF1 checkpoints and train_gpu's model_dirs
as a PyTorch XLNet's weights (train_torch --init_checkpoint).

A checkpoint PREFIX is a tensor bundle: PREFIX.index, a LevelDB table (sorted keys, blocks of prefix-compressed
entries with restart points, each block followed by its compression byte and masked CRC32C; a footer with the index
block's place) whose values are BundleEntryProto messages (dtype, shape, shard, offset, size, masked CRC32C of the
bytes), the key "" the BundleHeaderProto; and PREFIX.data-SSSSS-of-NNNNN, the tensors' raw little-endian bytes.
TensorFlow writes the table uncompressed; a snappy-compressed block is refused with a message. Every CRC is checked.

    tensors = read(path)                              # {name: np.ndarray}; path: a prefix or a model_dir
    load_original(model, path)                        # the original's names -> the module (via pretrain/hf.py links)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping

import numpy as np
import torch

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.crc32c import masked_crc32c
from xlnet_data.dataformat.spm_model import fields, varint
from xlnet_data.pretrain import hf

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_BLOCK_TRAILER_LEN = 5  # compression type, masked CRC32C
# TensorFlow's DataType enum -> numpy (bfloat16, which numpy lacks, is read as float32)
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
           10: np.bool_, 14: "bfloat16", 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
_DT_STRING = 7


class TFCheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read, or does not fit the model: names the file or the variable."""


def _crc_ok(data: bytes, stored: int) -> bool:
    return int(masked_crc32c(np.frombuffer(data, dtype=np.uint8), 0, len(data))) == stored


def _block(table: bytes, handle: bytes, where: str) -> bytes:
    """The contents of the block at a BlockHandle (varint offset, varint size), its CRC checked."""
    offset, pos = varint(handle, 0)
    size, _ = varint(handle, pos)
    end = offset + size
    if end + _BLOCK_TRAILER_LEN > len(table):
        raise ValueError(f"a block runs past the end of {where} (cut short?)")
    contents, compression = table[offset:end], table[end]
    if not _crc_ok(table[offset:end + 1], int.from_bytes(table[end + 1:end + 5], "little")):
        raise ValueError(f"a block of {where} fails its CRC32C (a damaged file)")
    if compression:
        raise ValueError(f"{where} has a compressed block (type {compression}); TensorFlow writes none: "
                         "rewrite the checkpoint with TensorFlow")
    return contents


def _entries(block: bytes):
    """(key, value) of a table block: entries of (shared, unshared, value length) varints, the key's unshared
    tail and the value; the restart array at the end (uint32 offsets, then their count) ends the entries."""
    num_restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 * (num_restarts + 1)
    pos, key = 0, b""
    while pos < end:
        shared, pos = varint(block, pos)
        unshared, pos = varint(block, pos)
        value_len, pos = varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_len]
        pos += value_len


def _table(path: str) -> dict[bytes, bytes]:
    """Every (key, value) of a LevelDB table file."""
    with open(path, "rb") as f:
        table = f.read()
    if len(table) < _FOOTER_LEN or int.from_bytes(table[-8:], "little") != _TABLE_MAGIC:
        raise ValueError(f"{path} is not a TensorFlow checkpoint index (no table footer)")
    footer = table[-_FOOTER_LEN:]
    pos = varint(footer, varint(footer, 0)[1])[1]  # past the metaindex handle (two varints), unused
    end = varint(footer, varint(footer, pos)[1])[1]
    index_handle = footer[pos:end]
    out = {}
    for _, handle in _entries(_block(table, index_handle, path)):
        out.update(_entries(_block(table, handle, path)))
    return out


def _shape(message: bytes) -> tuple[int, ...]:
    dims = []
    for number, value in fields(message):
        if number == 2:  # dim { size }
            dims.append(next((size for n, size in fields(value) if n == 1), 0))
    return tuple(dims)


def _strings(raw: bytearray, shape: tuple[int, ...]) -> tuple[np.ndarray, bytes]:
    """A string tensor (varint64 lengths, their masked CRC32C, then the bytes) and the bytes its entry's CRC32C
    covers: TensorFlow's WriteStringTensor checksums each length as a little-endian uint32 (a uint64 past 2**32-1),
    not as the varint it writes, then the lengths' stored checksum and the strings' bytes."""
    pos, lengths = 0, []
    for _ in range(int(np.prod(shape))):
        length, pos = varint(raw, pos)
        lengths.append(length)
    widths = b"".join(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, "little") for length in lengths)
    lengths_crc, pos = bytes(raw[pos:pos + 4]), pos + 4
    values = []
    for length in lengths:
        values.append(bytes(raw[pos:pos + length]))
        pos += length
    return np.array(values, dtype=object).reshape(shape), widths + lengths_crc + b"".join(values)


def _array(raw: bytearray, dtype: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    if dtype not in _DTYPES:
        raise ValueError(f"{name} has TensorFlow dtype {dtype}, which this reader does not know")
    if _DTYPES[dtype] == "bfloat16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(_DTYPES[dtype]).newbyteorder("<")).reshape(shape)


def resolve(path: str) -> str:
    """The checkpoint prefix of `path`: itself, or the newest that a model_dir's `checkpoint` file lists (a relative
    entry is the dir's; an absolute one that is gone is looked for in the dir by its name, a dir since moved)."""
    if not os.path.isdir(path):
        return path
    state = os.path.join(path, "checkpoint")
    if not os.path.isfile(state):
        raise TFCheckpointError(f"{path} is a directory without a `checkpoint` file: give a checkpoint prefix "
                                "(.../model.ckpt-1000) or a model_dir")
    with open(state, encoding="utf-8") as f:
        found = re.search(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', f.read(), re.M)
    if not found:
        raise TFCheckpointError(f"{state} names no model_checkpoint_path")
    prefix = found.group(1).encode("latin-1").decode("unicode_escape")
    if not os.path.isabs(prefix):
        return os.path.join(path, prefix)
    here = os.path.join(path, os.path.basename(prefix))
    return here if not os.path.isfile(prefix + ".index") and os.path.isfile(here + ".index") else prefix


def read(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a TensorFlow checkpoint (a prefix or a model_dir), by name; strings as object arrays of
    bytes, bfloat16 as float32. TFCheckpointError (one line, naming the file) for a missing, cut or damaged one."""
    prefix = resolve(path)
    try:
        entries = _table(prefix + ".index")
        header = dict(fields(entries.pop(b"", b"")))
        if header.get(2, 0):
            raise ValueError(f"{prefix}.index: a big-endian checkpoint; this reader reads little-endian ones")
        num_shards = header.get(1, 1)
        out = {}
        with contextlib.ExitStack() as files:
            shards = {}
            for key, value in entries.items():
                name = key.decode("utf-8")
                entry = dict(fields(value))
                if 7 in entry:
                    raise ValueError(f"{name} is saved in slices (a partitioned variable), which this reader does not "
                                     "read")
                shard = entry.get(3, 0)
                data_path = f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"
                if shard not in shards:
                    shards[shard] = files.enter_context(open(data_path, "rb"))
                # Read into a buffer of its own, which the array keeps: one copy of each tensor, none of the file
                # (a released XLNet-Large is 1.4 GB).
                raw = bytearray(entry.get(5, 0))
                shards[shard].seek(entry.get(4, 0))
                if shards[shard].readinto(raw) != len(raw):
                    raise ValueError(f"the data of {name} runs past the end of {data_path} (cut short?)")
                dtype, shape = entry.get(1, 0), _shape(entry.get(2, b""))
                if dtype == _DT_STRING:
                    out[name], covered = _strings(raw, shape)
                else:
                    out[name], covered = _array(raw, dtype, shape, name), raw
                if 6 in entry and not _crc_ok(covered, int.from_bytes(entry[6], "little")):
                    raise ValueError(f"{name} fails its CRC32C in {data_path} (a damaged file)")
    except OSError as err:
        raise TFCheckpointError(f"cannot read checkpoint {prefix}: {err.strerror or err}: give a checkpoint prefix "
                                "(.../model.ckpt-1000, beside its .index and .data files) or a model_dir") from None
    except (ValueError, IndexError) as err:  # IndexError: a table cut inside an entry
        raise TFCheckpointError(f"cannot read checkpoint {prefix}: {err}") from None
    return out


def original_state_dict(tensors: Mapping[str, np.ndarray], model: torch.nn.Module, source: str) -> dict[str, torch.Tensor]:
    """The original's variables (model/transformer/layer_0/rel_attn/q/kernel, ...; optimizer slots and the rest
    ignored) as the state_dict of `model`, a PyTorch XLNet (Transformers' names, lm_loss.weight tied), each checked
    against its parameter's shape. TFCheckpointError lists the missing and misshapen variables."""
    config, shapes = model.config, {name: tuple(value.shape) for name, value in model.state_dict().items()}
    problems = []
    for link in hf.links(config):
        want = shapes[link.hf][::-1] if link.transpose else shapes[link.hf]
        want = (config.n_layer, *want) if link.layer is not None else want
        if link.ours not in tensors:
            problems.append(f"{link.ours}: missing (expected shape {list(want)})")
        elif tuple(tensors[link.ours].shape) != want:
            problems.append(f"{link.ours}: expected shape {list(want)}, found {list(tensors[link.ours].shape)}")
    if problems:  # a variable stacked per layer is linked once per layer: each problem once
        raise TFCheckpointError(f"checkpoint {source} does not fit the model: " + "; ".join(dict.fromkeys(problems)))
    state = {name: torch.from_numpy(value) for name, value in hf.to_hf(tensors, config).items()}
    state["lm_loss.weight"] = state["transformer.word_embedding.weight"]
    return state


def load_original(model: torch.nn.Module, path: str) -> str:
    """Loads a TensorFlow checkpoint of the original's variable names (a released XLNet, a train_gpu model_dir)
    into `model`, a PyTorch XLNet; returns the prefix read."""
    prefix = resolve(path)
    model.load_state_dict(original_state_dict(read(prefix), model, prefix))
    return prefix
