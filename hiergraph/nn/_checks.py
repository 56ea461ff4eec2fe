"""Argument and input-size checks shared by the layers (shapes only: no tensor values read)."""

from __future__ import annotations

from torch import Tensor

from hiergraph._checks import check_int, check_probability  # noqa: F401 (the layers import them here)


def check_in_channels(in_channels) -> None:
    """Raise unless ``in_channels`` is a positive int or ``-1`` (inferred on the first call),
    or a pair of them ``(source, target)`` (a bipartite layer)."""
    if isinstance(in_channels, tuple | list):
        if len(in_channels) != 2:
            raise ValueError(
                f"in_channels must be an int or a pair (source, target), got {in_channels}"
            )
        for i, size in enumerate(in_channels):
            check_int(size, f"in_channels[{i}]", lazy=True)
    else:
        check_int(in_channels, "in_channels", lazy=True)


def check_conv_arguments(in_channels, out_channels, heads, dropout) -> None:
    """The arguments every attention conv shares: ``in_channels`` (:func:`check_in_channels`),
    ``out_channels`` and ``heads`` (positive ints) and ``dropout`` (a probability in
    ``[0, 1]``, as :class:`torch.nn.Dropout` takes it)."""
    check_in_channels(in_channels)
    check_int(out_channels, "out_channels")
    check_int(heads, "heads")
    check_probability(dropout, "dropout")


def check_features(x: Tensor, expected: int, name: str, shape: str) -> None:
    """Raise unless ``x`` has ``expected`` features in its last dimension.

    ``expected <= 0`` (a lazy size not inferred yet) skips the check. ``shape`` is the
    expected shape spelled out for the message, e.g. ``"[num_leaves, 16]"``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor {shape}, got {type(x).__name__}")
    if expected > 0 and (x.dim() == 0 or x.size(-1) != expected):
        got = x.size(-1) if x.dim() else "no"
        raise ValueError(
            f"{name} must have {expected} features in its last dimension ({shape}), got "
            f"{got} (shape {tuple(x.shape)})"
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
