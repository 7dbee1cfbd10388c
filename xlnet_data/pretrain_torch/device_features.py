"""The permutation features made on the device: perm_mask and target_mapping from what examples.shipped gives the
host to copy (rev_index [n, seq_len] int32 and input_q), by one comparison each, equal to examples.features' to the
bit. The host then copies seq_len ints a row instead of (seq_len + num_predict) x seq_len floats (a row of XLNet-Base's
shape, 512 and 85, is 8.7 KiB with the other features instead of 1.2 MB), and makes them on none of its cores.

    batch = on_device(source.next_batch(), device, cfg.data.num_predict)   # the module's features, on the device
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor


def expand(batch: dict[str, Tensor], num_predict: Optional[int]) -> dict[str, Tensor]:
    """examples.shipped's features (tensors) -> examples.features': rev_index replaced by perm_mask [n, seq_len,
    seq_len] float32 (i may not attend to j when threshold_i <= rev_index_j, threshold being rev_index + 1, less one
    where i is predicted) and, with num_predict, target_mapping [n, num_predict, seq_len] float32 (row k one-hot
    on the k-th predicted position, zero rows after the last)."""
    out = {name: value for name, value in batch.items() if name != "rev_index"}
    rev_index = batch["rev_index"]
    predicted = batch["input_q"] != 0
    threshold = rev_index + 1 - predicted.to(rev_index.dtype)
    out["perm_mask"] = (threshold[:, :, None] <= rev_index[:, None, :]).float()
    if num_predict is not None:
        slot = torch.cumsum(predicted, 1) - 1  # each predicted position's row of target_mapping
        rows = torch.arange(num_predict, device=slot.device)
        out["target_mapping"] = ((slot[:, None, :] == rows[:, None]) & predicted[:, None, :]).float()
    return out


def on_device(batch: dict[str, np.ndarray], device: torch.device, num_predict: Optional[int]) -> dict[str, Tensor]:
    """A batch of examples.shipped (numpy) on the device, expanded there into the module's features."""
    return expand({name: torch.from_numpy(value).to(device) for name, value in batch.items()}, num_predict)
