r"""Per-edge dot products and per-target weighted sums without per-edge feature tensors.

Attention over an arbitrary graph needs two products over its edges
:math:`e = (j \to i)`, per head :math:`h`:

.. math::
    s_e^{(h)} = a_i^{(h)\top} b_j^{(h)}
    \quad\text{(SDDMM, :func:`edge_dot`)}, \qquad
    o_i^{(h)} = \sum_{e = (j \to i)} w_e^{(h)}\, b_j^{(h)}
    \quad\text{(SpMM, :func:`edge_aggregate`)}.

Written as ``(a[dst] * b[src]).sum(-1)`` and ``scatter(w[:, :, None] * b[src], dst)``
(as :class:`torch_geometric.nn.conv.TransformerConv` does) both gather a
``[E, H, C]`` tensor per call and per gradient. Here they run as sparse-CSR
kernels (:func:`torch.sparse.sampled_addmm` and CSR @ dense), so only
``[E, H]`` tensors are ever formed; the backward passes are the same two
products on the same graph and on its transpose:

.. math::
    \frac{\partial L}{\partial a} = S \, b, \quad
    \frac{\partial L}{\partial b} = S^\top a
    \ \text{(for } s = \text{edge\_dot}(a, b),\ S_{ij} = \partial L / \partial s_e),
    \qquad
    \frac{\partial L}{\partial w_e} = g_i^\top b_j, \quad
    \frac{\partial L}{\partial b} = W^\top g
    \ \text{(for } o = \text{edge\_aggregate}(w, b)).

Both functions take an :class:`EdgeCSR`, the graph sorted by target (and by
source inside a target), built once and shared by every call and head.
Duplicate edges are kept (each is its own term); targets without incoming
edges get :math:`0`.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, differentiable_once
from hiergraph._checks import check_int
from hiergraph._device import reads_values
from hiergraph._precision import accumulation_dtype, autocast_off
from hiergraph.ops.edge_index import check_edge_index


def _csr(crow: Tensor, col: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(  # device: not the default device, whatever it is
            crow, col, values, shape, device=values.device, check_invariants=False
        )


class EdgeCSR:
    r"""An ``edge_index`` sorted by target (then source), with its CSR pointers
    and those of its transpose.

    Build it once per graph and pass it to every :func:`edge_dot` and
    :func:`edge_aggregate` call (and every head) on that graph.

    Args:
        edge_index: ``[2, E]`` int64 or int32 ids, row 0 = source :math:`j`, row 1 = target
            :math:`i`, in ``[0, num_src)`` and ``[0, num_dst)``.
        size: ``(num_src, num_dst)``.
        check: check the id range (:func:`~hiergraph.ops.edge_index.check_edge_index`: read
            on the host for CPU ids, a device-side assertion on an accelerator, no host
            sync). The kernels index memory with the ids unchecked, so pass ``False`` only
            when the caller has just checked them itself. The type and shape are always
            checked.

    Attributes:
        edge_index: the sorted ``[2, E]`` edges.
        perm: ``[E]`` with ``sorted = edge_index[:, perm]``, or ``None`` when
            the input was already sorted (no copy is made then; CPU ids only: on an
            accelerator the edges are always sorted, which costs less than asking the host).
        crow: ``[num_dst + 1]`` CSR row pointers of the targets.
    """

    def __init__(self, edge_index: Tensor, size: tuple[int, int], *, check: bool = True):
        if not isinstance(size, tuple | list) or len(size) != 2:  # (an int: "has no len()")
            raise ValueError(f"size must be (num_src, num_dst), got {size!r}")
        for n in size:
            check_int(n, "size: num_src and num_dst", minimum=0)
        self.num_src, self.num_dst = size
        check_edge_index(edge_index, self.num_src, self.num_dst, check_range=check)
        # int64 (an int32 key dst * num_src + src could overflow) and contiguous: the CSR
        # kernels read the source row as a plain array, whatever its strides
        edge_index = edge_index.long().contiguous()
        host = reads_values(edge_index)
        src, dst = edge_index
        key = dst * self.num_src + src
        self.perm = None
        # on an accelerator, sorting is cheaper than asking the host whether it is needed
        if key.numel() > 1 and (not host or not bool((key[1:] >= key[:-1]).all())):
            self.perm = torch.argsort(key)
            edge_index = edge_index[:, self.perm]
        self.edge_index = edge_index
        self.crow = torch.ops.aten._convert_indices_from_coo_to_csr(
            edge_index[1], self.num_dst, out_int32=False
        )
        self._transpose: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def num_edges(self) -> int:
        return self.edge_index.size(1)

    def transpose(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(crow_t [num_src + 1], col_t [E], perm_t [E])``: the edges sorted by
        source, ``perm_t`` mapping sorted-by-source to sorted-by-target order
        (computed once, on first use: only backward passes need it)."""
        if self._transpose is None:
            src, dst = self.edge_index
            perm_t = torch.argsort(src * self.num_dst + dst)
            crow_t = torch.ops.aten._convert_indices_from_coo_to_csr(
                src[perm_t], self.num_src, out_int32=False
            )
            self._transpose = (crow_t, dst[perm_t], perm_t)
        return self._transpose


