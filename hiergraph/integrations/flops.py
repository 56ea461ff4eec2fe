r"""Attention FLOP counter: flat softmax vs HSA vs local block attention, per layer.

The accounting reconstructs the FLOP counts of Amizadeh et al., Sec. 4.3,
Table 3 (the paper reports the numbers, not the formula): every attention
score costs :math:`2d` (query–key dot product) :math:`+\,2d_v` (weighting the
value) :math:`+\,c` (scale, mask, exponential, sum, division;
:data:`SCORE_FLOPS` :math:`= 12`), so flat
attention over :math:`N` tokens costs

.. math::
    \mathrm{FL}_\text{flat} = H\,N^2\,(2d + 2d_v + c)

per layer (:math:`H` heads of width :math:`d`), which reproduces the paper's
flat numbers (``N = 264, d = 768``: 214.94 MFLOPs). HSA runs the same score
computation inside every family :math:`f` of :math:`b_f` children (dense
:math:`b_f \times b_f` blocks, as the dense family kernel computes them),
plus the tree bookkeeping the paper's estimate leaves out: pooling the mean
query/key/value into each parent (:math:`2(2d + d_v)` per non-root node),
the gates (:math:`c` per non-root node) and the top-down accumulation
(:math:`2 d_v` per non-root node, and per leaf with include-self):

.. math::
    \mathrm{FL}_\text{HSA} = H\Big[\sum_f b_f^2 (2d + 2d_v + c)
        + M' \big(2(2d+d_v) + c + 2d_v\big) + [\text{self}]\,2 d_v N\Big]

with :math:`M'` the number of non-root nodes. Only the attention itself is
counted; the q/k/v/output projections are the same for every method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hiergraph._checks import check_bool, check_int
from hiergraph._deprecation import renamed_arguments
from hiergraph.data.signal_hierarchy import as_hierarchy

if TYPE_CHECKING:
    from torch_geometric.data import Batch

    from hiergraph.data.signal_hierarchy import SignalHierarchy

#: FLOPs per attention score besides the two dot products (the value that reproduces
#: the flat numbers of Amizadeh et al., Table 3).
SCORE_FLOPS = 12


def _per_score(head_dim: int, value_dim: int | None, score_flops: int) -> int:
    """FLOPs per score (checked: ``head_dim``, ``value_dim`` and ``score_flops`` ints
    ``>= 0``)."""
    value_dim = head_dim if value_dim is None else value_dim
    for value, name in (
        (head_dim, "head_dim"),
        (value_dim, "value_dim"),
        (score_flops, "score_flops"),
    ):
        check_int(value, name, minimum=0)
    return 2 * head_dim + 2 * value_dim + score_flops


def _check_sizes(num_tokens: int, heads: int) -> None:
    check_int(num_tokens, "num_tokens", minimum=0)
    check_int(heads, "heads", minimum=0)


def flat_attention_flops(
    num_tokens: int,
    head_dim: int,
    heads: int = 1,
    value_dim: int | None = None,
    score_flops: int = SCORE_FLOPS,
) -> int:
    r"""FLOPs of softmax attention over ``num_tokens`` tokens, :math:`H N^2 (2d + 2d_v + c)`.

    Args:
        num_tokens (int): number of tokens :math:`N`, ``>= 0``.
        head_dim (int): query/key width :math:`d` per head, ``>= 0``.
        heads (int, optional): number of heads :math:`H`, ``>= 0``. (default: :obj:`1`)
        value_dim (int, optional): value width :math:`d_v`, ``>= 0``.
            (default: :obj:`None`, i.e. :obj:`head_dim`)
        score_flops (int, optional): FLOPs :math:`c` per score besides the dot
            products, ``>= 0``. (default: :data:`SCORE_FLOPS`)
    """
    _check_sizes(num_tokens, heads)
    return heads * num_tokens**2 * _per_score(head_dim, value_dim, score_flops)


@renamed_arguments(block="block_size")
def block_attention_flops(
    num_tokens: int,
    block_size: int,
    head_dim: int,
    heads: int = 1,
    value_dim: int | None = None,
    score_flops: int = SCORE_FLOPS,
) -> int:
    r"""FLOPs of softmax attention inside non-overlapping blocks of ``block_size`` tokens
    (the last block may be partial),

    .. math::
        H \big(\lfloor N/b \rfloor\, b^2 + (N \bmod b)^2\big) (2d + 2d_v + c).

    Args:
        num_tokens (int): number of tokens :math:`N`, ``>= 0``.
        block_size (int): tokens per block :math:`b`, ``>= 1`` (formerly ``block``).
        head_dim (int): query/key width :math:`d` per head, ``>= 0``.
        heads (int, optional): number of heads :math:`H`, ``>= 0``. (default: :obj:`1`)
        value_dim (int, optional): value width :math:`d_v`, ``>= 0``.
            (default: :obj:`None`, i.e. :obj:`head_dim`)
        score_flops (int, optional): FLOPs :math:`c` per score besides the dot
            products, ``>= 0``. (default: :data:`SCORE_FLOPS`)
    """
    _check_sizes(num_tokens, heads)
    check_int(block_size, "block_size")
    full, rest = divmod(num_tokens, block_size)
    scores = full * block_size**2 + rest**2
    return heads * scores * _per_score(head_dim, value_dim, score_flops)


def hsa_attention_flops(
    hierarchy: SignalHierarchy | Batch,
    head_dim: int,
    heads: int = 1,
    value_dim: int | None = None,
    include_self: bool = True,
    score_flops: int = SCORE_FLOPS,
) -> dict[str, int]:
    r"""FLOPs of HSA over ``hierarchy`` (a :class:`~hiergraph.data.SignalHierarchy` or a
    PyG batch of them; batches sum over their trees).

    Args:
        hierarchy (SignalHierarchy or Batch): the tree(s).
        head_dim (int): query/key width :math:`d` per head.
        heads (int, optional): number of heads :math:`H`. (default: :obj:`1`)
        value_dim (int, optional): value width :math:`d_v`. (default: :obj:`None`,
            i.e. :obj:`head_dim`)
        include_self (bool, optional): count the leaves' self terms.
            (default: :obj:`True`)
        score_flops (int, optional): FLOPs per score besides the dot products.
            (default: :data:`SCORE_FLOPS`)

    Returns:
        ``{'family': ..., 'tree': ..., 'total': ...}``: the family softmax
        attention (:math:`\sum_f b_f^2` scores), the pooling/gate/accumulation
        bookkeeping, and their sum.
    """
    check_int(heads, "heads", minimum=0)  # (-2 heads counted negative FLOPs)
    check_bool(include_self, "include_self")
    hierarchy = as_hierarchy(hierarchy)
    parent = hierarchy.parent
    nodes = torch.arange(parent.numel(), device=parent.device)
    non_root = parent != nodes
    sizes = torch.bincount(parent[non_root], minlength=parent.numel())
    value_dim = head_dim if value_dim is None else value_dim
    family = int((sizes**2).sum()) * _per_score(head_dim, value_dim, score_flops)
    num_edges = int(non_root.sum())
    tree = num_edges * (2 * (2 * head_dim + value_dim) + score_flops + 2 * value_dim)
    if include_self:
        tree += 2 * value_dim * int(hierarchy.is_leaf.sum())
    return {"family": heads * family, "tree": heads * tree, "total": heads * (family + tree)}
