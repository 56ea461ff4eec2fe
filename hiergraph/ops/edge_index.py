r"""The one input policy of everything that takes edges: an ``edge_index`` or a sparse
adjacency.

Every layer and op with an ``edge_index`` argument (:class:`~hiergraph.nn.MaskedAttentionConv`,
:class:`~hiergraph.nn.ConeConv`, the edge kernels' :class:`~hiergraph.ops.EdgeCSR`, the cone
edge scores, the mask builders and converters of :mod:`hiergraph.masks`, the graph
hierarchy transforms) checks it with :func:`check_edge_index`:

- **type and shape, always**: an int64 or int32 tensor ``[2, E]``, row 0 = source = key,
  row 1 = target = query. This reads no tensor values.
- **id range** (row 0 in ``[0, num_src)``, row 1 in ``[0, num_dst)``), unless turned off
  (``check_range=False``; a layer's ``validate=False``). For CPU tensors the ids are read on
  the host (:func:`hiergraph._device.reads_values`) and a bad id raises ``ValueError``. On an
  accelerator they are never read on the host (that would stall the queue): the check is a
  device-side assertion (``torch._assert_async``), which fails the next call that waits for
  the device. The kernels behind :class:`~hiergraph.ops.EdgeCSR` index memory with the ids
  unchecked, so the check guards them there too.

A layer checks the range once per ``edge_index`` tensor, not on every forward pass: the
layers' per-graph cache (keyed on the tensor's identity and :func:`edge_versions`) remembers
the check, and checks again when a new tensor comes or the old one was written in place.

Sparse adjacencies (:func:`is_adjacency`): a ``torch.sparse`` COO, CSR or CSC tensor, or a
``torch_sparse.SparseTensor`` (when installed), ``adj_t[target, source]`` as in PyG: row =
target = query, column = source = key, the transpose of an ``edge_index``'s layout.
:func:`adjacency_to_edge_index` turns one into an ``edge_index`` in its stored order and
:func:`edge_values_to_adjacency` puts per-edge values (attention weights) back into one.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import is_torch_sparse_tensor

from hiergraph._device import reads_values
from hiergraph._versions import in_place_versions

#: the id dtypes every edge input accepts
INDEX_DTYPES = (torch.long, torch.int32)


def check_edge_index(
    edge_index: Tensor,
    num_src: int,
    num_dst: int | None = None,
    *,
    alternative: str | None = None,
    check_range: bool = True,
) -> None:
    r"""Raise unless ``edge_index`` is an int64 or int32 tensor ``[2, E]`` whose ids fit the
    node sets.

    The one input check of everything that takes an ``edge_index`` (see
    :mod:`hiergraph.ops.edge_index` for the policy).

    Args:
        edge_index: ``[2, E]``, row 0 = source = key, row 1 = target = query.
        num_src: row 0 must lie in ``[0, num_src)``.
        num_dst: row 1 must lie in ``[0, num_dst)``; ``None`` for ``num_src``
            (a square mask over one node set).
        alternative: another accepted input, named in the ``TypeError``
            (e.g. ``"a BandMask"``).
        check_range: also check the ids against ``num_src`` / ``num_dst``: read on the
            host for a CPU tensor, a device-side assertion on an accelerator (no host
            sync). ``False`` checks only the type and shape.

    Raises:
        TypeError: ``edge_index`` is not an int64 or int32 tensor.
        ValueError: its shape is not ``[2, E]``, or (CPU tensors) an id lies out of range
            (the message gives the range of each row).
        RuntimeError: (accelerators, on the next call that waits for the device) an id
            lies out of range.
    """
    num_dst = num_src if num_dst is None else num_dst
    is_tensor = isinstance(edge_index, Tensor)
    if not is_tensor or edge_index.dtype not in INDEX_DTYPES or edge_index.layout != torch.strided:
        got = f"a {edge_index.dtype} tensor" if is_tensor else type(edge_index).__name__
        if is_tensor and edge_index.layout != torch.strided:
            got = f"a {edge_index.layout} tensor"
        accepted = "an int64 or int32 tensor of shape [2, E]"
        accepted += f" or {alternative}" if alternative else ""
        raise TypeError(f"edge_index must be {accepted}, got {got}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if not check_range or not edge_index.numel():
        return
    low, high = torch.aminmax(edge_index, dim=1)
    if not reads_values(edge_index):  # an accelerator: checked on the device, no host sync
        inside = (low.min() >= 0) & (high[0] < num_src) & (high[1] < num_dst)
        torch._assert_async(
            inside,
            f"edge_index has ids out of range: sources (row 0) must lie in [0, {num_src}), "
            f"targets (row 1) in [0, {num_dst})",
        )
        return
    (src_low, dst_low), (src_high, dst_high) = torch.stack([low, high]).tolist()
    if min(src_low, dst_low) < 0 or src_high >= num_src or dst_high >= num_dst:
        raise ValueError(
            f"edge_index has ids out of range (outside the mask or graph): sources (row 0, "
            f"keys) span {src_low}..{src_high} for num_src = {num_src}, targets (row 1, "
            f"queries) span {dst_low}..{dst_high} for num_dst = {num_dst}"
        )


def edge_versions(obj) -> tuple[int, ...] | None:
    """The in-place versions of an ``edge_index`` or adjacency and of the tensors holding its
    ids: equal versions of the same object mean unchanged edges. ``None`` where they cannot
    be followed: not a tensor or adjacency, or an inference tensor (no version counter)."""
    tensors = _index_tensors(obj)
    return None if tensors is None else in_place_versions(*tensors)


def _index_tensors(obj) -> tuple[Tensor, ...] | None:
    """The tensors whose versions identify the edges of ``obj`` (``None``: no edges)."""
    if isinstance(obj, SparseTensor):
        row, col, _ = obj.coo()
        return row, col
    if not isinstance(obj, Tensor):
        return None
    if not is_torch_sparse_tensor(obj):
        return (obj,)
    if obj.layout == torch.sparse_coo:
        return obj, obj._indices()
    if obj.layout == torch.sparse_csr:
        return obj, obj.crow_indices(), obj.col_indices()
    return obj, obj.ccol_indices(), obj.row_indices()


def is_adjacency(adj) -> bool:
    """Whether ``adj`` is a sparse adjacency: a ``torch.sparse`` COO, CSR or CSC tensor, or a
    ``torch_sparse.SparseTensor``."""
    return isinstance(adj, SparseTensor) or is_torch_sparse_tensor(adj)


def adjacency_to_edge_index(
    adj: Tensor | SparseTensor, num_src: int, num_dst: int
) -> tuple[Tensor, Tensor | None]:
    r"""The edges of a sparse adjacency ``adj_t[target, source]`` as an ``edge_index``.

    Reads no tensor values (no host sync); the ids are not range-checked here (pass the
    result to :func:`check_edge_index`).

    Args:
        adj: a ``torch.sparse`` COO, CSR or CSC tensor of shape ``[num_dst, num_src, ...]``
            (trailing dense dimensions hold per-edge values), or a ``SparseTensor`` of sparse
            size ``(num_dst, num_src)``. Row = target = query, column = source = key, as in
            PyG's ``adj_t``.
        num_src, num_dst: the node counts the adjacency must have.

    Returns:
        ``(edge_index [2, E], values)``: row 0 = source (the adjacency's column), row 1 =
        target (its row), in the adjacency's stored order (row-major for CSR and
        ``SparseTensor``, column-major for CSC, as stored for COO: an uncoalesced tensor's
        repeated entries are separate edges, as in an ``edge_index``), and the stored values
        ``[E, ...]`` (``None`` for a ``SparseTensor`` without values).

    Raises:
        TypeError: ``adj`` is not a sparse adjacency.
        ValueError: its shape is not ``[num_dst, num_src, ...]``.
    """
    if isinstance(adj, SparseTensor):
        shape = tuple(adj.sparse_sizes())
        row, col, values = adj.coo()
    elif is_torch_sparse_tensor(adj):
        if adj.dim() - adj.dense_dim() != 2:
            raise ValueError(
                f"a sparse adjacency needs exactly 2 sparse dimensions (target, source), got "
                f"{adj.dim() - adj.dense_dim()} (shape {tuple(adj.shape)})"
            )
        shape = tuple(adj.shape[:2])
        if adj.layout == torch.sparse_coo:
            (row, col), values = adj._indices(), adj._values()
        elif adj.layout == torch.sparse_csr:
            row = _expand_pointers(adj.crow_indices(), adj.col_indices())
            col, values = adj.col_indices(), adj.values()
        else:  # CSC
            col = _expand_pointers(adj.ccol_indices(), adj.row_indices())
            row, values = adj.row_indices(), adj.values()
    else:
        raise TypeError(f"expected a sparse adjacency, got {type(adj).__name__}")
    if shape != (num_dst, num_src):
        raise ValueError(
            f"a sparse adjacency adj_t[target, source] must have shape [num_dst, num_src] = "
            f"[{num_dst}, {num_src}], got {list(shape)}"
        )
    return torch.stack([col, row.to(col.dtype)]), values


def _expand_pointers(ptr: Tensor, ids: Tensor) -> Tensor:
    """The compressed ids of a CSR/CSC tensor, one per stored entry (no host sync)."""
    return torch.ops.aten._convert_indices_from_csr_to_coo(
        ptr, ids, out_int32=ids.dtype == torch.int32
    )[0]


def edge_values_to_adjacency(adj: Tensor | SparseTensor, values: Tensor) -> Tensor | SparseTensor:
    """``adj`` with its stored values replaced by ``values [E, ...]`` (in the order of
    :func:`adjacency_to_edge_index`), e.g. attention weights ``[E, H]``: the same layout and
    sparsity pattern, trailing dimensions for the values' trailing dimensions."""
    if isinstance(adj, SparseTensor):
        return adj.set_value(values, layout="coo")
    size = (*adj.shape[:2], *values.shape[1:])
    if adj.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(
            adj._indices(), values, size, is_coalesced=adj.is_coalesced(), check_invariants=False
        )
    return _compressed(adj.layout, *_index_tensors(adj)[1:], values, size)