def _accumulating(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """The operands in the dtype the sparse kernels compute in: their common dtype, and at
    least float32 (the CSR kernels take no half types, and long sums need fp32 anyway)."""
    dtype = accumulation_dtype(torch.result_type(x, y))
    return x.to(dtype), y.to(dtype)


def _dot(a: Tensor, b: Tensor, graph: EdgeCSR) -> Tensor:
    """``[E, H]``: ``a[dst_e, h] . b[src_e, h]`` for ``a [N_dst, H, C]``, ``b [N_src, H, C]``,
    computed in :func:`_accumulating` precision and returned in the inputs' common dtype."""
    out = a.new_empty(graph.num_edges, a.size(1), dtype=torch.result_type(a, b))
    if graph.num_edges == 0:
        return out
    a, b = _accumulating(a, b)
    if graph.num_edges > graph.num_dst * graph.num_src:  # duplicates the CSR kernel refuses
        src, dst = graph.edge_index
        return (a.index_select(0, dst) * b.index_select(0, src)).sum(-1).to(out.dtype)
    # zeros, not empty: beta = 0 still multiplies the pattern's values (NaN * 0 = NaN)
    pattern = _csr(graph.crow, graph.edge_index[0], a.new_zeros(graph.num_edges),
                   (graph.num_dst, graph.num_src))  # fmt: skip
    with autocast_off(a.device.type):  # autocast would cast back to half
        for h in range(a.size(1)):
            product = torch.sparse.sampled_addmm(pattern, a[:, h], b[:, h].T, beta=0.0)
            out[:, h] = product.values()
    return out


def _aggregate(weight: Tensor, b: Tensor, graph: EdgeCSR, transpose: bool = False) -> Tensor:
    """``[N_dst, H, C]``: ``sum_e weight[e, h] b[src_e, h]`` (or, transposed,
    ``[N_src, H, C]``: ``sum_e weight[e, h] b[dst_e, h]``), in the inputs' common dtype."""
    dtype = torch.result_type(weight, b)
    weight, b = _accumulating(weight, b)
    if transpose:
        crow, col, perm = graph.transpose()
        weight, shape = weight[perm], (graph.num_src, graph.num_dst)
    else:
        crow, col, shape = graph.crow, graph.edge_index[0], (graph.num_dst, graph.num_src)
    out = b.new_empty(shape[0], *b.shape[1:], dtype=dtype)
    with autocast_off(b.device.type):  # autocast would cast back to half
        # contiguous per-head operands: CSR @ strided dense is ~2x slower
        for h in range(b.size(1)):
            out[:, h] = _csr(crow, col, weight[:, h].contiguous(), shape) @ b[:, h].contiguous()
    return out


class _EdgeDot(AutogradFunction):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, graph: EdgeCSR) -> Tensor:
        ctx.save_for_backward(a, b)
        ctx.graph = graph
        return _dot(a, b, graph)

    @staticmethod
    @differentiable_once
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        grad_a = _aggregate(grad, b, ctx.graph) if ctx.needs_input_grad[0] else None
        grad_b = _aggregate(grad, a, ctx.graph, transpose=True) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


