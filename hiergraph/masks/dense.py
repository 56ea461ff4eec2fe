r"""Converters between dense boolean masks and ``edge_index`` that fix the direction.

The trap: a dense attention mask is indexed ``mask[query, key]``, but
:func:`torch_geometric.utils.dense_to_sparse` reads ``adj[row, col]`` as an
edge ``row -> col``, i.e. *key <- query*: fed a causal mask it returns
anti-causal attention, and symmetric masks hide the mistake. The two functions
here never guess: the caller states, with the keyword-only ``rows`` argument,
whether the mask's rows are the queries (``rows="query"``, the convention of
``scaled_dot_product_attention`` and of the paper) or the keys (``rows="key"``,
an adjacency matrix ``A[source, target]``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_int
from hiergraph.ops.edge_index import check_edge_index

_ROWS = ("query", "key")


def _check_rows(rows: str) -> None:
    if rows not in _ROWS:
        raise ValueError(
            f'rows must be "query" (mask[query, key], as for scaled_dot_product_attention) '
            f'or "key" (adjacency A[source, target]), got {rows!r}'
        )


def mask_to_edge_index(mask: Tensor, *, rows: str) -> Tensor:
    """Dense boolean mask -> ``edge_index`` (row 0 = key/source, row 1 = query/target).

    Args:
        mask (torch.Tensor): bool ``[num_queries, num_keys]`` (``rows="query"``) or
            ``[num_keys, num_queries]`` (``rows="key"``), ``True`` = allowed pair.
        rows (str): what the rows of :obj:`mask` index, ``"query"`` or ``"key"``;
            no default, on purpose.

    Returns:
        ``[2, E]`` with one column ``[j, i]`` per allowed pair (query ``i``
        attends key ``j``), sorted by query and then by key.
    """
    _check_rows(rows)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise TypeError("mask must be a 2-D BoolTensor; use mask.bool() for 0/1 masks")
    query, key = (mask if rows == "query" else mask.T).nonzero().T
    return torch.stack([key, query])


def edge_index_to_mask(
    edge_index: Tensor, num_nodes: int | tuple[int, int], *, rows: str
) -> Tensor:
    """``edge_index`` -> dense boolean mask; the inverse of :func:`mask_to_edge_index`.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` (row 0 = key/source, row 1 =
            query/target).
        num_nodes (int or (int, int)): ``n`` for a square mask, or
            ``(num_keys, num_queries)`` for a bipartite one (PyG's ``size``
            convention).
        rows (str): ``"query"`` for ``mask[query, key]``, ``"key"`` for
            ``A[key, query]``.

    Returns:
        BoolTensor ``[num_queries, num_keys]`` (``rows="query"``) or its
        transpose, on ``edge_index``'s device.

    Raises:
        TypeError, ValueError: from :func:`~hiergraph.ops.edge_index.check_edge_index`.
    """
    _check_rows(rows)
    if isinstance(num_nodes, tuple | list) and len(num_nodes) == 2:
        num_keys, num_queries = num_nodes
    else:
        num_keys = num_queries = num_nodes
    # (a NumPy int failed to unpack, -1 inside zeros)
    num_keys, num_queries = (as_int(n, "num_nodes") for n in (num_keys, num_queries))
    check_int(min(num_keys, num_queries), "num_nodes", minimum=0)
    check_edge_index(edge_index, num_keys, num_queries)
    key, query = edge_index
    mask = torch.zeros(num_queries, num_keys, dtype=torch.bool, device=edge_index.device)
    mask[query, key] = True
    return mask if rows == "query" else mask.T
