"""Data-parallel training helpers (torchrun / DistributedDataParallel); no-ops in one process.

``torchrun --nproc_per_node=N -m nmt.cli.train -config C.yaml`` starts N processes with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and a rendezvous (``MASTER_ADDR``/``MASTER_PORT``) in
their environment; :func:`init_distributed` joins them into one process group (NCCL when the
training device is CUDA, Gloo otherwise) plus a Gloo group for host-side control values, so
agreeing on token counts and stop decisions never touches, or waits for, the accelerator.
Without that environment every helper here returns at once (``world_size == 1``).

Batching contract (see :func:`shard_batch`): all ranks cut the *same* seeded batch order with
the effective batch size ``N x batch_size``; rank ``r`` takes the ``r``-th of N contiguous,
nearly equal parts of every global batch. With the loss of each rank divided by the global
number of target tokens over ``N`` (:func:`loss_normalizer`, DDP averages gradients over ranks),
N processes with batch B make the update of one process with batch ``N x B`` (up to the order
of floating-point sums).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
TIMEOUT = timedelta(minutes=60)  # a rank waits this long at a collective (e.g. while rank 0 scores a validation)

STOP_REASONS = ("SIGINT", "SIGTERM", "nan_loss", "max_minutes", "early_stopping", "max_steps", "max_epochs")
"""Stop reasons, most urgent first; the ranks agree on the most urgent reason any of them has."""


@dataclass
class DistributedContext:
    """Where this process is in the job. ``world_size == 1``: a plain single-process run.

    rank: global rank (0 writes checkpoints, logs, metrics, TensorBoard and scores the validations,
    whose batches every rank shares);
    local_rank: rank on this node (selects ``cuda:local_rank``, or ``cuda:0`` where a process sees
    one GPU only: see :func:`init_distributed`); control: the Gloo group for host-side values
    (None in one process).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    control: Any = field(default=None, repr=False)
    cuda_index: int | None = None
    """The CUDA device this process trains on (None: LOCAL_RANK's, see :func:`rank_device`)."""

    @property
    def enabled(self) -> bool:
        """True when more than one process trains."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the rank that writes files and scores the validations)."""
        return self.rank == 0

    # ----------------------------------------------------------- collectives
    def barrier(self) -> None:
        """Wait for every rank (host side, Gloo); no-op in one process."""
        if self.enabled:
            dist.barrier(group=self.control)

    def sum_ints(self, values: Sequence[int]) -> list[int]:
        """Element-wise sum of host integers over ranks (Gloo, no device sync)."""
        if not self.enabled:
            return [int(v) for v in values]
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.control)
        return tensor.tolist()  # a CPU tensor: no accelerator involved

    def sum_tensor_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum of ``tensor`` over ranks on the default group (its device); returns it."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_true(self, flag: torch.Tensor) -> torch.Tensor:
        """A 0-d bool tensor: ``flag`` of every rank AND-ed (an all-reduce on its device, no host sync)."""
        if not self.enabled:
            return flag
        as_int = flag.to(torch.int32)
        dist.all_reduce(as_int, op=dist.ReduceOp.MIN)
        return as_int.bool()

    def agree_stop(self, reason: str | None) -> str | None:
        """The stop reason every rank uses: the most urgent of :data:`STOP_REASONS` any rank has.

        Called at the same point of the loop on every rank (one Gloo all-reduce of one int),
        so a signal, the time budget or a NaN seen by one rank stops all of them at the same
        step. Returns None when no rank wants to stop.
        """
        if not self.enabled:
            return reason
        code = STOP_REASONS.index(reason) if reason is not None else len(STOP_REASONS)
        tensor = torch.tensor([code], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.control)
        agreed = int(tensor[0])
        return STOP_REASONS[agreed] if agreed < len(STOP_REASONS) else None

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank."""
        if not self.enabled:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """``[value of rank 0, ..., value of rank N-1]`` on rank 0, None elsewhere."""
        if not self.enabled:
            return [value]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, out, dst=0, group=self.control)
        return out

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


class NullLock:
    """The save_dir lock of ranks > 0 in a data-parallel job: rank 0 holds the real one."""

    def release(self) -> None:
        """Nothing to release."""


def torchrun_environment(environ: dict | None = None) -> bool:
    """True when the process was started by torchrun (RANK, WORLD_SIZE and LOCAL_RANK set)."""
    environ = os.environ if environ is None else environ
    return all(name in environ for name in TORCHRUN_VARIABLES)


def several_processes(environ: dict | None = None) -> bool:
    """True when torchrun started this process as one of several (WORLD_SIZE > 1)."""
    environ = os.environ if environ is None else environ
    try:
        return torchrun_environment(environ) and int(environ["WORLD_SIZE"]) > 1
    except ValueError:  # not an integer: init_distributed says so
        return True


def rank_cuda_index(local: int, count: int, environ: dict | None = None) -> int:
    """The CUDA device of the process of local rank ``local`` among ``count`` visible devices:
    ``local``; or 0 where the launcher gave each process its own GPU, the only one it sees
    (``CUDA_VISIBLE_DEVICES`` naming one device, as SLURM's per-task GPU binding does). ValueError
    (one line) where there are fewer GPUs than processes on the node."""
    environ = os.environ if environ is None else environ
    if local < count:
        return local
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if count == 1 and len(visible) == 1:
        return 0
    raise ValueError(f"torchrun environment: LOCAL_RANK={local} but this machine has "
                     f"{count} CUDA device(s); start at most one process per GPU "
                     f"(--nproc_per_node) or set training.device: cpu")


def init_distributed(device_type: str) -> DistributedContext:
    """Join the torchrun job described by the environment; a single-process context otherwise.

    device_type: "cuda" or "cpu", the training device; selects the backend (NCCL / Gloo) and,
    for CUDA, sets the current device to the process's GPU (:func:`rank_cuda_index`). Raises
    ValueError (one line) for an inconsistent environment.
    """
    if not torchrun_environment():
        return DistributedContext()
    try:
        rank, world, local = (int(os.environ[name]) for name in TORCHRUN_VARIABLES)
    except ValueError:
        raise ValueError("torchrun environment: RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    if not 0 <= rank < world:
        raise ValueError(f"torchrun environment: RANK={rank} is not in [0, WORLD_SIZE={world})")
    if world == 1:
        return DistributedContext(0, 1, local)
    if not dist.is_available():
        raise ValueError("torch.distributed is not available in this torch build")
    backend = "nccl" if device_type == "cuda" else "gloo"
    index = None
    if backend == "nccl":
        index = rank_cuda_index(local, torch.cuda.device_count())
        torch.cuda.set_device(index)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend != "gloo" else dist.group.WORLD
    logger.info("distributed training: rank %d of %d (local rank %d), backend %s", rank, world, local, backend)
    return DistributedContext(rank, world, local, control, index)


def rank_device(context: DistributedContext, device: torch.device) -> torch.device:
    """The device of this rank: its own GPU (``cuda:local_rank``, or the one it sees) for a CUDA
    run with several processes; ``device`` otherwise."""
    if context.enabled and device.type == "cuda":
        return torch.device("cuda", context.local_rank if context.cuda_index is None else context.cuda_index)
    return device


def wrap_model(model: torch.nn.Module, context: DistributedContext) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` with several processes (parameters broadcast from
    rank 0, gradients averaged over ranks in backward); ``model`` itself in one process."""
    if not context.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def in_rank_order(context: DistributedContext, load: Callable[[], Any]) -> Any:
    """Run ``load()`` on rank 0 first, then on the first rank of every other node, then on the
    rest (barriers between), so whatever ``load`` builds once and caches (tokenizers, token-id
    arrays, generated data) is built by one process per node and read by the others."""
    if not context.enabled:
        return load()
    result = None
    for stage in range(3):
        mine = 0 if context.is_main else 1 if context.local_rank == 0 else 2
        if mine == stage:
            result = load()
        context.barrier()
    return result


def distributed_state(context: DistributedContext, config: dict, rng_states: list[dict] | None) -> dict:
    """What a checkpoint records about the processes: their number, the per-process batch
    size and (several processes) the RNG states of every rank, rank order."""
    state: dict[str, Any] = {"world_size": context.world_size, "batch_size": config["training"]["batch_size"]}
    if context.enabled and rng_states is not None:
        state["rng"] = rng_states
    return state


def resume_check(checkpoint: dict, config: dict, context: DistributedContext, source: str) -> set[str]:
    """Check that this job can resume ``checkpoint``; returns config keys it vets (may differ).

    The same number of processes resumes exactly (every rank restores its own RNG states).
    Another number is accepted when the effective batch ``processes x batch_size`` is the
    same (so the global batch order, and the data position stored as a global batch index, is
    unchanged); training.batch_size may then differ from the run's. Rank 0 continues rank 0's
    random streams, the others start new ones (dropout masks differ from an uninterrupted
    run). Raises ConfigError (one line) otherwise.
    """
    from nmt.config import ConfigError

    saved = checkpoint.get("trainer", {}).get("distributed") or {
        "world_size": 1, "batch_size": checkpoint["config"]["training"]["batch_size"]}
    world, batch = context.world_size, config["training"]["batch_size"]
    effective = saved["world_size"] * saved["batch_size"]
    if world == saved["world_size"]:
        return set()
    if world * batch != effective:
        hint = (f"set training.batch_size to {effective // world}" if effective % world == 0
                else f"resume with {saved['world_size']} process(es)")
        raise ConfigError(source, "training.batch_size",
                          f"the run was trained with {saved['world_size']} process(es) x batch_size "
                          f"{saved['batch_size']} = {effective}; {world} x {batch} differs ({hint})")
    logger.info("resuming a %d-process run with %d processes (effective batch %d unchanged); "
                "random streams of ranks > 0 restart", saved["world_size"], world, effective)
    return {"training.batch_size"}


def rank_rng_state(checkpoint: dict, context: DistributedContext) -> dict:
    """The RNG states this rank resumes with (see :func:`resume_check`)."""
    saved = checkpoint.get("trainer", {}).get("distributed") or {}
    states = saved.get("rng")
    if states is not None and len(states) == context.world_size:
        return states[context.rank]
    if context.rank == 0:
        return checkpoint["rng"]
    from nmt.train.rng import rng_state, seed_everything

    seed_everything(config_seed(checkpoint) + context.rank + 7919 * int(checkpoint["step"]))
    return rng_state()


def config_seed(checkpoint: dict) -> int:
    """training.seed of the run a checkpoint belongs to."""
    return int(checkpoint["config"]["training"]["seed"])


def shard_batch(indices: Sequence[int], rank: int, world_size: int) -> tuple[np.ndarray, bool]:
    """This rank's part of a global batch: ``(positions, real)``.

    The global batch (positions in length order) is split into ``world_size`` contiguous
    parts of nearly equal size (``np.array_split``). A rank whose part is empty (a global
    batch of fewer examples than ranks) gets the first example with ``real=False``: it must
    still run forward and backward (DDP all-reduces every gradient), but with weight 0.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if world_size == 1:
        return indices, True
    part = np.array_split(indices, world_size)[rank]
    if part.size == 0:
        return indices[:1], False
    return part, True


def loss_normalizer(global_tokens: int, world_size: int) -> float:
    """What each rank divides its summed loss by: ``global_tokens / world_size``.

    DDP averages gradients over ranks, so dividing by the global token count over N makes
    the averaged gradient that of the summed loss of all ranks over all their tokens.
    """
    return max(global_tokens, 1) / world_size


__all__ = ["DistributedContext", "NullLock", "STOP_REASONS", "distributed_state", "in_rank_order", "rank_rng_state",
           "resume_check", "init_distributed", "loss_normalizer",
           "rank_cuda_index", "rank_device", "several_processes", "shard_batch", "torchrun_environment",
           "wrap_model"]
