r"""``ConeConv``: GAT-style message passing with cone-attention scores."""

from __future__ import annotations

import math
from functools import partial
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros
from torch_geometric.typing import Adj, SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, remove_self_loops, softmax

from hiergraph._checks import check_positive
from hiergraph._precision import accumulation_dtype
from hiergraph.nn._checks import (
    check_conv_arguments,
    check_features,
    check_int,
    check_probability,
    node_pair,
)
from hiergraph.nn._edges import EdgeInput
from hiergraph.ops.cone import DEFAULT_RADIUS, cone_geometry, edge_pairs
from hiergraph.ops.edge_index import edge_index_to_adjacency, edge_values_to_adjacency

#: Score variants: the two cone attentions and the dot-product baseline of the paper.
VARIANTS = (*DEFAULT_RADIUS, "dot")


class ConeConv(MessagePassing):
    r"""Graph attention with cone-attention scores (Tseng et al., "Coneheads: Hierarchy
    Aware Attention", NeurIPS 2023, https://arxiv.org/abs/2306.00392).

    The GAT layer of Veličković et al. with its concatenation score replaced by
    minus the height of the lowest common ancestor of query and key in the
    Poincaré half-space (``hiergraph.ops.cone``):

    .. math::
        \mathbf{x}'_i = \mathop{\Big\Vert}_{h=1}^{H} \sum_{j \in \mathcal{N}(i) \cup \{i\}}
            \alpha^{h}_{ij}\, \mathbf{W}^{h} \mathbf{x}_j, \qquad
        \alpha^{h}_{ij} = \operatorname{softmax}_{j \in \mathcal{N}(i) \cup \{i\}}
            \big(-\gamma\, H(\phi(\mathbf{q}^{h}_i), \phi(\mathbf{k}^{h}_j))\big),

    where :math:`\phi` is ξ (penumbral) or ψ (umbral) and the last coordinate of
    each per-head query/key vector becomes its height. The mean over heads
    replaces the concatenation when ``concat=False``.

    Queries and keys: by default (``share_qk=True``) both are the projected
    features, :math:`\mathbf{q}^h_j = \mathbf{k}^h_j = \mathbf{W}^h \mathbf{x}_j`
    (per-head dimension ``out_channels``), reusing GAT's single projection; the
    paper does not say how it formed them. ``share_qk=False`` adds separate
    projections :math:`\mathbf{W}_q, \mathbf{W}_k` of ``qk_channels`` per head.

    Bipartite graphs, as in PyG's ``GATConv``: pass ``x = (x_src, x_dst)``; values
    and keys come from the sources, queries from the targets. With an int
    ``in_channels`` both sides share the projections; ``in_channels=(src, dst)``
    gives the targets their own query projection. ``in_channels=-1`` (or ``(-1, -1)``)
    infers the sizes on the first call, so the layer works with
    :func:`torch_geometric.nn.to_hetero`.

    ``variant="dot"`` scores :math:`\langle \mathbf{q}_i, \mathbf{k}_j \rangle/\sqrt{d}`
    with everything else unchanged: the paper's dot-product baseline.

    Args:
        in_channels (int or tuple): input feature size, ``(source, target)`` sizes for
            a bipartite graph with separate query projections, or ``-1`` to infer it.
        out_channels (int): output size per head.
        heads (int, optional): number of attention heads :math:`H`.
            (default: :obj:`1`)
        concat (bool, optional): concatenate heads (``[N, H * out_channels]``) or
            average them (``[N, out_channels]``). (default: :obj:`True`)
        dropout (float, optional): dropout on the attention coefficients, in
            :math:`[0, 1]` as for :class:`torch.nn.Dropout`. (default: :obj:`0.`)
        add_self_loops (bool, optional): add a self loop to every node (existing ones
            are replaced). The looped edges are built once per graph and reused while the
            same ``edge_index`` (or adjacency) tensor comes back unmodified with the same
            node counts, as in a training loop over one graph; another tensor, a write into
            it or other node counts build them again (a write through ``.data``,
            ``.numpy()`` or DLPack is not seen: pass a new tensor after one). The layer
            keeps the looped edges of its last graph only and refers to the graph's tensor
            weakly. (default: :obj:`True`)
        variant (str, optional): ``"penumbral"``, ``"umbral"`` or ``"dot"``.
            (default: :obj:`"penumbral"`)
        r (float, optional): penumbral light-source height / umbral ball radius;
            :obj:`None` takes the paper's 1.0 / 0.1. (default: :obj:`None`)
        gamma (float, optional): score temperature :math:`\gamma > 0` (unused by
            ``"dot"``); with :obj:`learn_gamma` the initial value of every head's
            temperature. (default: :obj:`1.0`)
        learn_gamma (bool, optional): learn one temperature per head,
            :math:`\gamma_h = e^{\theta_h}` (positive by construction), initialised at
            :obj:`gamma`. The paper gives no :math:`\gamma`; this lets each head choose
            how peaked its attention is. (default: :obj:`False`)
        squared (bool, optional): penumbral: score :math:`-\gamma H^2` (authors' code)
            instead of :math:`-\gamma H`. (default: :obj:`False`)
        height_scale (float, optional): umbral: ψ height :math:`e^{c x_d}` with
            ``c = height_scale``; :obj:`None` for ``1/d`` per head (authors' code).
            (default: :obj:`1.0`)
        share_qk (bool, optional): use the value projection as query and key (for a
            bipartite graph with two ``in_channels``: queries from a target
            projection of the same size). (default: :obj:`True`)
        qk_channels (int, optional): per-head query/key size when
            ``share_qk=False``. (default: :obj:`None`, i.e. :obj:`out_channels`)
        bias (bool, optional): learn an additive output bias. (default: :obj:`True`)
        feature_dropout (float, optional): dropout on the projected features
            :math:`\mathbf{W}\mathbf{x}` (and on separate query/key projections),
            before scoring and aggregation: the recipe of pytorch-GAT, the code of the
            paper's GAT runs (Tseng et al., App. 7.5), which drops the projected
            features as well as the layer input and the coefficients; in :math:`[0, 1]`.
            (default: :obj:`0.`)
        validate (bool, optional): check that the ids of ``edge_index`` (or of a
            ``torch.sparse`` adjacency) lie within the node counts, once per tensor
            (again after it is replaced or written in place). The type and shape are
            always checked. On an accelerator the ids are never read on the host
            (that would stall the forward pass on a device-to-host copy): the check is
            a device-side assertion instead (see :mod:`hiergraph.ops.edge_index`).
            :obj:`False` skips the id check. (default: :obj:`True`)
        **kwargs (optional): passed to :class:`~torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** ``x [N, in_channels]`` (dense, or sparse CSR such as bag-of-words
          features: the projection is then a sparse matmul) or a pair
          ``(x_src [N_src, ·], x_dst [N_dst, ·])``, ``edge_index [2, E]`` (row 0 = source
          ``j``, row 1 = target ``i``), or a sparse adjacency ``adj_t [N_dst, N_src]``
          (row = target, column = source, as in PyG): a ``torch.sparse`` COO, CSR or CSC
          tensor (its values are ignored), or a ``SparseTensor`` (needs ``torch-sparse``).
        - **output:** ``[N_dst, H * out_channels]`` or ``[N_dst, out_channels]``; with
          ``return_attention_weights`` also ``(edge_index [2, E'], alpha [E', H])``,
          ``E'`` counting the self loops; for a ``torch.sparse`` adjacency
          ``(adj, alpha)``, ``adj [N_dst, N_src, H]`` holding ``alpha`` in the input's
          layout (with the self loops; in the input's stored order without them), and for
          a ``SparseTensor`` the ``SparseTensor`` holding ``alpha`` (as PyG's ``GATConv``).
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        variant: str = "penumbral",
        r: float | None = None,
        gamma: float = 1.0,
        learn_gamma: bool = False,
        squared: bool = False,
        height_scale: float | None = 1.0,
        share_qk: bool = True,
        qk_channels: int | None = None,
        bias: bool = True,
        feature_dropout: float = 0.0,
        validate: bool = True,
        **kwargs,
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        in_src, in_dst = check_conv_arguments(in_channels, out_channels, heads, dropout)
        check_int(qk_channels, "qk_channels", optional=True)
        check_probability(feature_dropout, "feature_dropout")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        check_positive(gamma, "gamma")
        if learn_gamma and variant == "dot":
            raise ValueError("learn_gamma applies to the cone variants only, not to 'dot'")
        qk_channels = out_channels if share_qk or qk_channels is None else qk_channels
        if variant != "dot" and qk_channels < 2:
            raise ValueError(
                f"cone attention needs >= 2 query/key channels per head (d-1 horizontal "
                f"coordinates and a height), got {qk_channels}; raise out_channels or "
                f"set share_qk=False with qk_channels >= 2"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.dropout = dropout
        self.feature_dropout = feature_dropout
        self.add_self_loops = add_self_loops
        self.variant = variant
        self.r = None if variant == "dot" else DEFAULT_RADIUS[variant] if r is None else r
        self.gamma = gamma
        self.learn_gamma = learn_gamma
        self.squared = squared
        self.height_scale = height_scale
        self.share_qk = share_qk
        self.qk_channels = qk_channels
        self.validate = validate
        self._edges = EdgeInput("a sparse adjacency", keep_sparse_tensor=True)
        if variant != "dot":
            self._to_halfspace, self._lca_height = cone_geometry(
                variant, self.r, squared=squared, height_scale=height_scale
            )

        glorot_linear = partial(Linear, bias=False, weight_initializer="glorot")
        self.lin = glorot_linear(in_src, heads * out_channels)
        # fused W_q, W_k on one input size; with two sizes W_k only, and W_q on the targets
        qk_outputs = (2 if in_dst is None else 1) * heads * qk_channels
        self.lin_qk = None if share_qk else glorot_linear(in_src, qk_outputs)
        self.lin_dst = None if in_dst is None else glorot_linear(in_dst, heads * qk_channels)
        bias_size = heads * out_channels if concat else out_channels
        self.bias = Parameter(torch.empty(bias_size)) if bias else None
        self.log_gamma = Parameter(torch.empty(heads)) if learn_gamma else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for lin in (self.lin, self.lin_qk, self.lin_dst):
            if lin is not None:
                lin.reset_parameters()
        zeros(self.bias)
        if self.log_gamma is not None:
            self.log_gamma.data.fill_(math.log(self.gamma))

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Adj,
        return_attention_weights: Literal[False] | None = None,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Tensor,
        return_attention_weights: Literal[True],
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]: ...

    @overload
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: SparseTensor,
        return_attention_weights: Literal[True],
    ) -> tuple[Tensor, SparseTensor]: ...

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Adj,
        return_attention_weights: bool | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]] | tuple[Tensor, SparseTensor]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features
                ``[N, in_channels]``, or a pair ``(x_src, x_dst)``.
            edge_index (torch.Tensor or SparseTensor): ``[2, E]`` edge indices, or a
                sparse adjacency ``adj_t`` (``torch.sparse`` or ``SparseTensor``,
                row = target).
            return_attention_weights (bool, optional): if :obj:`True`, also return
                ``(edge_index, alpha)``, ``alpha [E', heads]`` (see the class
                docstring for adjacency inputs); :obj:`None` or :obj:`False` return
                the output only (unlike PyG's ``GATConv``, where :obj:`False` also
                returns the weights). (default: :obj:`None`)
        """
        x_src, x_dst = node_pair(x)
        if x_src.dim() != 2 or x_dst.dim() != 2:
            raise ValueError(
                f"x must be a [num_nodes, in_channels] tensor or a pair of them, got "
                f"{tuple(x_src.shape)} and {tuple(x_dst.shape)}"
            )
        self._check_features(x_src, x_dst)
        size = (x_src.size(0), x_dst.size(0))
        # adj_t[target, source]: its edges, in its stored order (a SparseTensor as it is)
        edge_index, adj, _, structures = self._edges(
            edge_index, *size, validate=self.validate, device=x_dst.device
        )
        H, C = self.heads, self.out_channels
        drop = partial(F.dropout, p=self.feature_dropout, training=self.training)
        value = drop(self.lin(x_src).view(-1, H, C))
        query, key = self._queries_and_keys(x_src, x_dst, value, drop)

        if self.add_self_loops:  # once per graph: O(E), and a host sync on an accelerator
            edge_index = structures.get(
                "self_loops", partial(_with_self_loops, edge_index, min(size))
            )

        # scores in float32 (or wider) even under autocast
        with torch.autocast(device_type=x_dst.device.type, enabled=False):
            query_points = self._points(query)
            key_points = query_points if key is query else self._points(key)
            alpha = self.edge_updater(edge_index, query=query_points, key=key_points)
        out = self.propagate(edge_index, x=value, alpha=alpha, size=size).to(value.dtype)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias

        if not return_attention_weights:
            return out
        if isinstance(edge_index, SparseTensor):
            return out, edge_index.set_value(alpha, layout="coo")
        if adj is not None and self.add_self_loops:  # a new pattern, in the input's layout
            return out, edge_index_to_adjacency(edge_index, alpha, *size, adj.layout)
        if adj is not None:
            return out, (edge_values_to_adjacency(adj, alpha), alpha)
        return out, (edge_index, alpha)

    def _check_features(self, x_src: Tensor, x_dst: Tensor) -> None:
        """Feature sizes against the projections (skipped while a lazy size is unset)."""
        size, weight = self.lin.in_channels, self.lin.weight
        if x_src is x_dst and self.lin_dst is None:
            check_features(x_src, size, "x", f"[num_nodes, in_channels={size}]", weight)
            return
        check_features(x_src, size, "x_src", f"[num_src, {size}]", weight)
        lin = self.lin if self.lin_dst is None else self.lin_dst  # (the queries')
        check_features(x_dst, lin.in_channels, "x_dst", f"[num_dst, {lin.in_channels}]", lin.weight)

    def _queries_and_keys(self, x_src: Tensor, x_dst: Tensor, value: Tensor, drop):
        """Per-head queries ``[N_dst, H, d]`` (targets) and keys ``[N_src, H, d]`` (sources)."""
        H, D = self.heads, self.qk_channels
        if self.share_qk:
            if x_dst is x_src and self.lin_dst is None:
                return value, value
            lin = self.lin if self.lin_dst is None else self.lin_dst
            return drop(lin(x_dst).view(-1, H, D)), value
        if self.lin_dst is not None:  # two input sizes: W_q on the targets, W_k on the sources
            return drop(self.lin_dst(x_dst).view(-1, H, D)), drop(self.lin_qk(x_src).view(-1, H, D))
        qk_dst = drop(self.lin_qk(x_dst)).view(-1, 2, H, D)  # one fused W_q, W_k projection
        qk_src = qk_dst if x_src is x_dst else drop(self.lin_qk(x_src)).view(-1, 2, H, D)
        return qk_dst[:, 0], qk_src[:, 1]

    def _points(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Per-node scoring inputs in float32 or wider, from ``x [N, H, d]``.

        Cone variants: the half-space point ``(horizontal [N, H, d-1], height [N, H])``,
        mapped once per node rather than once per edge. ``"dot"``: ``x`` itself.
        """
        x = x.to(accumulation_dtype(x.dtype))
        return x if self.variant == "dot" else self._to_halfspace(x)

    def edge_update(
        self,
        query: Tensor | tuple[Tensor, Tensor],
        key: Tensor | tuple[Tensor, Tensor],
        edge_index_i: Tensor,
        edge_index_j: Tensor,
        index: Tensor,
        ptr: Tensor | None,
    ) -> Tensor:
        if self.variant == "dot":
            query_i, key_j = query.index_select(0, edge_index_i), key.index_select(0, edge_index_j)
            score = (query_i * key_j).sum(dim=-1) / math.sqrt(query_i.size(-1))
            num_targets = query.size(0)
        else:
            pairs = edge_pairs(query, key, torch.stack([edge_index_j, edge_index_i]))
            if self.log_gamma is None:
                score = self._lca_height(*pairs, scale=-self.gamma)
            else:  # per-head temperatures [H], broadcast over the edges
                score = self._lca_height(*pairs) * -self.log_gamma.exp()
            num_targets = query[1].size(0)
        # the number of targets from a shape, never from index values (no host sync)
        alpha = softmax(score, index, ptr, num_targets)
        return F.dropout(alpha, p=self.dropout, training=self.training)

    def message(self, x_j: Tensor, alpha: Tensor) -> Tensor:
        # in alpha's dtype (float32 or wider): half-precision messages would be summed in half
        # precision (on GPUs by atomic additions, each rounded); the output is rounded once
        return alpha.unsqueeze(-1) * x_j.to(alpha.dtype)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"heads={self.heads}, variant={self.variant!r})"
        )


def _with_self_loops(edge_index: Tensor | SparseTensor, num_nodes: int) -> Tensor | SparseTensor:
    """``edge_index`` with one self loop per node ``0 .. num_nodes - 1``, existing ones
    replaced (PyG's ``remove_self_loops`` + ``add_self_loops``, ``set_diag`` for a
    ``SparseTensor``)."""
    if isinstance(edge_index, SparseTensor):
        return torch_sparse.set_diag(edge_index)
    edge_index, _ = remove_self_loops(edge_index)
    return add_self_loops(edge_index, num_nodes=num_nodes)[0]