class _EdgeAggregate(AutogradFunction):
    @staticmethod
    def forward(ctx, weight: Tensor, b: Tensor, graph: EdgeCSR) -> Tensor:
        ctx.save_for_backward(weight, b)
        ctx.graph = graph
        return _aggregate(weight, b, graph)

    @staticmethod
    @differentiable_once
    def backward(ctx, grad: Tensor):
        weight, b = ctx.saved_tensors
        grad = grad.contiguous()
        grad_w = _dot(grad, b, ctx.graph) if ctx.needs_input_grad[0] else None
        grad_b = (
            _aggregate(weight, grad, ctx.graph, transpose=True) if ctx.needs_input_grad[1] else None
        )
        return grad_w, grad_b, None


def _check_graph(graph) -> None:
    if not isinstance(graph, EdgeCSR):
        raise TypeError(
            f"graph must be an EdgeCSR (EdgeCSR(edge_index, size)), got {type(graph).__name__}"
        )


def _check(name: str, t: Tensor, rows: int, heads: int | None = None, graph=None) -> None:
    if t.dim() != 3 or t.size(0) != rows or (heads is not None and t.size(1) != heads):
        want = f"[{rows}, {'H' if heads is None else heads}, C]"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if graph is not None and t.device != graph.edge_index.device:
        raise ValueError(
            f"{name} is on {t.device} but the graph's edges are on {graph.edge_index.device}"
        )


def edge_dot(a: Tensor, b: Tensor, graph: EdgeCSR) -> Tensor:
    r"""Per-edge, per-head dot products :math:`s_e^{(h)} = a_i^{(h)\top} b_j^{(h)}`.

    Args:
        a: ``[num_dst, H, C]`` target features (e.g. queries).
        b: ``[num_src, H, C]`` source features (e.g. keys).
        graph: the edges, sorted (:class:`EdgeCSR`).

    Returns:
        ``[E, H]`` in the order of ``graph.edge_index``; differentiable in ``a`` and ``b``.
    """
    _check_graph(graph)
    _check("a", a, graph.num_dst, graph=graph)
    _check("b", b, graph.num_src, a.size(1), graph)
    if a.size(2) != b.size(2):
        raise ValueError(f"a and b need the same channel size, got {a.size(2)} and {b.size(2)}")
    if not (a.is_floating_point() and b.is_floating_point()):  # (an error of the sparse kernel)
        raise TypeError(f"a and b must be floating-point, got {a.dtype} and {b.dtype}")
    return _EdgeDot.apply(a, b, graph)


def edge_aggregate(weight: Tensor, b: Tensor, graph: EdgeCSR) -> Tensor:
    r"""Per-target weighted sums :math:`o_i^{(h)} = \sum_{e = (j \to i)} w_e^{(h)} b_j^{(h)}`.

    Args:
        weight: ``[E, H]`` edge weights in the order of ``graph.edge_index``.
        b: ``[num_src, H, C]`` source features (e.g. values).
        graph: the edges, sorted (:class:`EdgeCSR`).

    Returns:
        ``[num_dst, H, C]`` (zero rows for targets without edges);
        differentiable in ``weight`` and ``b``.
    """
    _check_graph(graph)
    _check("b", b, graph.num_src, graph=graph)
    if weight.shape != (graph.num_edges, b.size(1)):
        raise ValueError(
            f"weight must have shape [E, H] = [{graph.num_edges}, {b.size(1)}], "
            f"got {tuple(weight.shape)}"
        )
    return _EdgeAggregate.apply(weight, b, graph)