def edge_index_to_adjacency(
    edge_index: Tensor, values: Tensor, num_src: int, num_dst: int, layout: torch.layout
) -> tuple[Tensor, Tensor]:
    """Per-edge ``values [E, ...]`` as a ``torch.sparse`` adjacency ``[num_dst, num_src, ...]``
    of ``layout`` (row = target), and the values in its stored order.

    COO keeps the edge order (no sort, no host sync); CSR and CSC sort the edges by row
    (column), then column (row)."""
    src, dst = edge_index.long()
    size = (num_dst, num_src, *values.shape[1:])
    if layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(
            torch.stack([dst, src]), values, size, check_invariants=False
        ), values
    csr = layout == torch.sparse_csr
    major, minor, count = (dst, src, num_dst) if csr else (src, dst, num_src)
    perm = torch.argsort(major * (num_src if csr else num_dst) + minor, stable=True)
    ptr = torch.ops.aten._convert_indices_from_coo_to_csr(major[perm], count, out_int32=False)
    values = values[perm]
    return _compressed(layout, ptr, minor[perm], values, size), values


def _compressed(layout, ptr: Tensor, ids: Tensor, values: Tensor, size) -> Tensor:
    """A CSR or CSC tensor, without PyTorch's beta warning or an invariant check."""
    csr = layout == torch.sparse_csr
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse CSC tensor support is in beta")
        return (torch.sparse_csr_tensor if csr else torch.sparse_csc_tensor)(
            ptr, ids, values, size, device=values.device, check_invariants=False
        )
