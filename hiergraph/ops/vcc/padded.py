r"""VCC with static shapes: padded sequences, fixed-size selections, no host synchronisation.

The same layer as :func:`~hiergraph.ops.vcc.layer.vcc_layer` (Zeng et al., *VCC: Scaling
Transformers to 128K Tokens or More by Prioritizing Important Tokens*, Sec. 3, Alg. 1–2),
laid out for accelerators and ``torch.compile``: every shape follows from the input's
``[B, n, d]``, the number of VIP slots, the branching and the budgets, never from tensor
values, so a forward and backward run without a host synchronisation and can be captured
(CUDA graphs, ``fullgraph=True``).

* :func:`partition_padded`: the VIP tokens go to ``num_slots`` rows per sequence,
  :math:`P` ``[B, S, d]`` (the first ``S`` VIP tokens of each sequence; further VIP tokens
  are compressed with the others, as in the authors' code), the other tokens in order to
  :math:`C` ``[B, n_c, d]``, zero-padded (:class:`PaddedPartition`).
* :class:`PaddedSegmentTree`: one regular tree over the padded :math:`C` of every sequence,
  with per-node token counts :math:`s`; a node without tokens is never a row.
* :func:`select_padded`: Algorithm 1 with a fixed number of candidates per level. A level
  with budget ``h`` refines the ``h`` candidates of highest VIP score (a stable top-k: on
  ties the earlier segment), whose children are the next level's candidates; ``None``
  refines all of them. The other candidates are rows of the compressed sequence, with key
  bias :math:`\log s` (:math:`-\infty` for a candidate without tokens). So
  :math:`[P; S_c C]` is one ``[B, r, d]`` tensor with ``r = S + sum over the levels of
  (candidates - h)``: for two resolutions, ``S + n_c / k - h + h k``.
* :func:`vcc_layer_padded`: the layer on :math:`[P; S_c C]`, then every token adds the
  update of the :math:`\mathcal{J}` row that contains it (:math:`S^\dagger\gamma(SX) + X`,
  eq. 7; Claim 6.4), pushed down the tree level by level.

Rows are grouped by level, not in token order: the layer must treat its rows as a set
(no relative positions), as everywhere in VCC. In float64 the result equals the ragged
tree form (:func:`~hiergraph.ops.vcc.layer.vcc_layer`) to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph._checks import check_int, described, holds_integers, refuse_where
from hiergraph._precision import accumulation_dtype
from hiergraph.data.windows import check_branching
from hiergraph.ops.vcc.layer import (
    LayerFn,
    check_layer_output,
    check_vip_inputs,
    log_count,
    vip_scores_padded,
)
from hiergraph.ops.vcc.segment_tree import check_budgets, check_scores

PaddedScoreFn = Callable[[Tensor, Tensor], Tensor]
"""``score_fn(means [B, c, d], key_bias [B, c]) -> [B, c]``: larger = refine first;
``key_bias`` is :math:`\\log s`, ``-inf`` for candidates without tokens."""


def _take(x: Tensor, index: Tensor) -> Tensor:
    """Rows ``x[b, index[b, i]]``, ``[B, c, d]``, of ``x`` ``[B, n, d]``: one ``index_select``
    of whole rows (a gather would read a broadcast index per element)."""
    batch, length = x.shape[:2]
    flat = index
    if batch > 1:  # sequence b's rows start at b * n
        flat = index + torch.arange(0, batch * length, length, device=index.device).unsqueeze(1)
    return x.flatten(0, 1).index_select(0, flat.flatten()).view(*index.shape, *x.shape[2:])


def open_empty_rows(key_bias: Tensor) -> Tensor:
    r"""``key_bias`` ``[B, r]`` with key 0 opened (bias 0) in sequences whose every key is
    :math:`-\infty`: their softmax would be NaN, and a NaN reaches the gradients of every
    weight even when those rows are discarded. The rows of such sequences are padding."""
    empty = key_bias.isneginf().all(1, keepdim=True)
    return torch.cat([key_bias[:, :1].masked_fill(empty, 0.0), key_bias[:, 1:]], 1)


@dataclass(frozen=True)
class PaddedSegmentTree:
    r"""The segment tree of :class:`~hiergraph.ops.vcc.segment_tree.SegmentTree` over padded
    sequences: level ``l`` has the same ``n_l`` nodes in every sequence, node ``j`` covering
    tokens ``j s_l .. (j + 1) s_l - 1`` (:math:`s_l = \prod_{i \le l} k_i`); the top level
    ``L = len(branching) + 1`` has one root per sequence.

    Attributes:
        branching: window sizes :math:`k_1, \dots, k_m` (bottom-up).
        count: per level ``0 .. L``, ``[B, n_l]`` int64 number of real tokens below each
            node (``0``: padding).
    """

    branching: tuple[int, ...]
    count: tuple[Tensor, ...]

    @classmethod
    def from_lengths(
        cls, lengths: Tensor, capacity: int, branching: Sequence[int]
    ) -> PaddedSegmentTree:
        """The tree of sequences of ``lengths`` (``[B]`` int64) real tokens each, padded to
        ``capacity`` tokens rounded up to a multiple of :math:`\\prod_i k_i`."""
        branching = check_branching(branching)
        check_int(capacity, "capacity", minimum=0)
        if not isinstance(lengths, Tensor) or lengths.dim() != 1 or not holds_integers(lengths):
            raise TypeError(f"lengths must be a 1-D integer tensor [B], got {described(lengths)}")
        refuse_where(  # (counts past the capacity, or negative ones, made no tree)
            ((lengths < 0) | (lengths > capacity)).any(),
            f"lengths must lie in [0, capacity = {capacity}]",
            found=lambda: f"{lengths.min().item()}..{lengths.max().item()}",
        )
        return cls.of_counts(lengths, capacity, branching)

    @classmethod
    def of_counts(
        cls, lengths: Tensor, capacity: int, branching: tuple[int, ...]
    ) -> PaddedSegmentTree:
        """:meth:`from_lengths` of arguments in range by construction (checked branching,
        ``0 <= lengths <= capacity``: :func:`partition_padded`'s counts of a mask), with no
        check of its own (one pass and a host read per forward)."""
        top = math.prod(branching)
        padded = -(-max(capacity, 1) // top) * top
        counts, size = [], 1
        for level in range(len(branching) + 1):
            size *= branching[level - 1] if level else 1
            start = torch.arange(0, padded, size, device=lengths.device)
            counts.append((lengths[:, None] - start).clamp(0, size))
        counts.append(lengths[:, None])
        return cls(branching, tuple(counts))

    @property
    def num_levels(self) -> int:
        """Index of the root level."""
        return len(self.branching) + 1

    @property
    def capacity(self) -> int:
        """Token slots per sequence (``n_0``)."""
        return self.count[0].size(1)

    def children(self, level: int, node: Tensor | None) -> Tensor | None:
        """Level ``level - 1`` nodes under ``node`` (``[B, c]`` nodes of ``level``, or
        ``None`` = all of them), ``[B, c f]``; ``None`` for all."""
        if node is None:
            return None
        fanout = self.count[level - 1].size(1) // self.count[level].size(1)
        return (node.unsqueeze(-1) * fanout + torch.arange(fanout, device=node.device)).flatten(1)

    def means(self, c: Tensor) -> list[Tensor]:
        r"""Segment means of every level, ``[B, n_l, d]`` for ``l = 0 .. L`` (level 0 is ``c``
        itself), from the tokens ``c`` ``[B, n_0, d]`` (zero at padding). Sums run in float32
        for half-precision ``c``; empty nodes get 0."""
        work = accumulation_dtype(c.dtype)
        sums, out = c.to(work), [c]
        for level in range(1, self.num_levels + 1):
            sums = sums.unflatten(1, (self.count[level].size(1), -1)).sum(2)
            size = self.count[level].clamp(min=1).unsqueeze(-1).to(work)
            out.append((sums / size).to(c.dtype))
        return out


@dataclass(frozen=True)
class PaddedPartition:
    r"""Where every token of ``[B, n]`` went in :func:`partition_padded`.

    Attributes:
        in_slot: ``[B, n]`` bool, the token is a VIP row.
        in_c: ``[B, n]`` bool, the token is in :math:`C` (real and not in a slot).
        rank: ``[B, n]`` int64, the token's row in :math:`P` or :math:`C` (0 elsewhere).
        slot_real: ``[B, S]`` bool, the slot holds a VIP token.
        tree: the :class:`PaddedSegmentTree` of :math:`C`.
    """

    in_slot: Tensor
    in_c: Tensor
    rank: Tensor
    slot_real: Tensor
    tree: PaddedSegmentTree

    def restore(self, p: Tensor, c: Tensor) -> Tensor:
        """Inverse of :func:`partition_padded`: ``[B, n, d]`` from ``p`` ``[B, S, d]`` and
        ``c`` ``[B, n_c, d]`` (zero at padding: a padded token takes the first empty slot of
        :math:`C`, which a sequence with padding has)."""
        slots, capacity = p.size(1), c.size(1)
        empty = self.in_c.sum(1, keepdim=True).clamp(max=capacity - 1)
        index = torch.where(self.in_c, self.rank, empty) + slots
        return _take(torch.cat([p, c], 1), torch.where(self.in_slot, self.rank, index))


def _sources(member: Tensor, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """For the ``True`` entries of ``member`` ``[B, n]`` in order: ``(rank [B, n], source
    [B, rows], filled [B, rows])``, the position of the ``i``-th member (clamped to ``n - 1``
    where there is none) and whether there is one."""
    cum = torch.cumsum(member, 1)
    wanted = torch.arange(1, rows + 1, device=member.device).expand(member.size(0), rows)
    source = torch.searchsorted(cum, wanted.contiguous()).clamp(max=member.size(1) - 1)
    return (cum - 1).clamp(min=0), source, wanted <= cum[:, -1:]


def partition_padded(
    x: Tensor, vip_mask: Tensor, token_mask: Tensor, num_slots: int, branching: Sequence[int]
) -> tuple[Tensor, Tensor, PaddedPartition]:
    r"""The stable permutation :math:`X \mapsto [P; C]` of eq. (6) into padded tensors.

    Args:
        x: ``[B, n, d]`` token rows, ``n >= 1``.
        vip_mask: ``[B, n]`` bool, ``True`` = VIP token; never ``True`` at padding.
        token_mask: ``[B, n]`` bool, ``True`` = real token, ``False`` = padding; ``None``
            for all real (checked by :func:`~hiergraph.ops.vcc.layer.check_vip_inputs`).
        num_slots: ``S``, VIP rows per sequence: a sequence's first ``S`` VIP tokens fill
            them, in order; later VIP tokens join :math:`C` in their place in the order.
        branching: the tree of :math:`C` (:class:`PaddedSegmentTree`).

    Returns:
        ``(p [B, S, d], c [B, n_c, d], partition)``, zero at padding; ``n_c`` is ``n``
        rounded up to a multiple of :math:`\prod_i k_i`.
    """
    vip_mask, token_mask = check_vip_inputs(x, vip_mask, token_mask)
    check_int(num_slots, "num_slots", minimum=0)
    length = vip_mask.size(1)
    if not length:  # (a size error inside the gather of the slots)
        raise ValueError(
            f"x must have at least one token position, got {tuple(x.shape)}: sequences of no "
            "token have nothing to partition"
        )
    in_slot = vip_mask & (torch.cumsum(vip_mask, 1) <= num_slots)
    in_c = token_mask & ~in_slot
    tree = PaddedSegmentTree.of_counts(in_c.sum(1), length, check_branching(branching))
    slot_rank, slot_source, slot_real = _sources(in_slot, num_slots)
    c_rank, c_source, c_real = _sources(in_c, tree.capacity)
    zero = x.new_zeros(())
    p = torch.where(slot_real.unsqueeze(-1), _take(x, slot_source), zero)
    c = torch.where(c_real.unsqueeze(-1), _take(x, c_source), zero)
    rank = torch.where(in_slot, slot_rank, torch.where(in_c, c_rank, 0))
    return p, c, PaddedPartition(in_slot, in_c, rank, slot_real, tree)


@dataclass(frozen=True)
class PaddedRows:
    r"""The rows of the compressed sequence that one tree level gives.

    Attributes:
        level: the tree level.
        node: ``[B, c]`` node of each row, or ``None``: every node of the level, in order.
        value: ``[B, c, d]`` segment means (differentiable).
        key_bias: ``[B, c]`` :math:`\log s`, :math:`-\infty` for a row without tokens.
    """

    level: int
    node: Tensor | None
    value: Tensor
    key_bias: Tensor


def select_padded(
    c: Tensor,
    tree: PaddedSegmentTree,
    budgets: Sequence[int | None],
    score_fn: PaddedScoreFn | None = None,
) -> list[PaddedRows]:
    r"""Algorithm 1 with static shapes: the rows of :math:`S_c C` level by level, root first.

    The root is the first candidate. At each level ``L, ..., 1`` the ``budgets`` entry
    refines ``h`` candidates per sequence (the highest ``score_fn``, ties to the earlier
    segment) or all of them (``None``, or ``h`` at least the number of candidates); the
    others, in order, are that level's rows, the children of the refined ones the next
    level's candidates, and the last level's candidates are token rows. Scores are computed
    without gradient (a discrete choice).

    Args:
        c: ``[B, n_c, d]`` tokens (zero at padding).
        tree: their :class:`PaddedSegmentTree`.
        budgets: ``tree.num_levels`` entries, root first, each an int ``>= 0`` or ``None``.
        score_fn: ``(means [B, c, d], key_bias [B, c]) -> [B, c]``; needed when a budget
            selects among candidates.
    """
    budgets = check_budgets(budgets, tree.num_levels, score_fn is not None)
    _check_tokens(c, tree)
    means = tree.means(c)
    node, rows = None, []
    # down from the root; level 0 (tokens) is never refined
    for level, h in zip(range(tree.num_levels, -1, -1), (*budgets, 0), strict=True):
        count = tree.count[level] if node is None else tree.count[level].gather(1, node)
        candidates = count.size(1)
        if h is not None and h < candidates:
            value = means[level] if node is None else _take(means[level], node)
            bias = torch.where(count > 0, log_count(count, c.dtype), float("-inf"))
            left = node
            if h:  # the h best candidates are refined; the others, in order, are rows
                with torch.no_grad():
                    score = score_fn(value.detach(), bias)
                check_scores(score, count.shape, "[B, c]")  # (a scalar broadcast: no ranking)
                score = score.masked_fill(count == 0, float("-inf"))
                order = torch.sort(score, dim=1, descending=True, stable=True).indices
                top, left = order[:, :h].sort(1).values, order[:, h:].sort(1).values
                value, bias = _take(value, left), bias.gather(1, left)
                if node is not None:
                    top, left = node.gather(1, top), node.gather(1, left)
            rows.append(PaddedRows(level, left, value, bias))
            if not h:
                break
            node = top
        if level:
            node = tree.children(level, node)
    return rows


def vcc_layer_padded(
    layer_fn: LayerFn,
    p: Tensor,
    slot_real: Tensor,
    c: Tensor,
    tree: PaddedSegmentTree,
    budgets: Sequence[int | None],
    score_fn: PaddedScoreFn | None = None,
) -> tuple[Tensor, Tensor]:
    r"""One VCC layer, :math:`X_{\text{new}} = S^\dagger \gamma(S X) + X` (eq. 7), on padded
    tensors.

    1. The rows by :func:`select_padded`; ``z = [P; rows]`` ``[B, r, d]`` with key bias 0 for
       VIP slots, :math:`\log s` for rows of :math:`\mathcal{J}`, :math:`-\infty` for
       empty slots and rows.
    2. ``out = layer_fn(z, key_bias)``.
    3. :math:`P_{\text{new}}` = the slots of ``out``; every token of :math:`C` adds
       ``out - z`` of its :math:`\mathcal{J}` row, pushed down the levels.

    Args:
        layer_fn: ``(z [B, r, d], key_bias [B, r]) -> z + gamma(z)``.
        p: ``[B, S, d]`` VIP rows, as :func:`partition_padded` returns them.
        slot_real: ``[B, S]`` bool, ``True`` where the slot holds a real VIP token
            (:attr:`PaddedPartition.slot_real`); empty slots get the key bias
            :math:`-\infty`.
        c: ``[B, n_c, d]`` the other tokens (zero at padding).
        tree: the :class:`PaddedSegmentTree` of ``c`` (:attr:`PaddedPartition.tree`).
        budgets, score_fn: as in :func:`select_padded`.

    Returns:
        ``(p_new [B, S, d], c_new [B, n_c, d])``, ``c_new`` zero at padding.
    """
    _check_tokens(c, tree)
    if not isinstance(p, Tensor) or p.dim() != 3 or p.shape[::2] != c.shape[::2]:
        raise ValueError(
            f"p must be [B, S, d] with c's B and d, {c.size(0)} and {c.size(2)}, got {described(p)}"
        )
    if not isinstance(slot_real, Tensor) or slot_real.dtype != torch.bool:
        raise TypeError(f"slot_real must be a bool tensor [B, S], got {described(slot_real)}")
    if slot_real.shape != p.shape[:2]:
        raise ValueError(
            f"slot_real must have p's [B, S], {tuple(p.shape[:2])}, got {tuple(slot_real.shape)}"
        )
    rows = select_padded(c, tree, budgets, score_fn)
    slot_bias = torch.zeros(slot_real.shape, dtype=p.dtype, device=p.device)
    slot_bias = slot_bias.masked_fill(~slot_real, float("-inf"))
    z = torch.cat([p, *(r.value for r in rows)], 1)
    key_bias = open_empty_rows(torch.cat([slot_bias, *(r.key_bias for r in rows)], 1))
    out = layer_fn(z, key_bias)
    check_layer_output(out, z)
    sizes = [p.size(1), *(r.value.size(1) for r in rows)]
    p_new, *row_out = out.split(sizes, 1)
    # segment rows: their update out - z, pushed down to the coarsest level with rows below
    update = None
    for r, new in zip(rows, row_out, strict=True):
        if r.level == 0:
            break
        u = (new - r.value).masked_fill(r.key_bias.isneginf().unsqueeze(-1), 0.0)
        num_nodes = tree.count[r.level].size(1)
        if update is not None:
            update = update.repeat_interleave(num_nodes // update.size(1), dim=1)
        update = _place(update, r.node, u, num_nodes)
    real = tree.count[0].unsqueeze(-1)  # [B, n_c, 1]: 1 for a real token
    c_new = c
    if update is not None:  # c + the update of each token's segment (zero at padding)
        per_node = c.size(1) // update.size(1)
        c_new = torch.addcmul(
            c.unflatten(1, (-1, per_node)),
            real.to(c.dtype).unflatten(1, (-1, per_node)),
            update.unsqueeze(2),
        ).flatten(1, 2)
    if rows and rows[-1].level == 0:  # token rows: their new value (zero at padding)
        tokens = rows[-1]
        new = row_out[-1].masked_fill(tokens.key_bias.isneginf().unsqueeze(-1), 0.0)
        new = new.to(c.dtype)  # (under autocast a layer returns half-precision rows)
        if tokens.node is None:
            return p_new, new
        index = tokens.node.unsqueeze(-1).expand_as(new)
        # in place on a tensor of our own (addcmul's backward does not need it)
        c_new = c.scatter(1, index, new) if c_new is c else c_new.scatter_(1, index, new)
    return p_new, c_new


def _check_tokens(c: Tensor, tree: PaddedSegmentTree) -> None:
    """Raise unless ``c`` is ``[B, n_c, d]`` with ``tree``'s sequences and token slots (a
    ``c`` of one sequence broadcast against the tree's ``B``)."""
    shape = tuple(tree.count[0].shape)
    if not isinstance(c, Tensor) or c.dim() != 3 or tuple(c.shape[:2]) != shape:
        raise ValueError(
            f"c must be [{shape[0]}, {shape[1]}, d] (the tree's [B, n_c]), got {described(c)}"
        )


def _place(base: Tensor | None, node: Tensor | None, update: Tensor, num_nodes: int) -> Tensor:
    """``update`` ``[B, c, d]`` written at ``node`` of a level with ``num_nodes`` nodes.
    A row's ancestors are all refined (no rows), so ``base`` (the pushed-down updates) is
    zero there: writing equals adding."""
    if node is None:
        return update
    if base is None:
        base = update.new_zeros(update.size(0), num_nodes, update.size(2))
    return base.scatter(1, node.unsqueeze(-1).expand_as(update), update)


def vip_score_fn_padded(
    q: Tensor, slot_real: Tensor, key_fn: Callable[[Tensor], Tensor]
) -> PaddedScoreFn:
    """A :data:`PaddedScoreFn` from VIP queries ``q`` ``[B, S, H, d_h]`` and a map ``key_fn``
    from means ``[B, c, d]`` to keys ``[B, c, H, d_h]``
    (:func:`~hiergraph.ops.vcc.layer.vip_scores_padded`)."""

    def score(mean: Tensor, key_bias: Tensor) -> Tensor:
        return vip_scores_padded(q, slot_real, key_fn(mean), key_bias)

    return score
