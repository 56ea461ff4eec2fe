"""Masked multi-head dot-product attention as message passing over a relational mask."""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import softmax

from hiergraph._checks import check_int
from hiergraph._precision import widened
from hiergraph.masks.band import BandMask
from hiergraph.nn._checks import check_conv_arguments, check_dtype, node_pair
from hiergraph.nn._edges import EdgeInput
from hiergraph.ops.edge_index import edge_values_to_adjacency
from hiergraph.ops.masked.banded import banded_attention
from hiergraph.ops.masked.edge_products import EdgeCSR, edge_aggregate, edge_dot


class MaskedAttentionConv(MessagePassing):
    r"""Scaled dot-product attention restricted to a relational mask, from
    Mijangos et al., *Relational inductive biases on attention mechanisms*
    (Lemma 1, Def. 9): masked attention *is* message passing on the mask's
    graph, with ``edge_index[0]`` the keys/values and ``edge_index[1]`` the
    queries (see :mod:`hiergraph.masks`).

    For every head :math:`h` with :math:`C` channels,

    .. math::
        \alpha_{ij}^{(h)} = \operatorname{softmax}_{j \in \mathcal{N}(i)}\left(
            \frac{\big(W_q^{(h)} x_i\big)^\top \big(W_k^{(h)} x_j + W_e^{(h)} e_{ij}\big)}
                 {\sqrt{C}} + b_{ij}^{(h)} \right),

    .. math::
        x'_i = W_r x_i + \mathop{\Big\Vert}_{h=1}^{H} \sum_{j \in \mathcal{N}(i)}
            \alpha_{ij}^{(h)} \big(W_v^{(h)} x_j + W_e^{(h)} e_{ij}\big),

    where :math:`\Vert` concatenates the heads (or averages them when
    ``concat=False``), :math:`W_e e_{ij}` is present when ``edge_dim`` is set
    and :math:`b_{ij}` (an additive logit bias) when ``edge_attr`` is passed
    without ``edge_dim``. With the same parameters (same attribute names) it
    equals :class:`torch_geometric.nn.conv.TransformerConv` (``beta=False``).

    A query with no incoming edge gets :math:`0` from the attention term, so
    its output is the root term :math:`W_r x_i` (or :math:`0` without
    ``root_weight``), never NaN and never an average over all tokens.

    **Structured fast path.** When ``edge_index`` is a band (sliding window,
    causal window, dilated window, causal, full or block-diagonal mask,
    possibly over a batch of sequences; see :class:`~hiergraph.masks.BandMask`),
    the layer runs :func:`~hiergraph.ops.banded_attention`, blocked dense
    kernels that never gather per-edge tensors. The band is recognised exactly
    from ``edge_index`` in :math:`O(E)` (:meth:`BandMask.detect`, which reads the ids on
    the host) once per graph (see *Per-graph structure* below), or passed directly as a
    :class:`BandMask` in place of ``edge_index``. The fast path
    is taken only for a single ``x``, no ``edge_attr`` and no
    ``return_attention_weights``; otherwise (and with ``structured=False``) the
    general edge path runs. Both paths give the same result on finite inputs. A NaN or
    inf in a key or value row reaches, on the fast path, every query of the blocks whose
    key window holds that row, neighbouring sequences of a batch included (a masked
    key's weight 0 times NaN, as in masked
    :func:`~torch.nn.functional.scaled_dot_product_attention`); on the edge path only the
    queries it is an edge of.

    **General edge path.** Any other mask runs over its edges: per-edge logits
    and the weighted sum of values are sparse kernels
    (:func:`~hiergraph.ops.masked.edge_products.edge_dot`,
    :func:`~hiergraph.ops.masked.edge_products.edge_aggregate`) that form only
    ``[E, H]`` tensors, never the per-edge ``[E, H, C]`` gathers of
    :class:`~torch_geometric.nn.conv.TransformerConv`; the softmax per target is
    :func:`torch_geometric.utils.softmax`. Edge features (``edge_dim``) add
    per-edge terms through :meth:`edge_updater` and :meth:`propagate`.

    **Per-graph structure.** What the layer derives from a graph, the recognised band (or
    that there is none) and the general path's edges sorted by target with their CSR
    pointers (:class:`~hiergraph.ops.masked.edge_products.EdgeCSR`), is computed on the
    first call with an ``edge_index`` (or adjacency) and reused while the same tensor comes
    back unmodified with the same node counts, as in a training loop over one graph: no
    :math:`O(E)` recognition, sort or host read per step. Another tensor, a write into it
    (its in-place version changes) or other node counts derive it again. The layer keeps
    the structure of its last graph only, and refers to that graph's tensor weakly (the
    sorted edges of an already sorted int64 ``edge_index`` are that tensor itself, kept
    until the next graph). Nothing is cached under ``torch.inference_mode`` or while
    ``torch.compile`` traces the layer. A write that bypasses the version counter
    (through ``.data``, ``.numpy()`` or DLPack) is not seen: pass a new tensor after one.

    **Adjacency input.** As PyG's convs do, the mask may also be a sparse adjacency
    ``adj_t`` of shape ``[num_dst, num_src]`` with **row = target = query, column =
    source = key** (the transpose of ``edge_index``'s layout): a ``torch.sparse`` COO, CSR
    or CSC tensor, or a ``torch_sparse.SparseTensor`` when torch-sparse is installed. Its
    stored entries are the edges, in stored order (an uncoalesced COO tensor's repeated
    entries are separate edges, as repeated columns of an ``edge_index`` are). Its values
    become ``edge_attr`` when none is passed, as in PyG's ``MessagePassing``: a
    ``SparseTensor``'s values, or the ``[E, ...]`` values of a hybrid ``torch.sparse``
    tensor (scalar values, such as the ones of a plain mask, are ignored). An explicit
    ``edge_attr`` follows the adjacency's stored order.

    **Input checks.** ``edge_index`` must be an int64 or int32 tensor ``[2, E]`` (checked
    every call, without reading values). Its ids are checked against the node counts once
    per ``edge_index`` tensor (again after it is replaced or written in place): read on
    the host for CPU tensors, a device-side assertion on an accelerator (no host sync);
    ``validate=False`` skips that (see :mod:`hiergraph.ops.edge_index`).

    Args:
        in_channels (int or tuple): size of each input sample, or a pair (source,
            target) for bipartite graphs; ``-1`` infers a size on the first call
            (PyG's lazy :class:`~torch_geometric.nn.dense.Linear`, as
            :func:`~torch_geometric.nn.to_hetero` needs).
        out_channels (int): channels :math:`C` per head.
        heads (int, optional): number of heads :math:`H`. (default: :obj:`1`)
        concat (bool, optional): concatenate the heads (output :math:`H C`) or
            average them (output :math:`C`). (default: :obj:`True`)
        dropout (float, optional): dropout probability on the attention weights
            (training only), in :math:`[0, 1]` as for :class:`torch.nn.Dropout`.
            (default: :obj:`0.`)
        root_weight (bool, optional): add the root term :math:`W_r x_i`.
            (default: :obj:`True`)
        edge_dim (int, optional): size of edge features added to keys and values;
            :obj:`None` makes ``edge_attr`` an additive logit bias of shape ``[E]``
            or ``[E, H]``. (default: :obj:`None`)
        bias (bool, optional): learn additive biases in the projections.
            (default: :obj:`True`)
        structured (bool, optional): allow the banded fast path.
            (default: :obj:`True`)
        validate (bool, optional): check the ids of ``edge_index`` (or of an
            adjacency) against the node counts, once per tensor; the type and shape
            are always checked. (default: :obj:`True`)
        **kwargs (optional): passed on to
            :class:`~torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F)` or a pair
          :math:`((|\mathcal{V}_s|, F_s), (|\mathcal{V}_t|, F_t))`; ``edge_index``
          :math:`(2, |\mathcal{E}|)`, a :class:`BandMask` or a sparse adjacency
          :math:`(|\mathcal{V}_t|, |\mathcal{V}_s|)`; ``edge_attr``
          :math:`(|\mathcal{E}|, D)`, :math:`(|\mathcal{E}|)` or :math:`(|\mathcal{E}|, H)`.
        - **output:** :math:`(|\mathcal{V}_t|, H C)` (or :math:`C`), and with
          ``return_attention_weights`` also ``(edge_index, alpha)`` with alpha
          :math:`(|\mathcal{E}|, H)` (before dropout); for a ``torch.sparse`` adjacency
          ``(adj, alpha)`` with ``adj`` the adjacency holding ``alpha`` as its values
          (same layout and pattern, :math:`(|\mathcal{V}_t|, |\mathcal{V}_s|, H)`), and
          for a ``SparseTensor`` that ``SparseTensor`` (as PyG's ``GATConv`` returns them).
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        dropout: float = 0.0,
        root_weight: bool = True,
        edge_dim: int | None = None,
        bias: bool = True,
        structured: bool = True,
        validate: bool = True,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        in_src, in_dst = check_conv_arguments(in_channels, out_channels, heads, dropout)
        check_int(edge_dim, "edge_dim", optional=True)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.dropout = dropout
        self.root_weight = root_weight
        self.edge_dim = edge_dim
        self.structured = structured
        self.validate = validate
        self._edges = EdgeInput("a BandMask or a sparse adjacency")

        in_dst = in_src if in_dst is None else in_dst
        self.lin_key = Linear(in_src, heads * out_channels, bias=bias)
        self.lin_query = Linear(in_dst, heads * out_channels, bias=bias)
        self.lin_value = Linear(in_src, heads * out_channels, bias=bias)
        self.lin_edge = (
            Linear(edge_dim, heads * out_channels, bias=False) if edge_dim is not None else None
        )
        out_total = heads * out_channels if concat else out_channels
        self.lin_skip = Linear(in_dst, out_total, bias=bias) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip):
            if lin is not None:
                lin.reset_parameters()

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Tensor | BandMask | SparseTensor,
        edge_attr: Tensor | None = None,
        return_attention_weights: Literal[False] | None = None,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Tensor | BandMask,
        edge_attr: Tensor | None = None,
        return_attention_weights: Literal[True] = ...,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]: ...

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: SparseTensor,
        edge_attr: Tensor | None = None,
        return_attention_weights: Literal[True] = ...,
    ) -> tuple[Tensor, SparseTensor]: ...

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Tensor | BandMask | SparseTensor,
        edge_attr: Tensor | None = None,
        return_attention_weights: bool | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]] | tuple[Tensor, SparseTensor]:
        r"""Attention of every target over its incoming mask edges.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features, or a
                pair ``(x_src, x_dst)``.
            edge_index (torch.Tensor, BandMask or SparseTensor): ``[2, E]`` mask edges
                (key -> query), a :class:`BandMask` over ``x``'s nodes, or a sparse
                adjacency ``adj_t[query, key]`` (see the class docstring).
            edge_attr (torch.Tensor, optional): edge features ``[E, edge_dim]``, or a
                logit bias ``[E]``/``[E, H]`` when ``edge_dim`` is :obj:`None`.
                (default: :obj:`None`)
            return_attention_weights (bool, optional): if :obj:`True`, also return
                ``(edge_index, alpha)`` (see the class docstring for adjacency inputs);
                :obj:`None` or :obj:`False` return the output only (unlike PyG's
                ``GATConv``, where :obj:`False` also returns the weights).
                (default: :obj:`None`)
        """
        H, C = self.heads, self.out_channels
        x_src, x_dst = node_pair(x)
        self._check_features(x_src, x_dst, single=isinstance(x, Tensor))
        size = (x_src.size(0), x_dst.size(0))
        band = edge_index if isinstance(edge_index, BandMask) else None
        adj = structures = None
        if band is None:  # the structure derived from the graph is cached per graph
            edge_index, adj, values, structures = self._edges(
                edge_index, *size, validate=self.validate, device=x_dst.device
            )
            # PyG's rule: a SparseTensor's values, a torch.sparse tensor's [E, ...] values
            hybrid = values is not None and values.dim() > 1
            if edge_attr is None and (hybrid or isinstance(adj, SparseTensor)):
                edge_attr = values
        elif x_src is not x_dst or band.num_nodes != x_dst.size(0):
            raise ValueError(
                f"a BandMask over {band.num_nodes} nodes needs a single x with as many rows; "
                f"got x of {x_dst.size(0)} rows"
            )
        if edge_attr is None and self.lin_edge is not None:  # (the banded path ignored it)
            raise ValueError(f"this layer has edge_dim={self.edge_dim}: pass edge_attr")
        fast = (
            self.structured
            and x_src is x_dst
            and edge_attr is None
            and not return_attention_weights
        )
        if fast and band is None:  # before the projections: its O(E) temporaries die first
            # the ids were checked above, as self.validate asks (not a second time here)
            band = structures.get(
                "band", lambda: BandMask.detect(edge_index, size[1], check_range=False)
            )
        query = self.lin_query(x_dst).view(-1, H, C)
        key = self.lin_key(x_src).view(-1, H, C)
        value = self.lin_value(x_src).view(-1, H, C)
        if fast and band is not None:
            out = banded_attention(
                query, key, value, band.before, band.after, band.lengths, band.dilation,
                dropout_p=self.dropout if self.training else 0.0,
            )  # fmt: skip
            alpha = None
        else:
            if isinstance(edge_index, BandMask):
                edge_index = edge_index.edge_index(x_dst.device)
                graph = EdgeCSR(edge_index, size, check=False)  # a BandMask's ids are in range
            else:  # self._edges checked the ids
                graph = structures.get("csr", lambda: EdgeCSR(edge_index, size, check=False))
            out, alpha = self._edge_attention(query, key, value, graph, edge_attr)

        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.lin_skip is not None:
            out = out + self.lin_skip(x_dst)
        if not return_attention_weights:
            return out
        if isinstance(adj, SparseTensor):
            return out, edge_values_to_adjacency(adj, alpha)
        if adj is not None:
            return out, (edge_values_to_adjacency(adj, alpha), alpha)
        return out, (edge_index, alpha)

    def _check_features(self, x_src: Tensor, x_dst: Tensor, single: bool) -> None:
        """Shapes and dtypes of the sources' and targets' features (one ``x`` if ``single``)."""
        names = ("x", "x") if single else ("x_src", "x_dst")
        pairs = ((names[0], x_src, self.lin_key), (names[1], x_dst, self.lin_query))
        for name, t, lin in pairs:
            size = lin.in_channels  # -1 until a lazy projection has seen its input
            if not isinstance(t, Tensor) or t.dim() != 2 or (size > 0 and t.size(1) != size):
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be a [num_nodes, {size}] tensor (in_channels of "
                    f"this layer), got {shape}; pass x or a pair (x_src, x_dst)"
                )
            check_dtype(t, lin.weight, name)

    def _edge_terms(
        self, edge_attr: Tensor | None, num_edges: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(edge_emb [E, H, C] or None, logit_bias [E, 1 or H] or None)``."""
        if edge_attr is None:  # (forward refused a layer with edge_dim without them)
            return None, None
        if self.lin_edge is not None:
            if edge_attr.dim() != 2 or edge_attr.shape != (num_edges, self.edge_dim):
                raise ValueError(
                    f"edge_attr must be [E, edge_dim] = [{num_edges}, {self.edge_dim}], "
                    f"got {tuple(edge_attr.shape)}"
                )
            return self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels), None
        if edge_attr.shape not in ((num_edges,), (num_edges, self.heads)):
            raise ValueError(
                f"without edge_dim, edge_attr is a logit bias of shape [E] or [E, heads] = "
                f"[{num_edges}] or [{num_edges}, {self.heads}], got {tuple(edge_attr.shape)}"
            )
        return None, edge_attr.reshape(num_edges, 1 if edge_attr.dim() == 1 else self.heads)

    def _edge_attention(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        graph: EdgeCSR,
        edge_attr: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """The general path over ``graph`` (the mask's edges sorted by target, built once
        per graph): per-edge logits, softmax per target, weighted sum.

        The node-to-node products run as sparse kernels
        (:mod:`hiergraph.ops.masked.edge_products`), which never form per-edge
        ``[E, H, C]`` tensors; only the edge-feature terms (``edge_dim``) are
        per-edge, through :meth:`edge_updater` and :meth:`propagate`. Half-precision
        rows take their logits, softmax and sums in float32 (a bf16 softmax sums a target's
        weights in bf16, which stalls past a few hundred keys); the output and the weights
        are rounded once.
        """
        size = (graph.num_src, graph.num_dst)
        dtype = value.dtype
        query, key = widened(query, key)
        edge_emb, logit_bias = self._edge_terms(edge_attr, graph.num_edges)
        if graph.perm is not None:  # work in target-sorted order, report in the caller's
            edge_emb = edge_emb[graph.perm] if edge_emb is not None else None
            logit_bias = logit_bias[graph.perm] if logit_bias is not None else None
        logits = edge_dot(query, key, graph)
        if edge_emb is not None:
            logits = logits + self.edge_updater(
                graph.edge_index, query=query, edge_emb=edge_emb, size=size
            )
        logits = logits / math.sqrt(self.out_channels)
        if logit_bias is not None:
            logits = logits + logit_bias
        alpha = softmax(logits, graph.edge_index[1], graph.crow, size[1])
        weights = F.dropout(alpha, p=self.dropout, training=self.training)
        out = edge_aggregate(weights, value, graph)
        if edge_emb is not None:
            out = out + self.propagate(
                graph.edge_index, alpha=weights, edge_emb=edge_emb, size=size
            )
        if graph.perm is not None:
            alpha = alpha[torch.argsort(graph.perm)]
        return out.to(dtype), alpha.to(dtype)

    def edge_update(self, query_i: Tensor, edge_emb: Tensor) -> Tensor:
        """The edge-feature part of the logits, :math:`q_i^\top W_e e_{ij}`, ``[E, H]``."""
        return (query_i * edge_emb).sum(dim=-1)

    def message(self, alpha: Tensor, edge_emb: Tensor) -> Tensor:
        """The edge-feature part of the messages, :math:`\alpha_{ij} W_e e_{ij}`."""
        return edge_emb * alpha.unsqueeze(-1)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"heads={self.heads})"
        )
