"""Several GPUs and machines: torchrun's processes, one per device, joined by torch.distributed (nccl on GPUs,
gloo on CPUs) and DistributedDataParallel; no transport of our own.

    python -m torch.distributed.run --nproc_per_node=8 -m xlnet_data.train_torch ...          # one machine
    torchrun --nnodes=2 --node_rank=R --master_addr=HOST --master_port=29500 --nproc_per_node=8 -m ...   # two

Each rank reads its own rows of every step, as train_gpu's replicas do (pretrain_torch/data.py's ReplicaSource with
num_replicas=world_size, replica=rank), and keeps their memories; DDP all-reduces the gradients. Only the chief
(rank 0) writes checkpoints, summaries and best/.

What the command (train_torch.py) and the loop (training.py) call:

    ranks = start(device)               the process group of torchrun's environment; one process without it
    model = wrap(module, ranks)         DDP over the ranks (the module itself with one rank)
    all_sum(values, ranks)              float64 sums over the ranks (the held-out losses, the steps' target counts)
    check_same_start(step, ranks, model_dir)   ConfigError when a rank would start from another step
    finish(ranks)                       the ranks meet once more and leave the group
    LOST_RANK_ERRORS, lost_rank_message(err, model_dir)   a rank lost mid-run, in one line
    leave_lost_run(status)              ends a process whose group lost a peer, with `status`
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from xlnet_data.common.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
# How long a collective waits for a rank that neither answers nor closes its connections (a machine gone dark);
# a rank that ends closes them, and its peers fail at once.
TIMEOUT = datetime.timedelta(minutes=10)


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among the run's processes."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def chief(self) -> bool:
        """The rank that writes (checkpoints, summaries, best/)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit():
        raise ConfigError(f"the environment variable {name}={value!r} must be a number (torchrun sets it)")
    return int(value)


def start(device: str = "auto") -> Ranks:
    """This process's Ranks: torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), its process
    group joined with nccl on GPUs and gloo on CPUs; without torchrun one process. device: auto (each rank the GPU
    of its LOCAL_RANK where there are GPUs, else the CPU), cpu or cuda."""
    if device not in DEVICES:
        raise ConfigError(f"--device={device} must be one of {', '.join(DEVICES)}")
    rank, world_size, local_rank = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} must be in [0, WORLD_SIZE={world_size}): start the processes with torchrun")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ConfigError("--device=cuda: this machine has no GPU that torch can use (torch.cuda.is_available() "
                              "is False); use --device=cpu")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local_rank}, but this machine has {torch.cuda.device_count()} GPU(s): "
                              "give torchrun --nproc_per_node at most that many")
        placed = torch.device("cuda", local_rank)
        torch.cuda.set_device(placed)
    else:
        placed = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size, timeout=TIMEOUT,
                                **({"device_id": placed} if use_cuda else {}))
    return Ranks(rank, world_size, local_rank, placed)


def wrap(module: torch.nn.Module, ranks: Ranks) -> torch.nn.Module:
    """The module under DDP where there are several ranks (its gradients averaged over them at each backward
    pass; the loop's accumulation runs the micro-batches but the last under DDP's no_sync), else itself."""
    if not ranks.distributed:
        return module
    return DistributedDataParallel(module, device_ids=[ranks.device.index] if ranks.device.type == "cuda" else None)


def all_sum(values, ranks: Ranks) -> np.ndarray:
    """The float64 sums over the ranks of each rank's `values` (numbers or a 1-d array), the same on every rank
    whatever their count: the held-out losses, the steps' target counts."""
    local = torch.as_tensor(np.asarray(values, dtype=np.float64))
    if not ranks.distributed:
        return local.numpy()
    on_device = local.to(ranks.device)
    dist.all_reduce(on_device)
    return on_device.cpu().numpy()


def check_same_start(step: int, ranks: Ranks, model_dir: str) -> None:
    """Every rank must start from the step the chief starts from, which it does when it reads the chief's
    checkpoints: a rank that cannot see them would train other weights, silently."""
    if not ranks.distributed:
        return
    steps = [torch.zeros((), dtype=torch.int64, device=ranks.device) for _ in range(ranks.world_size)]
    dist.all_gather(steps, torch.tensor(step, dtype=torch.int64, device=ranks.device))
    found = [int(value) for value in steps]
    if len(set(found)) > 1:
        raise ConfigError(f"the ranks start from different steps ({', '.join(map(str, found))}, rank by rank): "
                          f"--model_dir={model_dir} must be one folder that every machine sees (a shared filesystem)")


def finish(ranks: Ranks) -> None:
    """The ranks meet once more (the chief's last checkpoint written) and leave the process group."""
    if ranks.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# What a collective raises on the other ranks when one rank dies: gloo and nccl's errors (DistBackendError, and
# RuntimeError of older builds and of gloo's transport).
LOST_RANK_ERRORS = (dist.DistError, RuntimeError)
_LOST = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|remote process exited|NCCL communicator was "
                   r"aborted|Socket Timeout|timed out|ProcessGroup.*(?:aborted|shut ?down)", re.IGNORECASE)


def is_lost_rank(err: BaseException) -> bool:
    """Whether `err` (one of LOST_RANK_ERRORS) says that a peer rank is gone, rather than a bug."""
    return isinstance(err, LOST_RANK_ERRORS) and bool(_LOST.search(str(err)))


def lost_rank_message(err: BaseException, ranks: Ranks, model_dir: str) -> str:
    """One line for a run that lost a rank: which rank saw it, the backend's reason, how to go on."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reason = next((line for line in lines if _LOST.search(line)), lines[0] if lines else type(err).__name__)
    reason = re.sub(r"^\[[^\]]*\]\s*", "", reason).split(". ")[0]  # gloo's source line off, its first sentence
    return (f"rank {ranks.rank} of {ranks.world_size} lost a peer ({reason[:200]}); every rank stops: start them all "
            f"again to resume from the last checkpoint in {model_dir}")


def leave_lost_run(status: int):
    """Ends the process now with `status`, its output flushed, skipping the interpreter's exit: a process group
    that lost a peer can abort that exit from its own threads (gloo: `terminate called without an active
    exception`, status -6 instead of `status`, in about one run of five on a loaded 2-core machine)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
