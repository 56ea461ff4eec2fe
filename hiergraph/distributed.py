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

import copy
import datetime
import os
import pickle
import random
import tempfile
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
        return DistributedContext(0, 1, local_rank, device, None)
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
    file is written to a new temporary file beside ``path`` (created exclusively: never
    through a link planted under its name) and renamed, so a crash never leaves
    a truncated checkpoint, and all ranks wait for the write (a barrier) so
    none reads a stale file afterwards. Without ``context`` the rank and the
    barrier come from the initialised process group, if there is one (so
    ranks never race on the same temporary file).

    Raises:
        TypeError: a ``state`` value that is not plain data (tensors, numbers, strings,
            ``None`` and lists, tuples or dicts of them), which :func:`load_checkpoint`
            would refuse (a NumPy number, say): checked before anything is written.
    """
    for key, value in state.items():
        _check_plain(value, f"state[{key!r}]")
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
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(handle)
        os.chmod(tmp, _file_mode(path))  # (mkstemp's 0600: the file torch.save writes)
        try:
            torch.save(payload, tmp)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)  # (a failed save left it behind)
    if distributed:
        dist.barrier()


#: What a checkpoint's state may hold besides tensors (and containers of them): what
#: ``weights_only`` rebuilds. (Exact types: a NumPy float subclasses ``float`` but needs
#: NumPy's globals to load.)
_PLAIN = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


def _check_plain(value, name: str) -> None:
    """Raise ``TypeError`` unless ``value`` is plain data (a tensor or :data:`_PLAIN`, in
    lists, tuples and dicts with such keys)."""
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{name}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, f"a key of {name}")
            _check_plain(item, f"{name}[{key!r}]")
    elif type(value) not in _PLAIN and not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{name} is a {type(value).__module__}.{type(value).__qualname__}: a checkpoint "
            "holds plain data only (tensors, numbers, strings, None, and lists, tuples or "
            "dicts of them), which load_checkpoint rebuilds without running code; convert "
            "it (e.g. float(x), x.tolist())"
        )


def _file_mode(path: Path) -> int:
    """The permissions a file written at ``path`` gets from ``open``: those of the file it
    replaces, else ``0o666`` less the process's umask."""
    if path.is_file():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


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
    in it. Everything is checked before the model or the optimizer is written: a refused
    checkpoint leaves both as they were.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is no readable checkpoint (truncated, of another format),
            holds anything other than plain data (e.g. a pickled object), is not a
            checkpoint of :func:`save_checkpoint`, holds the weights of another model
            (other sizes or layers), or holds no optimizer state (or another optimizer's)
            while ``optimizer`` is given.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a checkpoint file")
    if path.exists() and not path.is_file():  # (reported missing: a run then replaced it)
        raise ValueError(f"{path} is not a regular file (a FIFO or a device), not a checkpoint")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train without --resume first")
    payload = _read_checkpoint(path, map_location)
    weights, optim_state = payload.pop("model", None), payload.pop("optimizer", None)
    if not isinstance(weights, dict):
        raise ValueError(f"{path} is not a checkpoint of save_checkpoint (no 'model' weights)")
    target = unwrap(model)
    _check_weights(path, weights, target.state_dict())
    if optimizer is not None:
        _check_optimizer_state(path, optim_state, optimizer)
    if optimizer is not None:
        _load_optimizer_state(path, optim_state, optimizer)
    target.load_state_dict(weights)
    return payload


def _load_optimizer_state(path: Path, state: dict, optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.load_state_dict(state)``; where it fails (a state the checks let pass
    that this optimizer cannot take), the optimizer gets its own state back and a
    ``ValueError`` names the file."""
    own = copy.deepcopy(optimizer.state_dict())
    try:
        optimizer.load_state_dict(state)
    except Exception as err:  # noqa: BLE001 - whatever the optimizer's own loading raises
        optimizer.load_state_dict(own)
        raise ValueError(
            f"{path} holds an optimizer state this optimizer cannot take "
            f"({type(err).__name__}: {err})"
        ) from err


def _read_checkpoint(path: Path, map_location) -> dict:
    """The dict a checkpoint file holds, read with ``weights_only=True``; a ``ValueError``
    for a file that holds code, is no checkpoint or is damaged."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message is long; keep its line naming the refused object when there is one
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line), None)
        if detail is None:  # (a text or NumPy file reads as a pickle of nothing known)
            problem = lines[-1] if lines else err
            raise ValueError(f"{path} is not a checkpoint file ({problem})") from err
        raise ValueError(
            f"refusing to load {path}: it holds objects other than tensors and plain data "
            "(numbers, strings, lists, tuples, dicts), and rebuilding them could run arbitrary "
            f"code. Details: {detail}"
        ) from err
    except Exception as err:  # any failure of the safe reader (it runs nothing of the file)
        raise ValueError(
            f"{path} is not a readable checkpoint (truncated, damaged or of another format: "
            f"{type(err).__name__}: {str(err)[:200]})"
        ) from err
    if not isinstance(payload, dict):
        raise ValueError(f"{path} is not a checkpoint of save_checkpoint (no 'model' entry)")
    return payload


def _check_weights(path: Path, weights: dict, expected: dict) -> None:
    """Raise ``ValueError`` unless ``weights`` has the keys and shapes of ``expected`` (the
    model's own state dict)."""
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    shapes = [
        f"{key}: {getattr(weights[key], 'shape', type(weights[key]).__name__)} for {value.shape}"
        for key, value in expected.items()
        if key in weights
        and isinstance(value, torch.Tensor)
        and (not isinstance(weights[key], torch.Tensor) or weights[key].shape != value.shape)
    ]
    found = [
        f"{what} {items[:5]}"
        for what, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("other sizes", shapes),
        )
        if items
    ]
    if found:
        raise ValueError(f"{path} holds the weights of another model: {'; '.join(found)}")


def _check_optimizer_state(path: Path, state, optimizer: torch.optim.Optimizer) -> None:
    """Raise ``ValueError`` unless ``state`` is an optimizer state dict whose parameter
    groups match ``optimizer``'s in number and size."""
    if state is None:
        raise ValueError(f"{path} holds no optimizer state")
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError(f"{path} holds no optimizer state it can read")
    saved = [len(g.get("params", ())) for g in groups]
    own = [len(g["params"]) for g in optimizer.param_groups]
    if saved != own:
        raise ValueError(
            f"{path} holds the state of another optimizer: parameter groups of {saved} "
            f"parameters, this one's of {own}"
        )
    # settings this optimizer does not have (SGD's momentum for Adam, say); a setting it
    # has that the file lacks may be one a newer PyTorch added: it takes its default
    unknown = {key for group in groups for key in group} - {
        key for group in optimizer.param_groups for key in group
    }
    if unknown:
        raise ValueError(
            f"{path} holds the state of another kind of optimizer: settings "
            f"{', '.join(sorted(unknown))}, which this {type(optimizer).__name__} does not have"
        )
