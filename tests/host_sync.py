"""Host-synchronisation detection on the CPU.

On an accelerator, an op that needs tensor *values* on the host (``.item()``, ``int(t)``,
``bool(t)``, ``.tolist()``), or whose output shape depends on tensor values (``nonzero``,
boolean-mask indexing, ``unique``, ``repeat_interleave`` without ``output_size``, ...),
stalls the host until the device catches up; ``torch.cuda.set_sync_debug_mode("error")``
raises at such ops. :class:`HostSyncRecorder` finds the same ops on the CPU: it is a
``TorchDispatchMode`` that records every such aten op (and the Python-level ``tolist`` /
``numpy`` calls and ``torch.tensor(data, device=...)`` copies, which do not dispatch a
telling op) with the library line that issued it, so that a forward and backward can be
checked for syncs without a GPU.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: ops that always read tensor values on the host or have a value-dependent output shape
ALWAYS_SYNC = {
    aten._local_scalar_dense.default: "item()/int()/bool() read a value",
    aten.nonzero.default: "nonzero",
    aten.argwhere.default: "argwhere",
    aten.masked_select.default: "masked_select",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim_consecutive.default: "unique_consecutive",
    aten.equal.default: "torch.equal",
    aten.is_nonzero.default: "bool()",
    aten.bincount.default: "bincount",
    aten._to_sparse_csr.default: "dense to sparse CSR (counts nonzeros)",
    aten._to_sparse.default: "dense to sparse (counts nonzeros)",
    aten._coalesce.default: "sparse coalesce",
    aten.tensor_split.tensor_indices_or_sections: "tensor_split at tensor indices",
}
#: ops that sync when given boolean (mask) indices
BOOL_INDEX_OPS = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
#: ops that sync unless told their output size
OUTPUT_SIZE_OPS = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}


def _always(*args, **kwargs) -> bool:
    return True


def _host_data_to_device(data=None, *args, device=None, **kwargs) -> bool:
    """``torch.tensor(data, device=d)`` with Python data and ``d`` not the string ``"cpu"``
    (host metadata is made with ``device="cpu"``): on an accelerator, a blocking copy."""
    return device is not None and device != "cpu" and not isinstance(data, torch.Tensor)


def _new_tensor(tensor, data=None, *args, **kwargs) -> bool:
    return not isinstance(data, torch.Tensor)


#: Python-level calls that copy values between host and device without a dispatched op
#: that tells (on the CPU, all copies are no-ops): ``(owner, name, predicate, reason)``
PY_CALLS = (
    (torch.Tensor, "tolist", _always, "Tensor.tolist()"),
    (torch.Tensor, "numpy", _always, "Tensor.numpy()"),
    (torch.Tensor, "__array__", _always, "numpy conversion"),
    (torch.Tensor, "new_tensor", _new_tensor, "Tensor.new_tensor() from host data"),
    (torch, "tensor", _host_data_to_device, "torch.tensor(..., device=) from host data"),
    (torch, "as_tensor", _host_data_to_device, "torch.as_tensor(..., device=) from host data"),
)

_THIS = str(Path(__file__).resolve())
_TORCH = str(Path(torch.__file__).resolve().parent) + "/"  # not torch_geometric


def sync_reason(func, args, kwargs) -> str | None:
    """Why ``func(*args, **kwargs)`` would synchronise with the host on an accelerator."""
    if func in ALWAYS_SYNC:
        return ALWAYS_SYNC[func]
    if func in BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
        ):
            return "boolean-mask indexing"
    if func in OUTPUT_SIZE_OPS and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size"
    return None


def caller() -> str:
    """``file:line`` of the innermost frame outside torch and this module (library code,
    PyG, or the test), followed by the innermost ``hiergraph`` frame if that is further out."""
    frames = [
        f
        for f in reversed(traceback.extract_stack())
        if not f.filename.startswith(_TORCH) and f.filename != _THIS
    ]
    if not frames:
        return "?"
    names = [_short(f) for f in frames]
    ours = next((n for n in names if n.startswith("hiergraph/")), None)
    return names[0] if ours in (None, names[0]) else f"{names[0]} (via {ours})"


def _short(frame) -> str:
    path = frame.filename
    for marker in ("/hiergraph/", "/torch_geometric/", "/tests/", "/benchmarks/"):
        if marker in path:
            path = marker[1:] + path.rsplit(marker, 1)[1]
            break
    return f"{path}:{frame.lineno}"


class HostSyncRecorder(TorchDispatchMode):
    """Records the host-synchronising ops run inside it as ``"reason at file:line"``.

    Example::

        with HostSyncRecorder() as rec:
            out = layer(x, hierarchy)
            out.sum().backward()
        assert rec.syncs == []
    """

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self.num_ops = 0
        self._saved: dict[str, object] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.num_ops += 1
        reason = sync_reason(func, args, kwargs)
        if reason is not None:
            self.syncs.append(f"{reason} at {caller()}")
        return func(*args, **kwargs)

    def __enter__(self):
        for owner, name, predicate, reason in PY_CALLS:
            self._saved[owner, name] = owner.__dict__.get(name)
            setattr(owner, name, self._recording(getattr(owner, name), predicate, reason))
        return super().__enter__()

    def __exit__(self, *exc):
        for (owner, name), saved in self._saved.items():
            if saved is None:  # a C method inherited from torch._C.TensorBase
                delattr(owner, name)
            else:
                setattr(owner, name, saved)
        return super().__exit__(*exc)

    def _recording(self, original, predicate, reason):
        def call(*args, **kwargs):
            if predicate(*args, **kwargs):
                self.syncs.append(f"{reason} at {caller()}")
            return original(*args, **kwargs)

        return call

    def unique_syncs(self) -> list[str]:
        """The recorded syncs without repeats, in first-seen order."""
        return list(dict.fromkeys(self.syncs))


def first_and_second_call_syncs(step) -> tuple[list[str], list[str]]:
    """The host syncs of two calls of ``step`` in a row, taking the branches an accelerator
    takes (:func:`~hiergraph._device.cpu_as_accelerator`): for structure derived once per
    input, the first call may sync and the second must not."""
    from hiergraph._device import cpu_as_accelerator

    with cpu_as_accelerator():
        with HostSyncRecorder() as first:
            step()
        with HostSyncRecorder() as second:
            step()
    return first.unique_syncs(), second.unique_syncs()
