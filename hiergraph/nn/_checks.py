"""Argument and input-size checks shared by the layers (shapes only: no tensor values read)."""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from hiergraph._checks import check_bool, check_int, check_probability  # noqa: F401 (the layers import them here)


def check_in_channels(in_channels) -> tuple[int, int | None]:
    """``(source, target)`` sizes of ``in_channels``, a positive int or ``-1`` (inferred on
    the first call), or a pair of them (a bipartite layer); ``target`` is ``None`` for one
    size. Python ints (NumPy's are read too); raises otherwise."""
    if isinstance(in_channels, tuple | list):
        if len(in_channels) != 2:
            raise ValueError(
                f"in_channels must be an int or a pair (source, target), got {in_channels}"
            )
        for i, size in enumerate(in_channels):
            check_int(size, f"in_channels[{i}]", lazy=True)
        return int(in_channels[0]), int(in_channels[1])
    check_int(in_channels, "in_channels", lazy=True)
    return int(in_channels), None


def check_conv_arguments(in_channels, out_channels, heads, dropout) -> tuple[int, int | None]:
    """The arguments every attention conv shares: ``in_channels`` (:func:`check_in_channels`,
    whose ``(source, target)`` sizes it returns), ``out_channels`` and ``heads`` (positive
    ints) and ``dropout`` (a probability in ``[0, 1]``, as :class:`torch.nn.Dropout` takes
    it)."""
    sizes = check_in_channels(in_channels)
    check_int(out_channels, "out_channels")
    check_int(heads, "heads")
    check_probability(dropout, "dropout")
    return sizes


def check_features(
    x: Tensor, expected: int, name: str, shape: str, weight: Tensor | None = None
) -> None:
    """Raise unless ``x`` is a floating-point tensor with ``expected`` features in its last
    dimension, of the dtype of the layer's ``weight`` when given (:func:`check_dtype`).

    ``expected <= 0`` (a lazy size not inferred yet) skips the size check. ``shape`` is the
    expected shape spelled out for the message, e.g. ``"[num_leaves, 16]"``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor {shape}, got {type(x).__name__}")
    check_dtype(x, weight, name)
    if expected > 0 and (x.dim() == 0 or x.size(-1) != expected):
        got = x.size(-1) if x.dim() else "no"
        raise ValueError(
            f"{name} must have {expected} features in its last dimension ({shape}), got "
            f"{got} (shape {tuple(x.shape)})"
        )


def check_dtype(x: Tensor, weight: Tensor | None, name: str) -> None:
    """Raise a ``TypeError`` unless the features ``x`` are floating-point and, outside
    autocast (which casts both), of the dtype of the layer's ``weight`` (``None``, or a
    lazy parameter not yet inferred: any)."""
    if not x.is_floating_point():
        integers = not (x.dtype == torch.bool or x.is_complex())
        hint = " (token ids? embed them first, e.g. nn.Embedding)" if integers else ""
        raise TypeError(f"{name} must hold floating-point features, got {x.dtype}{hint}")
    if (
        weight is None
        or isinstance(weight, UninitializedParameter)
        or x.dtype == weight.dtype
        or torch.is_autocast_enabled(x.device.type)
    ):
        return
    raise TypeError(
        f"{name} is {x.dtype} but the layer's parameters are {weight.dtype}: convert the "
        f"model (model.to({x.dtype})) or the input ({name}.to({weight.dtype}))"
    )


def node_pair(x) -> tuple[Tensor, Tensor]:
    """``(x_src, x_dst)`` of a layer's node features ``x``: a tensor (both) or a pair of
    them (a bipartite graph); else ``ValueError``."""
    if isinstance(x, Tensor):
        return x, x
    if not (isinstance(x, tuple | list) and len(x) == 2):
        raise ValueError(f"x must be a tensor or a pair (x_src, x_dst), got {type(x).__name__}")
    if not all(isinstance(t, Tensor) for t in x):
        names = tuple(type(t).__name__ for t in x)
        raise ValueError(
            f"x_src and x_dst must both be tensors (the queries come from x_dst), got {names}"
        )
    return x[0], x[1]


def check_cache_arguments(heads, dim, dim_v, scale, dtype) -> None:
    """Raise unless a KV cache's ``heads``, ``dim`` and optional ``dim_v`` are positive ints,
    its optional ``scale`` a finite number and its ``dtype`` a floating-point one."""
    check_int(heads, "heads")
    check_int(dim, "dim")
    check_int(dim_v, "dim_v", optional=True)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, Real)):
        raise TypeError(f"scale must be a finite number (or None), got {scale!r}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number (or None), got {scale!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")


def check_cache_inputs(
    cache, lead: tuple[int, ...], q: Tensor | None, k: Tensor, v: Tensor
) -> None:
    """Raise a ``TypeError`` unless the inputs ``q, k, v`` of a KV cache are floating-point
    tensors, and a ``ValueError`` unless ``q, k`` are ``[*lead, heads, dim]`` and ``v`` is
    ``[*lead, heads, dim_v]`` for the ``heads, dim, dim_v`` of ``cache``; ``lead`` is ``()``
    (one token) or ``(T,)`` (a prompt), and ``q`` may be ``None``."""
    token = [f"T={t}" for t in lead]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x is not None and not (isinstance(x, Tensor) and x.is_floating_point()):
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a floating-point tensor, got {got}")
    for name, x, (last, size) in (
        ("q", q, ("dim", cache.dim)),
        ("k", k, ("dim", cache.dim)),
        ("v", v, ("dim_v", cache.dim_v)),
    ):
        if x is not None and x.shape != (*lead, cache.heads, size):
            want = ", ".join([*token, f"heads={cache.heads}", f"{last}={size}"])
            raise ValueError(f"{name} must be [{want}], got {tuple(x.shape)}")
