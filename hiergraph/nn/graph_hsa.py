"""GPS-style hybrid layer: local message passing + HSA over a community tree."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver

from hiergraph.data.signal_hierarchy import as_hierarchy
from hiergraph.nn._checks import check_bool, check_features, check_int, check_probability
from hiergraph.nn._reset import reset
from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.pool import _leaf_batch, _num_trees
from hiergraph.nn.position import FamilyPositionEncoder

if TYPE_CHECKING:
    from torch_geometric.data import Batch

    from hiergraph.data.signal_hierarchy import SignalHierarchy


def input_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout of a dense or sparse CSR ``x``: on CSR, the stored entries are dropped.

    Zeros stay zero under dropout, so dropping the stored entries only has the
    same distribution as dense dropout, at a cost proportional to the nonzeros
    (Cora's features are 98.7% zeros).
    """
    if x.layout != torch.sparse_csr:
        return F.dropout(x, p, training)
    if not training or p == 0:
        return x
    values = F.dropout(x.values(), p, training)
    return torch.sparse_csr_tensor(  # on x's device, not the default device
        x.crow_indices(), x.col_indices(), values, x.shape, device=x.device,
        check_invariants=False,
    )  # fmt: skip


class GraphHSAConv(nn.Module):
    r"""A graph-transformer layer in the style of PyG's ``GPSConv`` (Rampášek et
    al., 2022) whose global attention is Hierarchical Self-Attention over a
    community tree of the graph (Amizadeh et al., Sec. 2: a graph domain in a
    signal hierarchy, as the link structure of Fig. 1):

    .. math::
        h_\ell &= \mathrm{Norm}_1\big(x + \mathrm{Drop}(\mathrm{Conv}(x, E))\big) \\
        h_g &= \mathrm{Norm}_2\big(x + \mathrm{Drop}(\mathrm{HSA}(x, \mathcal{T}, \varepsilon))\big)
            \\
        \mathrm{out} &= \mathrm{Norm}_3\big(h + \mathrm{MLP}(h)\big), \qquad h = h_\ell + h_g

    With ``gate=True`` the global branch is scaled by a learned
    :math:`\tanh(\alpha)`, :math:`\alpha = 0` at the start (inside
    :math:`\mathrm{Norm}_2`, so the layer starts as its local branch plus
    :math:`\mathrm{Norm}_2(x)`, with no attention, and lets the data decide how
    much global attention to add); with ``mlp=False`` the MLP block is left out
    (:math:`\mathrm{out} = h`).

    :math:`\mathcal{T}` is a tree whose leaves are the graph nodes (e.g. from
    :class:`~hiergraph.transforms.GraphHierarchy`) and :math:`\varepsilon` the
    family position embeddings. HSA costs :math:`O(M b^2)` for :math:`M` tree
    nodes and families of at most :math:`b` members, instead of the
    :math:`O(N^2)` of full attention.

    As PyG's ``GPSConv``, the constructor leaves :obj:`conv` as it is given (a trained
    conv keeps its weights); :meth:`reset_parameters` re-initialises everything,
    :obj:`conv` included (one without ``reset_parameters`` through its submodules').
    Without :obj:`conv` the layer has no normalisation after the local branch.

    Args:
        channels (int): size of the node features (input and output).
        conv (torch.nn.Module or None): the local message-passing layer,
            ``channels → channels`` (e.g. ``GCNConv``, ``GATConv``, ``ConeConv``);
            :obj:`None` for none.
        heads (int, optional): HSA heads, each of ``channels // heads``
            query/key/value channels. (default: :obj:`1`)
        dropout (float, optional): dropout after the local and global branches
            and in the MLP. (default: :obj:`0.`)
        attn_dropout (float, optional): dropout on the HSA output.
            (default: :obj:`0.`)
        pos_channels (int, optional): size of the position embeddings passed to
            :meth:`forward` (0: no position bias). (default: :obj:`0`)
        include_self (bool, optional): leaves attend to themselves in HSA.
            (default: :obj:`True`)
        act (str, optional): MLP activation (a PyG resolver name).
            (default: :obj:`"relu"`)
        norm (str, optional): normalisation (a PyG resolver name, or :obj:`None`).
            (default: :obj:`"batch_norm"`)
        norm_kwargs (Dict[str, Any], optional): arguments passed to the
            normalisation. (default: :obj:`None`)
        gate (bool, optional): scale the global branch by a learned
            :math:`\tanh(\alpha)`. (default: :obj:`False`)
        mlp (bool, optional): add the MLP block. (default: :obj:`True`)
        kernel (str, optional): HSA family kernel, one of
            :data:`~hiergraph.ops.hsa.inputs.KERNELS`: ``'dense'`` (batched matmuls
            over blocks of families), ``'blocks'`` (those blocks only) or ``'edge'``
            (scatters over sibling pairs; faster when most families are small, as in
            Louvain trees); see :func:`~hiergraph.ops.hierarchical_attention`.
            (default: :obj:`"dense"`)
        smooth (bool, optional): HSA as a learned smoothing operator: the values
            are the input features themselves, with no value or output map,
            :math:`\mathrm{HSA}(x)^h = \hat\Theta^h x^h` for the ``h``-th
            slice of ``channels / heads`` features; only the queries, keys
            and position maps are learned (far fewer weights to fit on a
            small training set). (default: :obj:`False`)
        hubs (int, optional): ``g > 0`` lifts the ``g`` nodes of every tree with
            the highest root-level score to the root in every forward pass (see
            :class:`~hiergraph.nn.HierarchicalSelfAttention`): every node
            then weighs them one by one instead of through their
            communities' means. (default: :obj:`0`)
    """

    def __init__(
        self,
        channels: int,
        conv: nn.Module | None,
        heads: int = 1,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        pos_channels: int = 0,
        include_self: bool = True,
        act: str = "relu",
        norm: str | None = "batch_norm",
        norm_kwargs: dict[str, Any] | None = None,
        gate: bool = False,
        mlp: bool = True,
        kernel: str = "dense",
        smooth: bool = False,
        hubs: int = 0,
    ):
        super().__init__()
        check_int(channels, "channels")
        check_int(heads, "heads")
        check_probability(dropout, "dropout")
        check_probability(attn_dropout, "attn_dropout")
        for flag, name in ((gate, "gate"), (mlp, "mlp"), (smooth, "smooth")):
            check_bool(flag, name)  # (gate="no" added a gate)
        if smooth and channels % heads:
            raise ValueError(
                f"smooth=True splits channels={channels} over heads={heads}: "
                "make channels a multiple of heads"
            )
        self.channels, self.conv, self.dropout = channels, conv, dropout
        self.attn = HierarchicalSelfAttention(
            channels,
            heads=heads,
            pos_channels=pos_channels,
            include_self=include_self,
            dropout=attn_dropout,
            kernel=kernel,
            project_values=not smooth,
            hubs=hubs,
        )
        self.gate = nn.Parameter(torch.zeros(())) if gate else None
        self.mlp = (
            nn.Sequential(
                nn.Linear(channels, 2 * channels),
                activation_resolver(act),
                nn.Dropout(dropout),
                nn.Linear(2 * channels, channels),
                nn.Dropout(dropout),
            )
            if mlp
            else None
        )
        norm_kwargs = norm_kwargs or {}

        def normalization(used: bool) -> nn.Module:
            if norm is None or not used:
                return nn.Identity()
            return normalization_resolver(norm, channels, **norm_kwargs)

        # after the local branch (none without a conv), the global branch and the MLP
        self.norms = nn.ModuleList(
            [normalization(conv is not None), normalization(True), normalization(True)]
        )
        # the norms that take a batch vector (layer, graph, instance norms) normalise every
        # graph of a batch on its own, as PyG's GPSConv does
        taken = inspect.signature(self.norms[1].forward).parameters
        self._norm_takes = {key for key in ("batch", "batch_size") if key in taken}

    def reset_parameters(self) -> None:
        reset(self.conv)
        self.attn.reset_parameters()
        if self.gate is not None:
            nn.init.zeros_(self.gate)
        reset(self.mlp)
        reset(self.norms)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        hierarchy: SignalHierarchy | Batch,
        pos_emb: Tensor | None = None,
        **kwargs,
    ) -> Tensor:
        r"""
        Args:
            x (torch.Tensor): ``[N, channels]`` node features (= leaf features of
                :obj:`hierarchy`).
            edge_index (torch.Tensor): ``[2, E]`` graph edges (for the local conv).
            hierarchy (SignalHierarchy or Batch): a
                :class:`~hiergraph.data.SignalHierarchy` (or a batch) whose leaves
                are the ``N`` nodes in order, or the graph (batch) itself, with its
                community tree (:class:`~hiergraph.transforms.GraphHierarchy`).
            pos_emb (torch.Tensor, optional): ``[T, pos_channels]`` position
                embeddings of all tree nodes. (default: :obj:`None`)
            **kwargs (optional): passed to the local conv (e.g. ``edge_weight``).

        Returns:
            ``[N, channels]``.
        """
        shape = f"[num_nodes, channels={self.channels}]"
        check_features(x, self.channels, "x", shape, self.attn.query.lin.weight)
        hierarchy = as_hierarchy(hierarchy)
        per_graph = {}
        if "batch" in self._norm_takes:
            per_graph["batch"] = _leaf_batch(hierarchy)
        if "batch_size" in self._norm_takes:
            per_graph["batch_size"] = _num_trees(hierarchy)
        out = 0
        if self.conv is not None:
            h = F.dropout(self.conv(x, edge_index, **kwargs), self.dropout, self.training)
            out = self.norms[0](h + x, **per_graph)
        h = F.dropout(self.attn(x, hierarchy, pos_emb), self.dropout, self.training)
        if self.gate is not None:
            h = torch.tanh(self.gate) * h
        out = out + self.norms[1](h + x, **per_graph)
        if self.mlp is not None:
            out = out + self.mlp(out)
        return self.norms[2](out, **per_graph)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
            f"heads={self.attn.heads}, hubs={self.attn.hubs})"
        )


