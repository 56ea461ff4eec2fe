"""Multi-head Hierarchical Self-Attention as a module."""

from __future__ import annotations

from typing import Literal, overload

import torch
from torch import Tensor, nn

from hiergraph.data.domain import Domain
from hiergraph.data.restructure import lift_leaves
from hiergraph.data.signal_hierarchy import as_hierarchy
from hiergraph.nn._checks import check_bool, check_dtype, check_int, check_probability
from hiergraph.nn.pool import leaf_batch
from hiergraph.nn.typed_linear import TypedLinear
from hiergraph.ops.hsa.attention import check_flags, hierarchical_attention
from hiergraph.ops.hsa.hubs import root_scores, top_per_tree
from hiergraph.ops.hsa.lifted import lifted_attention, runs_lifted
from hiergraph.plan.tree_index import TreeIndex

MAX_DENSE_LEAVES = 4096


class HierarchicalSelfAttention(nn.Module):
    r"""Multi-head Hierarchical Self-Attention (Amizadeh et al., App. D–F).

    For leaf features :math:`x_i` of node type :math:`t_i` and family
    position embeddings :math:`\varepsilon` (domain type :math:`\omega`):

    .. math::
        q_i^h = \mathrm{LN}(W^{Q,h}_{t_i} x_i),\quad
        k_i^h = \mathrm{LN}(W^{K,h}_{t_i} x_i),\quad
        v_i^h = W^{V,h}_{t_i} x_i,\quad
        \varepsilon^h(A) = P^h_{\omega(A)}\,\varepsilon(A)

    .. math::
        \mathrm{out}_i = W^O \big\|_{h} \big(\hat\Theta^h V^h\big)_i

    where :math:`\hat\Theta^h` is the HSA matrix of head :math:`h`
    (:func:`~hiergraph.ops.hierarchical_attention`) with logits
    :math:`\rho_q(A)^\top\rho_k(B)/\sqrt{d} + \varepsilon^h(A)^\top
    \varepsilon^h(B) + \log n(B)` among siblings. The tree is shared by the
    heads; heads are one tensor dimension.

    Args:
        in_channels: size of the leaf features.
        out_channels: output size (default ``in_channels``).
        heads: number of heads.
        head_channels: size of each head's query/key/value (default
            ``in_channels // heads``).
        num_node_types: leaves of different types get their own Q/K/V maps.
        qk_norm: LayerNorm (no affine) on each head's queries and keys, the
            paper's choice (Prop. 3.1); switch off for raw dot products.
        pos_channels: size of the incoming position embeddings (0: no
            position bias).
        pos_head_channels: per-head size of the projected embeddings
            (default ``head_channels``).
        include_self: leaves attend to themselves (the self energy of App. G.1).
        causal: strictly causal: a leaf's output depends on the leaves up to it (in
            leaf order, a depth-first order of every tree) only
            (:func:`~hiergraph.ops.causal_hierarchical_attention`; needs
            ``include_self``, no ``leaf_mask``).
        leaky_causal: the paper's sibling masking (App. G.1): left siblings only. It
            is not causal: later tokens still change earlier rows through their
            ancestors' statistics (needs ``include_self``).
        dropout: dropout on the output.
        kernel: family kernel, one of :data:`~hiergraph.ops.hsa.inputs.KERNELS`
            (see :func:`~hiergraph.ops.hierarchical_attention`).
        project_values: ``False`` uses the input features themselves as values, split
            over the heads, and returns the heads concatenated with no output map: HSA
            as a learned smoothing of ``x`` (needs ``in_channels == out_channels ==
            heads * head_channels``).
        hubs: ``g > 0`` lifts the ``g`` leaves of every tree with the highest
            root-level score (:mod:`hiergraph.ops.hsa.hubs`, from this layer's own
            queries and keys, heads pooled) to the root, in a position-free
            slot, before attending (:func:`~hiergraph.data.restructure.lift_leaves`):
            every query then sees those keys one by one. Trees of at most ``g``
            leaves get flat softmax attention. The choice is per forward pass
            and not differentiable; the attention over the chosen tree is. No lifted tree
            is built (the same result, on the batch's own plan:
            :mod:`~hiergraph.ops.hsa.lifted`), except for ``return_attention_weights``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        heads: int = 4,
        head_channels: int | None = None,
        num_node_types: int = 1,
        qk_norm: bool = True,
        pos_channels: int = 0,
        pos_head_channels: int | None = None,
        include_self: bool = False,
        causal: bool = False,
        leaky_causal: bool = False,
        dropout: float = 0.0,
        kernel: str = "dense",
        project_values: bool = True,
        hubs: int = 0,
    ):
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels", optional=True)
        check_int(heads, "heads")
        check_int(head_channels, "head_channels", optional=True)
        check_int(num_node_types, "num_node_types")
        check_int(pos_channels, "pos_channels", minimum=0)
        check_int(pos_head_channels, "pos_head_channels", optional=True)
        check_probability(dropout, "dropout")
        check_int(hubs, "hubs", minimum=0)
        check_flags(causal, leaky_causal, include_self, kernel)
        check_bool(qk_norm, "qk_norm")  # ("no" normalised)
        check_bool(project_values, "project_values")
        self.pos_channels = pos_channels
        out_channels = in_channels if out_channels is None else out_channels
        head_channels = head_channels or max(in_channels // heads, 1)
        flag = "causal" if causal else "leaky_causal" if leaky_causal else None
        if flag and hubs:
            raise ValueError(f"hubs are chosen among all leaves, later ones too: not with {flag}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.heads, self.head_channels = heads, head_channels
        self.include_self, self.kernel = include_self, kernel
        self.causal, self.leaky_causal = causal, leaky_causal
        self.hubs = hubs
        inner = heads * head_channels
        if not project_values and not in_channels == out_channels == inner:
            raise ValueError(
                "project_values=False needs in_channels == out_channels == heads * "
                f"head_channels, got {in_channels}, {out_channels} and {heads} * {head_channels}"
            )
        self.query = TypedLinear(in_channels, inner, num_node_types)
        self.key = TypedLinear(in_channels, inner, num_node_types)
        self.value = TypedLinear(in_channels, inner, num_node_types) if project_values else None
        self.q_norm = nn.LayerNorm(head_channels, elementwise_affine=False) if qk_norm else None
        self.k_norm = nn.LayerNorm(head_channels, elementwise_affine=False) if qk_norm else None
        self.pos_head_channels = pos_head_channels or head_channels
        self.pos = (
            TypedLinear(pos_channels, heads * self.pos_head_channels, len(Domain), bias=False)
            if pos_channels
            else None
        )
        self.out = nn.Linear(inner, out_channels) if project_values else None
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.query, self.key, self.value, self.out):
            if lin is not None:
                lin.reset_parameters()
        if self.pos is not None:
            self.pos.reset_parameters()

    @overload
    def forward(
        self,
        x: Tensor,
        hierarchy,
        pos_emb: Tensor | None = None,
        leaf_mask: Tensor | None = None,
        return_attention_weights: Literal[False] | None = None,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        hierarchy,
        pos_emb: Tensor | None = None,
        leaf_mask: Tensor | None = None,
        *,
        return_attention_weights: Literal[True],
    ) -> tuple[Tensor, Tensor]: ...

    def forward(
        self,
        x: Tensor,
        hierarchy,
        pos_emb: Tensor | None = None,
        leaf_mask: Tensor | None = None,
        return_attention_weights: bool | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        r"""
        Args:
            x: ``[L, in_channels]`` leaf features in leaf order.
            hierarchy: a :class:`~hiergraph.data.SignalHierarchy` or a batch, or a graph
                with its community tree (:func:`~hiergraph.data.signal_hierarchy.as_hierarchy`).
            pos_emb: ``[N, pos_channels]`` position embeddings of all nodes,
                e.g. from :class:`~hiergraph.nn.FamilyPositionEncoder`.
            leaf_mask: ``[L]`` bool, ``False`` for padding leaves (their features may
                hold any finite values: they are removed from every statistic).
            return_attention_weights: also return :math:`\hat\Theta` ``[H, L, L]``
                (dense; only for ``L <= 4096``): the op's output for one-hot values,
                :math:`\hat\Theta^h_{ij} = \mathrm{HSA}(Q, K, I)^h_{ij}`, exact and
                differentiable (a pass with ``L`` value channels: its node statistics
                hold about ``H * N * L`` numbers).

        Returns:
            ``[L, out_channels]`` (and the attention matrix if asked).
        """
        hierarchy = as_hierarchy(hierarchy)
        index = TreeIndex.of(hierarchy)
        if x.dim() != 2 or x.size(0) != index.num_leaves or x.size(1) != self.in_channels:
            raise ValueError(
                f"x must be [num_leaves={index.num_leaves}, in_channels={self.in_channels}], "
                f"got {tuple(x.shape)}"
            )
        check_dtype(x, self.query.lin.weight, "x")
        if self.pos is not None and pos_emb is not None:
            num_nodes = hierarchy.parent.numel()
            if pos_emb.shape != (num_nodes, self.pos_channels):
                raise ValueError(
                    f"pos_emb must be [num_nodes={num_nodes}, pos_channels={self.pos_channels}] "
                    f"(one row per tree node), got {tuple(pos_emb.shape)}"
                )
        types = hierarchy.node_type.index_select(0, index.leaf_node)
        shape = (x.size(0), self.heads, self.head_channels)
        q = self.query(x, types).view(shape)
        k = self.key(x, types).view(shape)
        v = (x if self.value is None else self.value(x, types)).view(shape)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.pos is not None and pos_emb is None:
            raise ValueError("this layer was built with pos_channels > 0: pass pos_emb")
        if self.pos is None and pos_emb is not None:  # (it was ignored)
            raise ValueError(
                "pos_emb was given, but this layer was built with pos_channels=0 and has no "
                "position bias: build it with pos_channels=pos_emb.size(-1)"
            )
        lifted = self._choose_hubs(q, k, hierarchy, index, leaf_mask) if self.hubs else None
        # hubs run on the forest's own plan (the dense weights: on the rebuilt tree)
        in_place = lifted is not None and not return_attention_weights and runs_lifted(index)
        if lifted is not None and not in_place:
            hierarchy, index, pos_emb = self._lift_hubs(lifted, hierarchy, pos_emb)
        eps = None
        if self.pos is not None:
            eps = self.pos(pos_emb, hierarchy.domain).view(-1, self.heads, self.pos_head_channels)
        options = dict(pos_emb=eps, include_self=self.include_self, leaf_mask=leaf_mask)
        if in_place:
            out = lifted_attention(q, k, v, index, lifted, self.hubs, kernel=self.kernel, **options)
        else:
            out = self._attend(q, k, v, hierarchy, index, options)
        out = out.reshape(x.size(0), -1)
        out = self.dropout(out if self.out is None else self.out(out))
        if not return_attention_weights:
            return out
        if x.size(0) > MAX_DENSE_LEAVES:
            raise ValueError(
                f"return_attention_weights builds a dense [H, L, L] matrix; L={x.size(0)} is above "
                f"{MAX_DENSE_LEAVES}"
            )
        # the op's output for one-hot values is its matrix: row i of head h is out[i, h]
        one_hot = torch.eye(x.size(0), dtype=q.dtype, device=q.device)[:, None]
        theta = self._attend(q, k, one_hot.expand(-1, self.heads, -1), hierarchy, index, options)
        return out, theta.transpose(0, 1).contiguous()

    def _attend(self, q, k, v, hierarchy, index, options) -> Tensor:
        """The HSA op of this layer (strictly causal, leaky causal or not) on ``[L, H, ·]``
        rows; ``options``: the position embeddings, ``include_self`` and ``leaf_mask``."""
        if self.causal:  # the strictly causal op reads the hierarchy, not the tree plan
            return hierarchical_attention(
                q, k, v, hierarchy, causal=True, kernel=self.kernel, **options
            )
        return hierarchical_attention(
            q, k, v, index, kernel=self.kernel, leaky_causal=self.leaky_causal, **options
        )

    def _choose_hubs(self, q, k, hierarchy, index, leaf_mask) -> Tensor:
        """``[L]`` bool: the ``hubs`` leaves of every tree with the highest root-level
        score (no gradient: a discrete choice)."""
        if index.uniform is not None:  # equal trees, one after another
            tree = index.uniform[0]
        else:
            tree = leaf_batch(hierarchy)
        with torch.no_grad():
            return top_per_tree(root_scores(q, k, tree, leaf_mask), tree, self.hubs)

    @staticmethod
    def _lift_hubs(hubs, hierarchy, pos_emb):
        """The tree with the hub leaves under the root, its index, and ``pos_emb``
        carried over (zero for the hubs, whose slot has no position)."""
        hierarchy, node = lift_leaves(hierarchy, hubs)
        index = TreeIndex.of(hierarchy)
        if pos_emb is not None:
            lifted = torch.zeros(node.numel(), dtype=torch.bool, device=node.device)
            lifted[index.leaf_node[hubs]] = True
            pos_emb = pos_emb.index_select(0, node).masked_fill(lifted[:, None], 0.0)
        return hierarchy, index, pos_emb

    def __repr__(self) -> str:
        hubs = f", hubs={self.hubs}" if self.hubs else ""
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"heads={self.heads}, "
            f"include_self={self.include_self}, causal={self.causal}, "
            f"leaky_causal={self.leaky_causal}{hubs})"
        )
