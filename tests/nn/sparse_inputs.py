"""Sparse adjacency inputs for the message-passing layers' tests."""

import warnings

import torch

#: ``torch.sparse`` layouts a layer takes (``coo-uncoalesced``: the edges as given).
LAYOUTS = ["coo", "coo-uncoalesced", "csr", "csc"]


def adjacency(edge_index, num_src, num_dst, layout="coo", values=None, dtype=torch.float64):
    """The edges as a sparse adjacency ``adj_t[target, source]`` (row = target, as in PyG),
    with ``values`` (default: ones of ``dtype``); ``coo-uncoalesced`` stores them as given
    (unsorted when they are)."""
    values = torch.ones(edge_index.size(1), dtype=dtype) if values is None else values
    size = (num_dst, num_src, *values.shape[1:])
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, size, check_invariants=True)
    if layout == "coo-uncoalesced":
        return coo
    coo = coo.coalesce()
    with warnings.catch_warnings():  # PyTorch's "sparse CSR/CSC support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout]


def dense_alpha(edge_index, alpha, num_src, num_dst):
    """``[num_dst, num_src, H]`` attention weights of the edges (no repeated edges)."""
    out = alpha.new_zeros(num_dst, num_src, alpha.size(1))
    return out.index_put_((edge_index[1].long(), edge_index[0].long()), alpha)