class GraphHSANet(nn.Module):
    r"""Node classifier: an input map, ``num_layers`` :class:`GraphHSAConv`
    layers over a shared community tree and family position embeddings, and
    an output map.

    .. math::
        h_0 = \sigma\big(\mathrm{In}(\mathrm{Drop}(x))\big), \quad
        h_{l} = \mathrm{GraphHSAConv}_l(h_{l-1}), \quad
        \mathrm{logits} = \mathrm{Out}(\mathrm{Drop}(h_L))

    ``In`` / ``Out`` are linear maps or, when given, convs: e.g. the two
    layers of GAT with one gated HSA layer between them
    (``input_conv=GATConv(in, 8, heads=8)``, ``act='elu'``,
    ``output_conv=GATConv(64, classes, concat=False)``, ``conv_factory=None``,
    ``gate=True``, ``mlp=False``): a GAT with a global, hierarchical residual
    branch.

    Its own maps are initialised when built; like PyG's ``GPSConv``, the
    constructor does not call :meth:`reset_parameters`, so that the convs passed
    in (:obj:`input_conv`, :obj:`output_conv`) keep their weights (e.g. the same
    initial weights as a plain GAT built from the same seed).
    :meth:`reset_parameters` re-initialises everything, those convs included.

    Args:
        in_channels (int): size of the input node features.
        hidden_channels (int): size of the hidden node features.
        out_channels (int): number of output logits.
        conv_factory (Callable[[int], torch.nn.Module], optional): ``hidden →
            hidden`` local conv builder, called once per layer (e.g.
            ``lambda c: GCNConv(c, c)``); :obj:`None` for HSA only.
            (default: :obj:`None`)
        num_layers (int, optional): number of hybrid layers. (default: :obj:`2`)
        heads (int, optional): HSA heads, each of ``hidden_channels // heads``
            query/key/value channels. (default: :obj:`1`)
        graph_pe_dim (int, optional): size of the tree's ``graph_pe`` features
            (0: no position bias). (default: :obj:`0`)
        dropout (float, optional): on the input features and before the output
            map (inside the layers, :obj:`layer_dropout` and :obj:`attn_dropout`
            apply). (default: :obj:`0.5`)
        attn_dropout (float, optional): dropout on the HSA output (inside the
            layers). (default: :obj:`0.`)
        layer_dropout (float, optional): dropout of the branches inside the
            layers. (default: :obj:`None`, i.e. :obj:`dropout`)
        norm (str, optional): normalisation in the layers (a PyG resolver name or
            :obj:`None`). (default: :obj:`None`)
        input_conv (torch.nn.Module, optional): ``in → hidden`` conv used instead
            of the linear input projection (e.g. ``GCNConv(in, hidden)``: on small
            training sets, propagating the raw features first helps).
            (default: :obj:`None`)
        output_conv (torch.nn.Module, optional): ``hidden → out`` conv used
            instead of the linear head. (default: :obj:`None`)
        act (str, optional): activation after the input map (a PyG resolver name
            or :obj:`None`). (default: :obj:`None`)
        gate (bool, optional): see :class:`GraphHSAConv`. (default: :obj:`False`)
        mlp (bool, optional): see :class:`GraphHSAConv`. (default: :obj:`True`)
        kernel (str, optional): see :class:`GraphHSAConv`.
            (default: :obj:`"dense"`)
        smooth (bool, optional): see :class:`GraphHSAConv`.
            (default: :obj:`False`)
        hubs (int, optional): see :class:`GraphHSAConv`. (default: :obj:`0`)
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        conv_factory: Callable[[int], nn.Module] | None = None,
        num_layers: int = 2,
        heads: int = 1,
        graph_pe_dim: int = 0,
        dropout: float = 0.5,
        attn_dropout: float = 0.0,
        layer_dropout: float | None = None,
        norm: str | None = None,
        input_conv: nn.Module | None = None,
        output_conv: nn.Module | None = None,
        act: str | None = None,
        gate: bool = False,
        mlp: bool = True,
        kernel: str = "dense",
        smooth: bool = False,
        hubs: int = 0,
    ):
        super().__init__()
        for value, name in ((in_channels, "in_channels"), (hidden_channels, "hidden_channels"),
                            (out_channels, "out_channels")):  # fmt: skip
            check_int(value, name)
        check_int(num_layers, "num_layers", minimum=0)
        check_int(graph_pe_dim, "graph_pe_dim", minimum=0)
        for value, name in ((dropout, "dropout"), (attn_dropout, "attn_dropout")):
            check_probability(value, name)
        if layer_dropout is not None:
            check_probability(layer_dropout, "layer_dropout")
        for flag, name in ((gate, "gate"), (mlp, "mlp"), (smooth, "smooth")):
            check_bool(flag, name)
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels = out_channels
        self.dropout = dropout
        self.input_conv, self.output_conv = input_conv, output_conv
        self.lin_in = nn.Linear(in_channels, hidden_channels) if input_conv is None else None
        self.lin_out = nn.Linear(hidden_channels, out_channels) if output_conv is None else None
        self.act = activation_resolver(act) if act is not None else None
        self.pos = (
            FamilyPositionEncoder(hidden_channels, graph_pe_dim=graph_pe_dim, domains=("graph",))
            if graph_pe_dim
            else None
        )
        self.layers = nn.ModuleList(
            GraphHSAConv(
                hidden_channels,
                conv_factory(hidden_channels) if conv_factory is not None else None,
                heads=heads,
                dropout=dropout if layer_dropout is None else layer_dropout,
                attn_dropout=attn_dropout,
                pos_channels=hidden_channels if graph_pe_dim else 0,
                norm=norm,
                gate=gate,
                mlp=mlp,
                kernel=kernel,
                smooth=smooth,
                hubs=hubs,
            )
            for _ in range(num_layers)
        )

    def reset_parameters(self) -> None:
        for module in (self.lin_in, self.input_conv, self.lin_out, self.output_conv, self.pos,
                       self.act):  # fmt: skip
            reset(module)
        for layer in self.layers:
            layer.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, hierarchy: SignalHierarchy | Batch) -> Tensor:
        r"""
        Args:
            x (torch.Tensor): ``[N, in_channels]`` node features (dense, or sparse
                CSR for bag-of-words inputs: the input map must then accept CSR, as
                PyG's ``Linear``-based convs do).
            edge_index (torch.Tensor): ``[2, E]`` graph edges.
            hierarchy (SignalHierarchy or Batch): the community tree whose leaves
                are the ``N`` nodes in order, or the graph (batch) that holds it.

        Returns:
            ``[N, out_channels]`` logits.
        """
        hierarchy = as_hierarchy(hierarchy)
        x = input_dropout(x, self.dropout, self.training)
        x = self.lin_in(x) if self.input_conv is None else self.input_conv(x, edge_index)
        if self.act is not None:
            x = self.act(x)
        pos_emb = self.pos(hierarchy) if self.pos is not None else None
        for layer in self.layers:
            x = layer(x, edge_index, hierarchy, pos_emb)
        x = F.dropout(x, self.dropout, self.training)
        return self.lin_out(x) if self.output_conv is None else self.output_conv(x, edge_index)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.hidden_channels}, "
            f"{self.out_channels}, num_layers={len(self.layers)})"
        )
