"""The input check shared by everything that takes an ``edge_index``: shape, dtype, id range."""

from __future__ import annotations

import torch
from torch import Tensor


def check_edge_index(
    edge_index: Tensor,
    num_src: int,
    num_dst: int | None = None,
    *,
    alternative: str | None = None,
    check_range: bool = True,
    int32: bool = False,
) -> None:
    r"""Raise unless ``edge_index`` is a LongTensor ``[2, E]`` whose ids fit the node sets.

    The one input check of every mask builder, of
    :func:`~hiergraph.masks.edge_index_to_mask`, of
    :class:`~hiergraph.nn.MaskedAttentionConv` and of the edge kernels'
    :class:`~hiergraph.ops.edge_products.EdgeCSR`.

    Args:
        edge_index: ``[2, E]``, row 0 = source = key, row 1 = target = query.
        num_src: row 0 must lie in ``[0, num_src)``.
        num_dst: row 1 must lie in ``[0, num_dst)``; ``None`` for ``num_src``
            (a square mask over one node set).
        alternative: another accepted input, named in the ``TypeError``
            (e.g. ``"a BandMask"``).
        check_range: also check the ids against ``num_src`` / ``num_dst``. This
            reads values; ``False`` checks only the type and shape, which never
            touches the data (for tensors on an accelerator, in a hot loop).
        int32: accept int32 ids as well as int64.

    Raises:
        TypeError: ``edge_index`` is not a LongTensor.
        ValueError: its shape is not ``[2, E]``, or an id lies out of range
            (the message gives the range of each row).

    The range check reads four numbers back to the host: one sync on CUDA.
    """
    num_dst = num_src if num_dst is None else num_dst
    dtypes = (torch.long, torch.int32) if int32 else (torch.long,)
    if not isinstance(edge_index, Tensor) or edge_index.dtype not in dtypes:
        is_tensor = isinstance(edge_index, Tensor)
        got = f"a {edge_index.dtype} tensor" if is_tensor else type(edge_index).__name__
        kind = "an int64 or int32 tensor" if int32 else "a LongTensor"
        accepted = f"{kind} of shape [2, E]" + (f" or {alternative}" if alternative else "")
        raise TypeError(f"edge_index must be {accepted}, got {got}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if not check_range or not edge_index.numel():
        return
    low, high = torch.aminmax(edge_index, dim=1)
    (src_low, dst_low), (src_high, dst_high) = torch.stack([low, high]).tolist()
    if min(src_low, dst_low) < 0 or src_high >= num_src or dst_high >= num_dst:
        raise ValueError(
            f"edge_index has ids out of range (outside the mask or graph): sources (row 0, "
            f"keys) span {src_low}..{src_high} for num_src = {num_src}, targets (row 1, "
            f"queries) span {dst_low}..{dst_high} for num_dst = {num_dst}"
        )
