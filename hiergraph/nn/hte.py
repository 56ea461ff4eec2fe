"""Hierarchical Transformer Encoder (HTE): HSA layers with MLPs and residuals."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from hiergraph.data.domain import Domain
from hiergraph.data.restructure import flatten_hierarchy
from hiergraph.data.signal_hierarchy import as_hierarchy
from hiergraph.nn._checks import check_bool, check_features, check_int, check_probability
from hiergraph.nn._reset import reset
from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.position import FamilyPositionEncoder
from hiergraph.nn.typed_linear import TypedLinear
from hiergraph.ops.hsa.inputs import check_structure_device
from hiergraph.plan.tree_index import TreeIndex

ATTENTION_MODES = ("hsa", "flat", "none")


class HTELayer(nn.Module):
    r"""One HTE layer: attention and a two-layer MLP, each with a residual.

    Pre-norm (``norm_first=True``):
    :math:`x \leftarrow x + \mathrm{HSA}(\mathrm{LN}(x))`,
    :math:`x \leftarrow x + \mathrm{MLP}(\mathrm{LN}(x))`;
    post-norm: :math:`x \leftarrow \mathrm{LN}(x + \mathrm{HSA}(x))`,
    :math:`x \leftarrow \mathrm{LN}(x + \mathrm{MLP}(x))`.
    With ``attention=False`` the attention block is skipped (the DeepSet
    baseline of the paper: per-leaf transforms only).

    Args:
        channels: feature size.
        heads: attention heads, each of ``channels // heads`` query/key/value channels
            (``head_channels`` in ``attn_kwargs`` sets another size).
        mlp_channels: hidden size of the MLP (default ``2 * channels``).
        dropout: dropout on both residual branches.
        norm_first: pre-norm (default) or post-norm.
        attention: use the attention block.
        **attn_kwargs: passed to :class:`HierarchicalSelfAttention`
            (``num_node_types``, ``pos_channels``, ``qk_norm``,
            ``include_self``, ``causal``, ``kernel``).
    """

    def __init__(
        self,
        channels: int,
        heads: int = 4,
        mlp_channels: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = True,
        attention: bool = True,
        **attn_kwargs,
    ):
        super().__init__()
        check_int(channels, "channels")
        check_int(heads, "heads")
        check_int(mlp_channels, "mlp_channels", optional=True)
        check_probability(dropout, "dropout")
        check_bool(norm_first, "norm_first")  # ("no" was pre-norm)
        check_bool(attention, "attention")  # ("none", the encoder's mode, kept attention)
        self.channels = channels
        self.norm_first = norm_first
        self.attn = (
            HierarchicalSelfAttention(channels, channels, heads, **attn_kwargs)
            if attention
            else None
        )
        self.norm1 = nn.LayerNorm(channels) if attention else None
        self.norm2 = nn.LayerNorm(channels)
        hidden = mlp_channels or 2 * channels
        self.mlp = nn.Sequential(
            nn.Linear(channels, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, channels)
        )
        self.dropout = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        for module in (self.attn, self.norm1, self.norm2, self.mlp):
            reset(module)

    def forward(self, x: Tensor, hierarchy, pos_emb=None, leaf_mask=None) -> Tensor:
        """``x: [L, channels]`` → ``[L, channels]``."""
        _check_leaf_features(x, self.channels, "channels", self.norm2.weight)
        hierarchy = as_hierarchy(hierarchy)
        if self.attn is not None:
            if self.norm_first:
                x = x + self.dropout(self.attn(self.norm1(x), hierarchy, pos_emb, leaf_mask))
            else:
                x = self.norm1(x + self.dropout(self.attn(x, hierarchy, pos_emb, leaf_mask)))
        if self.norm_first:
            return x + self.dropout(self.mlp(self.norm2(x)))
        return self.norm2(x + self.dropout(self.mlp(x)))


class HierarchicalTransformerEncoder(nn.Module):
    r"""A stack of :class:`HTELayer` s over a signal hierarchy.

    Leaves are first mapped to ``hidden_channels`` by a per-node-type
    linear map (modalities get their own input projections); position
    embeddings of all nodes are computed once by a
    :class:`~hiergraph.nn.FamilyPositionEncoder` and projected per layer
    and per domain type inside each attention block.

    ``attention`` selects the model family compared in the HSA paper with
    everything else equal: ``'hsa'`` (hierarchical), ``'flat'`` (the same
    layers on the one-level view of each tree: softmax attention among all
    its leaves, "FSA"), or ``'none'`` (attention off: "DeepSet").

    Args:
        in_channels: leaf feature size.
        hidden_channels: model width.
        num_layers: number of HTE layers.
        heads: attention heads, each of ``hidden_channels // heads`` query/key/value
            channels (``head_channels`` in ``attn_kwargs`` sets another size).
        num_node_types: number of leaf types (modalities).
        pos_channels: position embedding size (0: no position bias).
        num_keys: key vocabulary of key–value families.
        graph_pe_dim: size of ``hierarchy.graph_pe`` for graph families; with the default 0
            and ``pos_channels > 0``, a hierarchy that carries ``graph_pe`` (as
            :class:`~hiergraph.transforms.GraphHierarchy` adds by default) is refused: pass
            its size (``pe_dim``).
        mlp_channels, dropout, norm_first: as in :class:`HTELayer`.
        attention: ``'hsa'``, ``'flat'`` or ``'none'``.
        domains: the domain types that the position encoder embeds (``domains`` of
            :class:`~hiergraph.nn.FamilyPositionEncoder`; default: all). Naming only those
            that every batch has leaves no parameter without a gradient, as
            :class:`~torch.nn.parallel.DistributedDataParallel` needs by default, e.g.
            ``("grid1d",)`` for text.
        **attn_kwargs: further options of :class:`HierarchicalSelfAttention`.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        num_layers: int = 2,
        heads: int = 4,
        num_node_types: int = 1,
        pos_channels: int = 32,
        num_keys: int = 64,
        graph_pe_dim: int = 0,
        mlp_channels: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = True,
        attention: str = "hsa",
        domains: Iterable[Domain | str | int] | None = None,
        **attn_kwargs,
    ):
        super().__init__()
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        check_int(in_channels, "in_channels")
        check_int(hidden_channels, "hidden_channels")
        check_int(num_layers, "num_layers", minimum=0)
        check_int(heads, "heads")
        check_int(num_node_types, "num_node_types")
        check_int(pos_channels, "pos_channels", minimum=0)
        check_int(num_keys, "num_keys")
        check_int(graph_pe_dim, "graph_pe_dim", minimum=0)
        check_int(mlp_channels, "mlp_channels", optional=True)
        check_probability(dropout, "dropout")
        check_bool(norm_first, "norm_first")
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.attention = attention
        self.input = TypedLinear(in_channels, hidden_channels, num_node_types)
        use_attn = attention != "none"
        self.pos = (
            FamilyPositionEncoder(pos_channels, num_keys, graph_pe_dim, domains)
            if pos_channels and use_attn
            else None
        )
        self.layers = nn.ModuleList(
            HTELayer(
                hidden_channels,
                heads,
                mlp_channels,
                dropout,
                norm_first,
                attention=use_attn,
                num_node_types=num_node_types,
                pos_channels=pos_channels if self.pos is not None else 0,
                **attn_kwargs,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden_channels) if norm_first else nn.Identity()

    def reset_parameters(self) -> None:
        for module in (self.input, self.pos, *self.layers, self.norm):
            reset(module)

    def forward(self, x: Tensor, hierarchy, leaf_mask: Tensor | None = None) -> Tensor:
        """``x: [L, in_channels]`` leaf features → ``[L, hidden_channels]``."""
        _check_leaf_features(x, self.in_channels, "in_channels", self.input.lin.weight)
        hierarchy = as_hierarchy(hierarchy)
        index = TreeIndex.of(hierarchy)
        check_structure_device(index.device, x, "x")  # (else an error of indexing, later)
        if x.size(0) != index.num_leaves:
            raise ValueError(
                f"x must be [num_leaves={index.num_leaves}, in_channels={self.in_channels}], "
                f"got {tuple(x.shape)}"
            )
        types = hierarchy.node_type.index_select(0, index.leaf_node)
        if self.attention == "flat":
            hierarchy = flatten_hierarchy(hierarchy)
        pos = self.pos(hierarchy) if self.pos is not None else None
        h = self.input(x, types)
        for layer in self.layers:
            h = layer(h, hierarchy, pos, leaf_mask)
        return self.norm(h)


def _check_leaf_features(x: Tensor, channels: int, name: str, weight: Tensor) -> None:
    """``x`` must be ``[num_leaves, channels]`` features of ``weight``'s dtype."""
    check_features(x, channels, "x", f"[num_leaves, {name}={channels}]", weight)
    if x.dim() != 2:
        raise ValueError(f"x must be [num_leaves, {name}={channels}], got {tuple(x.shape)}")
