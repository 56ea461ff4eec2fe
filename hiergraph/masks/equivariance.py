r"""Which permutations a masked attention layer is equivariant to.

Conventions: a permutation is an index tensor ``perm`` acting by
``x_new = x[perm]``. A mask :math:`M` (``M[query, key]``) is relabelled as
``M[perm][:, perm]``, an ``edge_index`` as ``argsort(perm)[edge_index]``. A
layer :math:`f` is equivariant to ``perm`` when :math:`f(x[\pi]) = f(x)[\pi]`.

For a fixed mask and generic weights, dot-product attention without positional
encodings is equivariant exactly to :math:`\operatorname{Aut}(M) = \{\pi :
M[\pi][:, \pi] = M\}` (the general form of the symmetry groups of Mijangos et
al., Sec. 3.1, Thms. 5–8 and Table 1); relabelling the graph together with the
features (graph attention) makes every :math:`\pi \in S_n` work.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import networkx as nx
import torch
from torch import Tensor

from hiergraph._checks import check_bool
from hiergraph.masks.dense import edge_index_to_mask
from hiergraph.ops.edge_index import check_edge_index

Perm = Tensor | tuple[Tensor, Tensor]


def _check_eval(layer: Callable) -> None:
    """Raise unless ``layer`` is deterministic: a module in training mode is not."""
    if isinstance(layer, torch.nn.Module) and layer.training:
        raise ValueError("layer is in training mode (dropout makes it random); call layer.eval()")


def relabel(edge_index: Tensor, perm: Perm) -> Tensor:
    """``edge_index`` of the graph whose node ``a`` is the old node ``perm[a]``.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` (row 0 = source/key, row 1 =
            target/query) over the nodes that ``perm`` permutes.
        perm (torch.Tensor or (torch.Tensor, torch.Tensor)): a permutation
            ``[n]`` of ``0 .. n - 1`` (int32 or int64), or a pair
            ``(perm_src, perm_dst)`` for a bipartite graph (sources and targets
            permuted separately).

    Returns:
        ``argsort(perm)[edge_index]``, ``[2, E]`` (row by row for a pair).
    """
    perm_src, perm_dst = perm if isinstance(perm, tuple) else (perm, perm)
    for p in (perm_src, perm_dst):
        _check_permutation(p, p.numel() if isinstance(p, Tensor) else -1)
    check_edge_index(edge_index, perm_src.numel(), perm_dst.numel())
    return torch.stack(
        [torch.argsort(perm_src)[edge_index[0]], torch.argsort(perm_dst)[edge_index[1]]]
    )


def is_automorphism(edge_index: Tensor, num_nodes: int, perm: Tensor) -> bool:
    """Whether ``M[perm][:, perm] == M`` for the mask of ``edge_index``.

    Args:
        edge_index (torch.Tensor): the mask ``[2, E]`` (row 0 = key, row 1 =
            query).
        num_nodes (int): number of nodes :math:`n`.
        perm (torch.Tensor): a permutation ``[n]`` of ``0 .. n - 1`` (int32 or
            int64).
    """
    _check_permutation(perm, num_nodes)
    mask = edge_index_to_mask(edge_index, num_nodes, rows="query")
    return bool((mask[perm][:, perm] == mask).all())


def _check_permutation(perm: Tensor, n: int, name: str = "perm", rows: bool = False) -> None:
    """Raise unless ``perm`` ``[n]`` is a permutation of ``0 … n - 1`` (read on the host;
    with ``rows``, every row of ``perm`` ``[P, n]`` is one)."""
    if not isinstance(perm, Tensor):
        raise TypeError(
            f"{name} must be an int64 or int32 tensor, e.g. torch.tensor([1, 2, 0]), got "
            f"{type(perm).__name__}"
        )
    # int32/int64 only: a uint8 or bool tensor would index as a mask, not as positions
    ok = perm.dim() == 1 + rows and perm.size(-1) == n
    ok = ok and perm.dtype in (torch.int32, torch.int64)
    if ok:
        ok = bool((perm.sort(-1).values.cpu() == torch.arange(n)).all())
    if not ok:
        got = perm.tolist() if perm.numel() <= 16 else f"shape {tuple(perm.shape)}"
        what = f"[P, n = {n}] rows, each " if rows else ""
        raise ValueError(f"{name} must be {what}a permutation of 0 .. {n - 1}, got {got}")


def automorphisms(edge_index: Tensor, num_nodes: int, brute_force_up_to: int = 7) -> Tensor:
    r"""All permutations ``perm`` with ``M[perm][:, perm] == M``, ``[|Aut|, n]``,
    in lexicographic order.

    :math:`|\operatorname{Aut}|` can be as large as :math:`n!` (the full mask),
    so keep ``n`` small for highly symmetric masks.

    Args:
        edge_index (torch.Tensor): the mask ``[2, E]`` (row 0 = key, row 1 =
            query).
        num_nodes (int): number of nodes :math:`n`.
        brute_force_up_to (int, optional): the largest :math:`n` searched by
            brute force over all :math:`n!` permutations (vectorised); above it,
            networkx's VF2 matcher runs on the directed graph with its
            self-loops. (default: :obj:`7`)

    The result lies on ``edge_index``'s device.
    """
    device = edge_index.device
    mask = edge_index_to_mask(edge_index, num_nodes, rows="query")
    if num_nodes <= brute_force_up_to:
        perms = list(itertools.permutations(range(num_nodes)))
        perms = torch.tensor(perms, dtype=torch.long, device=device).reshape(len(perms), num_nodes)
        same = (mask[perms[:, :, None], perms[:, None, :]] == mask).flatten(1).all(dim=1)
        return perms[same]
    graph = nx.DiGraph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(edge_index.t().tolist())
    matcher = nx.algorithms.isomorphism.DiGraphMatcher(graph, graph)
    found = [[m[a] for a in range(num_nodes)] for m in matcher.isomorphisms_iter()]
    shape = (len(found), num_nodes)  # (one empty permutation of no nodes)
    return torch.tensor(sorted(found), dtype=torch.long, device=device).reshape(shape)


def equivariance_error(
    layer: Callable,
    x: Tensor | tuple[Tensor, Tensor],
    edge_index: Tensor,
    perm: Perm,
    relabel_graph: bool = False,
) -> float:
    r""":math:`\max |f(x[\pi], E') - f(x, E)[\pi]|`, with :math:`E' = E` (a fixed
    mask) or the relabelled graph (``relabel_graph=True``).

    For a bipartite layer pass ``x = (x_src, x_dst)`` and
    ``perm = (perm_src, perm_dst)``; the output is indexed by the targets, so
    it is compared with ``f(x, E)[perm_dst]`` (invariance in the sources).

    Args:
        layer (Callable): the layer :math:`f`, called as ``layer(x, edge_index)``
            and returning one row per target node. It must be deterministic:
            call ``.eval()`` on modules with dropout (a module in training mode
            raises a ``ValueError``).
        x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features ``[n, F]``,
            or ``(x_src, x_dst)`` for a bipartite layer.
        edge_index (torch.Tensor): ``[2, E]`` (row 0 = source/key, row 1 =
            target/query).
        perm (torch.Tensor or (torch.Tensor, torch.Tensor)): a permutation ``[n]``
            of the rows of ``x`` (int32 or int64), or ``(perm_src, perm_dst)``
            exactly when ``x`` is a pair.
        relabel_graph (bool, optional): run the permuted input on
            :func:`relabel` ``(edge_index, perm)`` (graph attention) instead of on
            the fixed mask. (default: :obj:`False`)

    Returns:
        The largest absolute difference, a Python float (``0.0`` for an empty
        output).
    """
    _check_eval(layer)
    check_bool(relabel_graph, "relabel_graph")
    bipartite = isinstance(x, tuple)
    if bipartite != isinstance(perm, tuple):
        raise TypeError("pass a pair of permutations exactly when x is a pair (x_src, x_dst)")
    for p, rows in zip(perm, x, strict=True) if bipartite else ((perm, x),):
        _check_permutation(p, rows.size(0))
    x_perm = (x[0][perm[0]], x[1][perm[1]]) if bipartite else x[perm]
    out_perm = perm[1] if bipartite else perm
    with torch.no_grad():
        reference = layer(x, edge_index)[out_perm]
        permuted = layer(x_perm, relabel(edge_index, perm) if relabel_graph else edge_index)
    return float((permuted - reference).abs().max()) if reference.numel() else 0.0


def equivariance_errors(
    layer: Callable, x: Tensor, edge_index: Tensor, perms: Tensor, relabel_graph: bool = False
) -> Tensor:
    r""":func:`equivariance_error` for many permutations ``perms [P, n]`` at once, ``[P]``.

    All :math:`P` permuted inputs run as **one** call of ``layer`` on their
    disjoint union (:math:`P n` nodes, :math:`P E` edges, PyG batching), so
    brute force over :math:`S_6` (720 permutations) costs two layer calls.
    This is exact for layers whose outputs depend only on each node's own
    graph (message passing without global pooling or normalisation).

    Args:
        layer (Callable): the layer :math:`f`, called as ``layer(x, edge_index)``
            and returning ``[n, ...]``; deterministic, as in
            :func:`equivariance_error`.
        x (torch.Tensor): node features ``[n, F]`` (a single tensor; use
            :func:`equivariance_error` for bipartite pairs).
        edge_index (torch.Tensor): ``[2, E]`` over the ``n`` nodes (row 0 =
            source/key, row 1 = target/query).
        perms (torch.Tensor): ``[P, n]`` (int32 or int64), every row a
            permutation of ``0 .. n - 1``, e.g. from :func:`automorphisms`.
        relabel_graph (bool, optional): relabel the graph with every
            permutation, as in :func:`equivariance_error`. (default: :obj:`False`)

    Returns:
        ``[P]`` largest absolute difference per permutation, in the dtype of the
        layer's output.
    """
    _check_eval(layer)
    if not isinstance(x, Tensor):
        raise TypeError("equivariance_errors takes a single x; use equivariance_error for pairs")
    _check_permutation(perms, x.size(0), "perms", rows=True)
    check_edge_index(edge_index, x.size(0))
    check_bool(relabel_graph, "relabel_graph")
    n = x.size(0)
    offsets = torch.arange(perms.size(0), device=x.device) * n
    if relabel_graph:
        local = torch.argsort(perms, dim=1)[:, edge_index]  # [P, 2, E]: inv[edge_index]
    else:
        local = edge_index.expand(perms.size(0), -1, -1)
    union = (local + offsets[:, None, None]).transpose(0, 1).reshape(2, -1)
    with torch.no_grad():
        reference = layer(x, edge_index)[perms]  # [P, n, F]
        permuted = layer(x[perms].flatten(0, 1), union).view_as(reference)
    if reference.numel() == 0:
        return reference.new_zeros(perms.size(0))
    return (permuted - reference).abs().flatten(1).amax(dim=1)


def check_equivariance(
    layer: Callable,
    x: Tensor | tuple[Tensor, Tensor],
    edge_index: Tensor,
    perm: Perm,
    relabel_graph: bool = False,
    atol: float | None = None,
) -> bool:
    """Whether :math:`f(x[\\pi]) = f(x)[\\pi]` up to ``atol``; see
    :func:`equivariance_error`.

    Args:
        layer, x, edge_index, perm, relabel_graph: as in :func:`equivariance_error`.
        atol (float, optional): the largest absolute difference accepted.
            (default: :obj:`None`, i.e. ``1e-9`` when ``x`` (``x_src`` for a pair)
            is float64, ``1e-4`` otherwise)
    """
    dtype = (x[0] if isinstance(x, tuple) else x).dtype
    atol = (1e-9 if dtype == torch.float64 else 1e-4) if atol is None else atol
    return equivariance_error(layer, x, edge_index, perm, relabel_graph) <= atol
