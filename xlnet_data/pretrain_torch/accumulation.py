"""Gradient accumulation (--gradient_accumulation_steps=K) in PyTorch, as train_gpu's pretrain/accumulation.py: a
replica's rows in K micro-batches of rows, run one after the other, for one update.

Micro-batch k holds part k of each half of the replica's rows (with bi_data the first half is forward rows and the
second their backward rows, the model's layout; without it one half: all rows), the same rows of the memories (axis
1, time-major) and gives its next memories back to those rows. Each micro-batch's loss is its targets' summed losses
over the replica's count of targets, so the K losses and their gradients add up to one pass's target-weighted mean
(to float rounding). Not Hugging Face's accumulation over consecutive batches: for XLNet those are the next segments
of the same rows, whose memories need the earlier ones' output.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor


def micro_rows(value: Tensor, k: int, steps: int, n_dir: int, axis: int = 0) -> Tensor:
    """Micro-batch k of `steps` of the rows of `value` on `axis`: part k of each of its n_dir halves."""
    shape = value.shape
    parts = value.reshape(*shape[:axis], n_dir, steps, -1, *shape[axis + 1:])
    return parts.select(axis + 1, k).reshape(*shape[:axis], -1, *shape[axis + 1:])


def join_micro_rows(parts: list[Tensor], n_dir: int, axis: int = 0) -> Tensor:
    """The inverse of micro_rows: the K micro-batches' tensors -> the tensor of all rows, in order."""
    shape = parts[0].shape
    split = [part.reshape(*shape[:axis], n_dir, -1, *shape[axis + 1:]) for part in parts]
    joined = torch.stack(split, dim=axis + 1)  # [..., n_dir, steps, rows per part, ...]
    return joined.reshape(*shape[:axis], -1, *shape[axis + 1:])


def forward_backward(model: torch.nn.Module, features: dict[str, Tensor], mems: Optional[list[Tensor]], steps: int,
                     bi_data: bool, autocast=contextlib.nullcontext, no_sync=contextlib.nullcontext,
                     num_targets: Optional[float] = None, replicas: int = 1) -> tuple[Tensor, Optional[list[Tensor]]]:
    """On one replica: backward of the target-weighted mean loss of its rows, in `steps` micro-batches (the
    gradients add up in .grad); returns (the loss, detached; the next memories of all rows).

    autocast: a function giving the context each forward pass runs in (bfloat16's torch.autocast). no_sync: a
    function giving a context that holds DDP's all-reduce back (DistributedDataParallel.no_sync), entered for every
    micro-batch but the last. num_targets: the step's targets over all `replicas` ranks (default: this rank's): each
    rank's losses are weighted by it and its gradient scaled by `replicas`, so that DDP's mean over the ranks is the
    gradient of the step's one target-weighted mean, whatever each rank's count (the returned loss is this rank's
    share of it: their sum is the step's loss)."""
    n_dir = 2 if bi_data else 1
    if num_targets is None:
        num_targets = features["target_mask"].float().sum()
    loss = torch.zeros((), device=features["target_mask"].device)
    new_mems = []
    for k in range(steps):
        micro = {key: micro_rows(value, k, steps, n_dir) for key, value in features.items()}
        micro_mems = None if mems is None else [micro_rows(mem, k, steps, n_dir, axis=1) for mem in mems]
        with no_sync() if k < steps - 1 else contextlib.nullcontext():
            with autocast():
                out = model(micro, micro_mems)
                share = (out.token_loss * micro["target_mask"].float()).sum() / num_targets
            (share * replicas if replicas > 1 else share).backward()
        loss += share.detach()
        new_mems.append(out.new_mems)
    if mems is None or new_mems[0] is None:
        return loss, None
    return loss, [join_micro_rows([layers[i] for layers in new_mems], n_dir, axis=1) for i in range(len(mems))]
