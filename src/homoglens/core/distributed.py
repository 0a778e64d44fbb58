"""Data parallelism through ``torch.distributed``: shard sequences by rank, all-reduce the sums.

homoglens' statistics are sums and counts that merge exactly by addition, so running on several
processes is a reduction. When a process group is initialised (``torchrun``, SLURM, or your own
``torch.distributed.init_process_group``), :func:`~homoglens.homogenization_profile`,
:func:`~homoglens.sink_scores` and :func:`~homoglens.position_ablation_study` each take a
contiguous shard of the sequences on every rank, all-reduce their sums (and all-gather their
per-sequence values in input order), and return the same result on every rank. The gloo backend
works on CPU, NCCL on GPUs (put each rank's model on ``cuda:LOCAL_RANK``).

References:
    PyTorch, "Distributed communication package - torch.distributed" (all_reduce, all_gather).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from homoglens.core.errors import DistributedError

__all__ = [
    "all_reduce_sum",
    "check_same_data",
    "gather_rows",
    "is_main_process",
    "shard_bounds",
    "world",
]


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """Whether this process is rank 0 (or not distributed): the one that writes files."""
    return world()[0] == 0


def shard_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal ``(start, stop)`` shards of ``n`` items, one per rank (the first
    ``n % world_size`` ranks get one more; ranks past ``n`` get an empty shard)."""
    base, extra = divmod(n, world_size)
    bounds, start = [], 0
    for rank in range(world_size):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _collective(op: str, *args: object) -> None:
    try:
        getattr(torch.distributed, op)(*args)
    except RuntimeError as err:
        raise DistributedError(
            f"torch.distributed {op} failed ({str(err)[:200]}); another rank probably stopped "
            "with its own error: see its output"
        ) from err


def all_reduce_sum(tensors: Iterable[torch.Tensor]) -> None:
    """Sum each tensor over all ranks, in place (no-op without a process group).

    Raises:
        DistributedError: the collective failed (another rank stopped)."""
    _all_reduce(tensors, "SUM")


def all_reduce_max(tensors: Iterable[torch.Tensor]) -> None:
    """Take each tensor's elementwise maximum over all ranks, in place (no-op without a process
    group). Use -inf, not NaN, for "nothing seen": NaN does not order.

    Raises:
        DistributedError: the collective failed (another rank stopped)."""
    _all_reduce(tensors, "MAX")


def _all_reduce(tensors: Iterable[torch.Tensor], op: str) -> None:
    if world()[1] == 1:
        return
    for tensor in tensors:
        _collective("all_reduce", tensor, getattr(torch.distributed.ReduceOp, op))


def check_same_data(tokens: torch.Tensor, mask: torch.Tensor, device: torch.device) -> None:
    """Refuse to run when the ranks were given different data (every rank must pass the same
    sequences; each takes its own shard).

    Raises:
        DistributedError: the ranks' data differ (number, width, or content of the sequences).
    """
    if world()[1] == 1:
        return
    ids = tokens.to(torch.float64) * mask
    here = {"dtype": torch.float64, "device": tokens.device}
    weights = torch.arange(1, tokens.shape[1] + 1, **here)
    rows = torch.arange(1, tokens.shape[0] + 1, **here)[:, None]
    mine = torch.stack(
        [
            torch.tensor(float(tokens.shape[0]), **here),
            torch.tensor(float(tokens.shape[1]), **here),
            ids.sum().double(),
            (ids * weights * rows).sum().double() % 1e12,
        ]
    ).to(device)
    high, low = mine.clone(), mine.clone()
    _collective("all_reduce", high, torch.distributed.ReduceOp.MAX)
    _collective("all_reduce", low, torch.distributed.ReduceOp.MIN)
    if not torch.equal(high, low):
        raise DistributedError(
            "the ranks were given different data; pass the same sequences on every rank "
            "(homoglens shards them by rank itself)"
        )


def gather_rows(local: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    """Concatenate every rank's rows (shards of :func:`shard_bounds` over ``n`` rows) in rank
    order; returns ``local`` unchanged without a process group.

    Args:
        local: ``[rows ...]`` this rank's rows.
        n: Total number of rows over all ranks.
        device: Where the collective runs (CUDA for NCCL, CPU for gloo).

    Returns:
        ``[n ...]`` on the CPU, the same on every rank.
    """
    _, size = world()
    if size == 1:
        return local
    bounds = shard_bounds(n, size)
    width = max(stop - start for start, stop in bounds)
    padded = torch.zeros((width, *local.shape[1:]), dtype=local.dtype, device=device)
    padded[: len(local)] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(size)]
    _collective("all_gather", parts, padded)
    return torch.cat(
        [part[: stop - start].cpu() for part, (start, stop) in zip(parts, bounds, strict=True)]
    )
