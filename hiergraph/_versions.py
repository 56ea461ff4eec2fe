"""Guards of caches keyed on tensors: the tensors themselves and their in-place versions."""

from __future__ import annotations

import torch
from torch import Tensor


def in_place_versions(*tensors: Tensor) -> tuple[int, ...] | None:
    """The in-place versions of ``tensors``: the same tensors with equal versions hold the
    same values. ``None`` when one is an inference tensor (made under
    ``torch.inference_mode``), which has no version counter: a cache cannot follow its
    writes, so what is derived from it is derived again on every use."""
    if any(t.is_inference() for t in tensors):
        return None
    return tuple(t._version for t in tensors)


def version_guard(*tensors: Tensor) -> tuple | None:
    """What a cache keeps to know its source unchanged: ``tensors`` and their versions
    (``None`` where the versions cannot be followed; see :func:`in_place_versions`)."""
    versions = in_place_versions(*tensors)
    return None if versions is None else (tensors, versions)


def guard_holds(guard: tuple | None, *tensors: Tensor) -> bool:
    """Whether ``tensors`` are the very tensors of ``guard``, unwritten since it was taken.

    Traced by ``torch.compile`` only the first holds: versions are not traceable, so a
    compiled graph keeps what the cache held when it was traced (write a structure in place
    and the graph does not see it; replace the tensor and it is traced again)."""
    if guard is None:
        return False
    kept, versions = guard
    same = len(kept) == len(tensors) and all(a is b for a, b in zip(kept, tensors, strict=False))
    if torch.compiler.is_compiling():
        return same
    return same and in_place_versions(*tensors) == versions
