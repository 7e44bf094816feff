"""Which process am I: ranks, shards and model placement for data-parallel evaluation.

``accelerate launch`` and ``torchrun`` start one process per GPU (per node, with
``--num_machines`` / ``--nnodes``) and tell each its place through ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``. :func:`init` turns that into a
:class:`Ranks`, creating the process group through accelerate's ``PartialState``: NCCL on
GPUs, gloo on a machine without an accelerator. Choices:

* **Shards by sample key, not by position.** :func:`shard_of` hashes a query's id
  (SHA-256, never Python's per-process salted ``hash``), so a sample lands on the same
  rank whatever the order of the query list, whatever ``--limit`` or other suites sit
  beside it, and every process computes the assignment alone -- no coordination, so no
  way for two ranks to disagree about who answers what.
* **CPU-only hosts need ``cpu=True``.** accelerate only takes its gloo path when told the
  run is on CPU; ``accelerate launch --cpu`` itself starts a *single* process, so on a CPU
  machine two processes come from ``accelerate launch --multi_gpu --num_processes 2`` (or
  ``torchrun --nproc_per_node 2``) and :func:`init` asks for CPU when no accelerator exists.
* **A long barrier timeout** (:data:`BARRIER_TIMEOUT`). A rank whose shard is done, or
  already answered by an earlier run, waits at the barrier for the slowest rank; with
  torch's default (10 minutes for NCCL, 30 for gloo) a long evaluation would abort. A rank that dies does not leave the
  others hanging: the launcher's elastic agent stops the whole group.
* **One process per GPU slice with ``device_map="auto"``.** :func:`placement` gives each
  process its own GPU (``cuda:<local rank>``), or, for a model split with
  ``device_map="auto"``, its own contiguous slice of the node's GPUs (8 GPUs, 2 processes
  per node: GPUs 0-3 and 4-7), so data parallelism across processes and model parallelism
  inside one compose.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

BARRIER_TIMEOUT = datetime.timedelta(days=7)
"""How long a rank waits for the others (see the module docstring)."""


def _no_barrier() -> None:
    return None


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run. The default is a single process.

    ``barrier`` blocks until every rank has called it; in one process it returns at once.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    barrier: Callable[[], None] = field(default=_no_barrier, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local_rank must be in [0, {self.local_world_size}), got {self.local_rank}")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def owns(self, key: str) -> bool:
        """Whether the sample with id ``key`` is this rank's to answer."""
        return self.world_size == 1 or shard_of(key, self.world_size) == self.rank


def shard_of(key: str, world_size: int) -> int:
    """The rank (of ``world_size``) that answers the sample with id ``key``: stable across
    processes, machines and Python versions, and independent of list order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    digest = hashlib.sha256(str(key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % world_size


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def _has_accelerator() -> bool:
    """A device accelerate runs a process group on (CUDA, XPU, NPU, ...; not Apple's MPS)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        device = accelerator.current_accelerator()
        return device is not None and device.type != "mps"
    return torch.cuda.is_available()


def init() -> Ranks:
    """The :class:`Ranks` of this process.

    Launched by ``accelerate launch`` / ``torchrun`` (``WORLD_SIZE`` > 1): creates the
    process group through accelerate's ``PartialState`` (which also selects this rank's
    GPU). A group the caller made (an ``Accelerator``, ``init_process_group``) is used as it
    is. A plain ``python`` run gets the single-process default without importing accelerate.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if _env_int("WORLD_SIZE", 1) <= 1:
            return Ranks()
        from accelerate import PartialState

        PartialState(cpu=not _has_accelerator(), timeout=BARRIER_TIMEOUT)
        if not dist.is_initialized():
            raise RuntimeError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate made no process group")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return Ranks()
    local_world = _env_int("LOCAL_WORLD_SIZE", 0) or world  # both launchers set it
    local_rank = _env_int("LOCAL_RANK", rank % local_world)
    return Ranks(rank=rank, world_size=world, local_rank=local_rank,
                 local_world_size=max(local_world, local_rank + 1), barrier=dist.barrier)


def finish(ranks: Ranks) -> None:
    """Tear the process group down at the end of a command (saves torch's exit warning)."""
    if ranks.world_size == 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        ranks.barrier()
        dist.destroy_process_group()


def gpu_slice(n_gpus: int, local_rank: int, local_world_size: int) -> list[int]:
    """The GPUs of a node that process ``local_rank`` of ``local_world_size`` may use for
    a ``device_map="auto"`` model: an equal, contiguous, disjoint share (leftovers unused)."""
    per = n_gpus // local_world_size
    if per < 1:
        raise ValueError(
            f"device_map='auto' with {local_world_size} processes on a node with {n_gpus} GPU(s): each process "
            "needs at least one GPU of its own; launch fewer processes per node")
    return list(range(local_rank * per, (local_rank + 1) * per))


def placement(ranks: Ranks, load_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``load_hf`` keyword arguments that keep this rank on its own GPU(s).

    With several processes and GPUs: no ``device`` / ``device_map`` given -> ``cuda:<local
    rank>``; ``device_map="auto"`` -> ``max_memory`` limited to this process's
    :func:`gpu_slice`. One process, no GPU, or an explicit placement: unchanged.
    """
    import torch

    kwargs = dict(load_kwargs)
    if ranks.world_size == 1 or not torch.cuda.is_available():
        return kwargs
    if kwargs.get("device_map") == "auto" and "max_memory" not in kwargs:
        gpus = gpu_slice(torch.cuda.device_count(), ranks.local_rank, ranks.local_world_size)
        kwargs["max_memory"] = {g: torch.cuda.mem_get_info(g)[0] for g in gpus}
    elif kwargs.get("device") is None and kwargs.get("device_map") is None:
        kwargs["device"] = f"cuda:{ranks.local_rank % torch.cuda.device_count()}"
    return kwargs
