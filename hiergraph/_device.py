"""Host/device rules of the hot paths: which input checks may read tensor values, and how
Python-side metadata reaches the device without a blocking copy.

On an accelerator, reading a tensor value on the host (``int(t)``, ``bool(t)``,
``.tolist()``) waits for every queued kernel, and so does a plain host-to-device copy
from pageable memory (``torch.tensor(values, device="cuda")``). Checks of index values
therefore run for CPU tensors only (:func:`reads_values`); on a device, an index out of
range still fails inside the kernel that uses it (a device-side assertion).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

_treat_cpu_as_device = False
#: pinned sources of host-to-device copies made while a CUDA graph was being captured
_captured_sources: list[Tensor] = []


def reads_values(tensor: Tensor) -> bool:
    """Whether a check may read ``tensor``'s values on the host: only for CPU tensors
    (free there; a host synchronisation on an accelerator), and not while ``torch.compile``
    traces (a read would break the graph)."""
    return (
        tensor.device.type == "cpu"
        and not _treat_cpu_as_device
        and not torch.compiler.is_compiling()
    )


@contextmanager
def cpu_as_accelerator() -> Iterator[None]:
    """Within the block, :func:`reads_values` is ``False`` for CPU tensors too: the code
    takes the branches it takes on an accelerator (for checking those on the CPU)."""
    global _treat_cpu_as_device
    saved, _treat_cpu_as_device = _treat_cpu_as_device, True
    try:
        yield
    finally:
        _treat_cpu_as_device = saved


def host_tensor(values: Sequence, device, dtype: torch.dtype = torch.long) -> Tensor:
    """``torch.tensor(values)`` on ``device`` (default: the default device), copied as
    :func:`to_device` copies."""
    return to_device(torch.tensor(values, dtype=dtype, device="cpu"), device)


def to_device(tensor: Tensor, device) -> Tensor:
    """The CPU tensor ``tensor`` on ``device`` (default: the default device; on the CPU,
    ``tensor`` itself): on an accelerator staged in pinned memory and copied
    asynchronously, so the host does not wait for the queued kernels.

    While a CUDA graph is being captured, the copy becomes a node of the graph that reads
    the pinned buffer again at every replay; the buffer is then kept for the life of the
    process (its bytes, for every captured call), so that no later allocation reuses it and a
    replay does not copy someone else's values."""
    device = torch.get_default_device() if device is None else torch.device(device)
    if device.type in ("cpu", "meta"):
        return tensor.to(device)
    pinned = tensor.pin_memory()
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        _captured_sources.append(pinned)
    return pinned.to(device, non_blocking=True)
