r"""Thin helpers for data-parallel training with PyTorch's own engine.

Nothing here replaces ``torch.distributed``: these functions only remove the
boilerplate every ``torchrun`` script repeats (process-group setup from the
launcher's environment, per-rank seeding, rank-0 checkpoints that resume
exactly). See ``examples/ddp_train.py`` for a complete script.

.. code-block:: bash

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py

Determinism: with :func:`seed_everything` called at the start of every epoch
with ``(seed, epoch, rank)``, and samplers whose order depends only on
``(seed, epoch)`` (``DistributedSampler.set_epoch``,
:class:`~hiergraph.loader.DistributedLeafBudgetBatchSampler`), a run resumed
from an epoch-boundary checkpoint continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import datetime
import os
import pickle
import random
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistributedContext:
    """Where this process runs: ``rank`` of ``world_size`` processes, on ``device``."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: a single process without a process group

    @property
    def is_main(self) -> bool:
        """True on the rank that writes checkpoints and logs (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def init_distributed(backend: str | None = None, timeout_s: float = 300.0) -> DistributedContext:
    """Initialise the default process group from a ``torchrun`` environment.

    Reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and the rendezvous
    address ``MASTER_ADDR``/``MASTER_PORT``) that ``torchrun`` sets. Without
    them (a plain ``python script.py``) it returns a single-process context
    and creates no process group, so the same script runs either way.

    Args:
        backend: ``'gloo'`` (CPU tensors) or ``'nccl'`` (one CUDA device per
            process); default ``'nccl'`` when CUDA is available, else
            ``'gloo'``.
        timeout_s: collective timeout; a rank that waits longer raises
            instead of hanging forever.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    if "WORLD_SIZE" not in os.environ:
        return DistributedContext(0, 1, 0, device, None)
    if not dist.is_initialized():
        extra = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **extra)
    return DistributedContext(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def cleanup_distributed() -> None:
    """Destroy the default process group if there is one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def main_process_first(context: DistributedContext):
    """Run the body on rank 0 first, then on the other ranks.

    For work with side effects on shared storage, such as a PyG dataset
    writing its ``processed/`` files on first use: rank 0 does it while the
    others wait, then they read the finished files. If the body fails on rank 0,
    the others are released all the same (and fail on their own) instead of
    waiting out the collective timeout.
    """
    if context.distributed and not context.is_main:
        dist.barrier()
    try:
        yield
    finally:
        if context.distributed and context.is_main:
            dist.barrier()


def seed_everything(seed: int, epoch: int = 0, rank: int = 0) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) from ``(seed, epoch, rank)``.

    Different ranks get different streams (e.g. dropout masks); model
    initialisation should use ``rank=0`` on every rank (DDP also broadcasts
    rank 0's parameters when it wraps the model).
    """
    value = (seed * 1_000_003 + epoch * 1009 + rank) % 2**63
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` (or ``torch.compile``) wrapper."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    context: DistributedContext | None = None,
    **state,
) -> None:
    """Write ``{model, optimizer, **state}`` to ``path`` from rank 0 only.

    The model is unwrapped (the checkpoint loads into a plain module), the
    file is written to a temporary name and renamed, so a crash never leaves
    a truncated checkpoint, and all ranks wait for the write (a barrier) so
    none reads a stale file afterwards. Without ``context`` the rank and the
    barrier come from the initialised process group, if there is one (so
    ranks never race on the same temporary file).

    ``state`` values must be plain data (tensors, numbers, strings, ``None``
    and lists, tuples or dicts of them): :func:`load_checkpoint` refuses any
    other object.
    """
    if context is None:
        grouped = dist.is_available() and dist.is_initialized()
        is_main, distributed = (dist.get_rank() == 0 if grouped else True), grouped
    else:
        is_main, distributed = context.is_main, context.distributed
    if is_main:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"model": unwrap(model).state_dict(), **state}
        if optimizer is not None:
            payload["optimizer"] = optimizer.state_dict()
        tmp = path.with_name(path.name + ".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
    if distributed:
        dist.barrier()


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device = "cpu",
) -> dict:
    """Load a :func:`save_checkpoint` file into ``model`` (and ``optimizer``).

    Returns the remaining saved state (e.g. ``epoch``, ``step``).

    The file is read with ``torch.load(weights_only=True)``: only tensors and
    plain data (numbers, strings, lists, tuples, dicts) are rebuilt, never
    arbitrary Python objects, so loading a checkpoint cannot run code hidden
    in it.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file holds anything other than plain data (e.g. a
            pickled object), is not a checkpoint of :func:`save_checkpoint`, holds the
            weights of another model (other sizes or layers), or holds no optimizer state
            while ``optimizer`` is given.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train without --resume first")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message is long; keep its line naming the refused object when there is one
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line), str(err))
        raise ValueError(
            f"refusing to load {path}: it holds objects other than tensors and plain data "
            "(numbers, strings, lists, tuples, dicts), and rebuilding them could run arbitrary "
            f"code. Details: {detail}"
        ) from err
    if not isinstance(payload, dict) or "model" not in payload:
        raise ValueError(f"{path} is not a checkpoint of save_checkpoint (no 'model' entry)")
    try:
        unwrap(model).load_state_dict(payload.pop("model"))
    except RuntimeError as err:  # torch's size mismatches and missing or unexpected keys
        raise ValueError(f"{path} holds the weights of another model: {err}") from err
    optim_state = payload.pop("optimizer", None)
    if optimizer is not None:
        if optim_state is None:
            raise ValueError(f"{path} holds no optimizer state")
        optimizer.load_state_dict(optim_state)
    return payload
