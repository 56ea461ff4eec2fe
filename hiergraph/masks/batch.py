"""A batch of masked sequences of different lengths as one PyG ``Batch``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from hiergraph._checks import as_int, described
from hiergraph.ops.edge_index import check_edge_index


def sequence_batch(
    lengths: Sequence[int],
    mask: Callable[..., Tensor],
    x: Tensor | None = None,
    **params,
) -> Batch:
    """One ``Data(edge_index=mask(n, **params), pos=arange(n))`` per length, batched.

    PyG batching shifts each sequence's ``edge_index`` by its offset, so no
    edge crosses sequences and variable lengths need no padding mask. The
    result has ``batch``, ``ptr``, and ``pos`` (the position of every node in
    its own sequence). Its tensors lie on ``x``'s device (each mask is moved
    there if ``mask`` built it elsewhere), or without ``x`` on
    ``params["device"]`` (PyTorch's default device when not given).

    Args:
        lengths (Sequence[int]): sequence lengths.
        mask (Callable[..., torch.Tensor]): a builder
            ``(n, **params) -> edge_index [2, E_n]``, e.g.
            :func:`~hiergraph.masks.window_mask`.
        x (torch.Tensor, optional): ``[sum(lengths), F]`` node features, split by
            :obj:`lengths`. (default: :obj:`None`)
        **params (optional): passed on to :obj:`mask` (e.g. ``device=`` for the
            builders of :mod:`hiergraph.masks`).

    Returns:
        A ``Batch`` of ``sum(lengths)`` nodes and ``sum(E_n)`` edges.

    Example::

        batch = sequence_batch([5, 3], window_mask, p=1, causal=True)
    """
    lengths = [as_int(n, "each length") for n in lengths]  # (2.7 was 2)
    if not lengths:  # (an IndexError from PyG)
        raise ValueError("lengths must name at least one sequence")
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {lengths}")
    if x is not None and not isinstance(x, Tensor):  # (an AttributeError)
        raise TypeError(f"x must be a tensor [sum(lengths), F] or None, got {described(x)}")
    if x is not None and x.size(0) != sum(lengths):
        raise ValueError(f"x has {x.size(0)} rows but the lengths sum to {sum(lengths)}")
    features = x.split(lengths) if x is not None else [None] * len(lengths)
    device = x.device if x is not None else params.get("device")
    data = [
        Data(
            x=feat,
            edge_index=_sequence_mask(mask, n, i, params).to(device),
            pos=torch.arange(n, device=device),
            num_nodes=n,
        )
        for i, (n, feat) in enumerate(zip(lengths, features, strict=True))
    ]
    return Batch.from_data_list(data)


def _sequence_mask(mask: Callable[..., Tensor], n: int, i: int, params: dict) -> Tensor:
    """``mask(n, **params)``, refused unless it is an edge list over the ``n`` nodes of
    sequence ``i`` (an id past ``n`` would cross into the next sequence)."""
    edge_index = mask(n, **params)
    try:
        check_edge_index(edge_index, n)
    except (TypeError, ValueError) as error:
        raise type(error)(f"the mask of sequence {i} (length {n}): {error}") from None
    return edge_index
