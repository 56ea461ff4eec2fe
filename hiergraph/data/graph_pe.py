"""Laplacian eigenvector position features for graph-domain families."""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_int
from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import as_long


def laplacian_pe(hierarchy, edge_index: Tensor, k: int) -> Tensor:
    r"""Spectral position features of the members of every graph-domain family.

    For a family whose domain is :attr:`Domain.GRAPH`, with (undirected)
    sibling edges :math:`A` and degrees :math:`D`, the features of its
    members are the eigenvectors of the normalised Laplacian

    .. math:: L = I - D^{-1/2} A D^{-1/2}

    for the ``k`` smallest eigenvalues after the first (the trivial one),
    zero-padded when the family has at most ``k`` members. These
    low-frequency eigenvectors vary slowly along edges, so connected nodes
    get similar features; the HSA paper leaves the graph PE open and this is
    the common choice. The layer projects them before the sibling bias
    :math:`\varepsilon(A)^\top\varepsilon(B)`. Each
    eigenvector's sign is fixed by making its largest-magnitude entry
    positive; eigenvectors of repeated eigenvalues are basis-dependent.

    Set the result as ``hierarchy.graph_pe`` and build
    :class:`~hiergraph.nn.FamilyPositionEncoder` with ``graph_pe_dim=k``.

    Args:
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy` (or a batch).
        edge_index: ``[2, E]`` edges between node ids of ``hierarchy`` (integers); both
            ends must be members of the same graph-domain family.
        k: number of features per node.

    Returns:
        ``[N, k]`` float32 features on the hierarchy's device (zero for nodes
        outside graph-domain families).
    """
    k = as_int(k, "k")  # (NumPy ints too)
    check_int(k, "k")
    n = hierarchy.num_nodes
    # (the data layer's index check: check_edge_index lives in ops, a layer above)
    edge_index = as_long(edge_index, "edge_index", hierarchy.parent.device)
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must be [2, E], got {tuple(edge_index.shape)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise ValueError(f"edge_index refers to nodes outside [0, {n})")
    parent, domain = hierarchy.parent, hierarchy.domain
    src, dst = edge_index
    if bool((parent[src] != parent[dst]).any() | (src == parent[src]).any()):
        raise ValueError("every edge must join two siblings (children of the same parent)")
    if bool((domain[src] != int(Domain.GRAPH)).any()):
        raise ValueError(
            "edges must lie in families whose domain is Domain.GRAPH; build them with "
            "Family(children, 'graph')"
        )
    device = parent.device
    out = torch.zeros(n, k, device=device)
    members = (domain == int(Domain.GRAPH)).nonzero().view(-1)
    if members.numel() == 0:
        return out
    # families grouped by size: one batched eigendecomposition per size
    members = members[torch.argsort(parent[members], stable=True)]
    _, fam_id, sizes = torch.unique_consecutive(
        parent[members], return_inverse=True, return_counts=True
    )
    start = torch.cumsum(sizes, 0) - sizes
    local = torch.full((n,), -1, dtype=torch.long, device=device)
    local[members] = torch.arange(members.numel(), device=device) - start[fam_id]
    fam_of = torch.full((n,), -1, dtype=torch.long, device=device)
    fam_of[members] = fam_id
    inside = local[src] >= 0
    src, dst = src[inside], dst[inside]
    order = torch.argsort(sizes[fam_of[src]])  # edges grouped by the size of their family
    src, dst = src[order], dst[order]
    edge_end = torch.searchsorted(sizes[fam_of[src]], sizes.unique(), right=True)
    # rank of every family among the families of its size
    by_size = torch.argsort(sizes, stable=True)
    rank = torch.empty_like(by_size)
    sorted_sizes = sizes[by_size]
    first_of_size = torch.searchsorted(sorted_sizes, sorted_sizes)
    rank[by_size] = torch.arange(by_size.numel(), device=device) - first_of_size
    edge_start = 0
    for size, end in zip(sizes.unique().tolist(), edge_end.tolist(), strict=True):
        e_src, e_dst = src[edge_start:end], dst[edge_start:end]
        edge_start = end
        if size < 2:  # a single member has no non-trivial eigenvector
            continue
        fams = (sizes == size).nonzero().view(-1)
        adj = torch.zeros(fams.numel(), size, size, dtype=torch.float64, device=device)
        adj[rank[fam_of[e_src]], local[e_src], local[e_dst]] = 1.0
        adj = ((adj + adj.transpose(1, 2)) > 0).double()
        adj.diagonal(dim1=1, dim2=2).zero_()
        deg = adj.sum(2)
        inv_sqrt = torch.where(deg > 0, deg.clamp(min=1e-12).rsqrt(), torch.zeros_like(deg))
        eye = torch.eye(size, dtype=torch.float64, device=device)
        lap = eye - inv_sqrt[..., None] * adj * inv_sqrt[:, None]
        _, vecs = torch.linalg.eigh(lap)
        vecs = vecs[:, :, 1 : k + 1]
        sign = torch.sign(vecs.gather(1, vecs.abs().argmax(1, keepdim=True)))
        nodes = members[sizes[fam_id] == size]
        out[nodes, : vecs.size(2)] = (vecs * sign).reshape(-1, vecs.size(2)).float()
    return out
