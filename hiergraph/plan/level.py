"""One depth level of a :class:`~hiergraph.plan.tree_index.TreeIndex`: :class:`Level`, its
nodes, families, leaves and the :class:`~hiergraph.plan.family_block.FamilyBlock` s its
families are cut into, and how the levels of a forest are built from its breadth-first
layout (:func:`make_levels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hiergraph._runs import ramp
from hiergraph.plan._first_use import built_on_first_use
from hiergraph.plan._inference_mode import outside_inference_mode
from hiergraph.plan._to_device import moved
from hiergraph.plan.family_block import FamilyBlock, gather_slots, make_blocks


@dataclass
class Level:
    """One depth level of a :class:`TreeIndex` (all positions are local to the level).

    Attributes (``n`` nodes on the level):
        start: BFS position of the level's first node.
        parent_local: ``[n]`` index of each node's parent in the previous
            level (sorted: the level is grouped by parent); empty for level 0.
        num_children: ``[n]`` number of children of each node (0 for leaves);
            the children of node ``i`` are a contiguous run of the next level.
        leaf_local: positions of the leaves on this level.
        leaf_id: their indices in leaf order.
        count: ``[n]`` number of leaves below each node.
        family_start, family_size: the families (children of one parent) of
            this level, as local contiguous runs.
        fanout: the number of children when every node of the level has the same number,
            else ``None`` (read when the plan is built, so that a compiled forward over a
            fresh plan reads no tensor on the host).

    The block kernel's parts, :attr:`blocks` and the gather slots (:attr:`gathers`), are
    built on first use (neither the compiled CPU kernels nor an equal-fanout forest's
    reshaped views read them), or by :meth:`complete`.
    """

    start: int
    parent_local: Tensor
    num_children: Tensor
    leaf_local: Tensor
    leaf_id: Tensor
    count: Tensor
    family_start: Tensor
    family_size: Tensor
    fanout: int | None = None

    @property
    def size(self) -> int:
        return self.num_children.numel()

    @property
    def all_leaves(self) -> bool:
        return self.leaf_local.numel() == self.size

    @built_on_first_use
    def blocks(self) -> list[FamilyBlock]:
        """The families cut into :class:`FamilyBlock` s for the block kernel: a whole level
        of one family size, or a run of consecutive families of one size whose slots save
        more than a block costs, is a slice block; the rest are padded into gather blocks
        whose widths :func:`padded_widths` chooses (:mod:`hiergraph.plan.costs`)."""
        return make_blocks(self.family_start, self.family_size, self.parent_local)

    @built_on_first_use
    def gathers(self) -> dict[str, Tensor]:
        """How the gather blocks read the level's rows and write its results
        (:func:`gather_slots`): ``gather_src``, the level's row of every slot of the gather
        blocks, block after block (padding repeats its family's first member), read with
        one gather per level (:meth:`gather`); on a level of gather blocks only
        ``node_slot``, every node's gather slot, else ``gather_slots`` and ``gather_rows``,
        the gather slots that hold a member and the member's row (:meth:`results`). Empty
        without gather blocks."""
        return gather_slots(self.blocks, self.size)

    def complete(self) -> None:
        """Build :attr:`blocks` and :attr:`gathers` now (else built on first use)."""
        self.gathers  # noqa: B018 (built and cached on first read)

    def gather(self, x: Tensor | None) -> Tensor | None:
        """The gather blocks' slots of the level's rows ``x`` (``[n, ...]``), block after
        block: ``[G, ...]`` (``None`` without gather blocks or ``x``)."""
        src = self.gathers.get("gather_src")
        if x is None or src is None:
            return None
        return x.index_select(0, src)

    def result_buffers(self, like: Tensor, shape: tuple) -> tuple[Tensor | None, ...]:
        """Empty buffers for a result of shape ``[n, *shape]`` written block by block: the
        level's rows if it has slice blocks, and the gather slots ``[G, *shape]`` if it has
        gather blocks (``None`` where it has none); in ``like``'s dtype and device."""
        src = self.gathers.get("gather_src")
        rows = None if "node_slot" in self.gathers else like.new_empty(self.size, *shape)
        slots = None if src is None else like.new_empty(len(src), *shape)
        return rows, slots

    def results(self, rows: Tensor | None, slots: Tensor | None) -> Tensor:
        """The ``[n, ...]`` result from the :meth:`result_buffers` the blocks wrote."""
        gathers = self.gathers
        if slots is None:
            return rows
        if rows is None:
            return slots.index_select(0, gathers["node_slot"])
        written = slots.index_select(0, gathers["gather_slots"])
        return rows.index_put_((gathers["gather_rows"],), written)

    @cached_property
    @outside_inference_mode
    def sibling_pairs(self) -> Tensor:
        """``[2, S]`` local positions ``(query, key)`` of all ordered pairs of distinct siblings."""
        return pairs(self.family_start, self.family_size)

    def to(self, device) -> Level:
        return moved(self, device, cached=("blocks", "gathers"))


def _fanout(num_children: Tensor) -> int | None:
    """The number of children of every node of a level, when they all have the same number
    (else ``None``); one host read."""
    if not num_children.numel():
        return None
    low, high = torch.stack(torch.aminmax(num_children)).tolist()
    return low if low == high else None


def pairs(family_start: Tensor, family_size: Tensor) -> Tensor:
    """All ordered pairs of distinct members of every family, grouped by query."""
    member_size = family_size.repeat_interleave(family_size)
    member_start = family_start.repeat_interleave(family_size)
    member_pos = member_start + ramp(family_size)
    query = member_pos.repeat_interleave(member_size)
    key = member_start.repeat_interleave(member_size) + ramp(member_size)
    keep = query != key
    return torch.stack([query[keep], key[keep]])


def make_levels(
    parent_pos: Tensor,
    level_ptr: list[int],
    leaf_id_at: Tensor,
    family_start: Tensor,
    family_size: Tensor,
) -> list[Level]:
    """The :class:`Level` of every depth, from the breadth-first parents ``parent_pos`` and
    leaf ids ``leaf_id_at`` (-1 for internal nodes) of the positions, and the families;
    the children and the leaves below every node are counted here."""
    n, depths = parent_pos.numel(), len(level_ptr) - 1
    num_children = torch.bincount(parent_pos[level_ptr[1] if n else 0 :], minlength=n)
    count = (leaf_id_at >= 0).long()
    for d in range(depths - 1, 0, -1):  # leaves below every node, deepest level first
        lo, hi, up = level_ptr[d], level_ptr[d + 1], level_ptr[d - 1]
        below = torch.bincount(
            parent_pos[lo:hi] - up, weights=count[lo:hi].double(), minlength=lo - up
        )
        count[up:lo] += below.long()  # (the level above: a level's cost is its own size)
    family_ptr = torch.searchsorted(family_start, family_start.new_tensor(level_ptr)).tolist()
    levels = []
    for d in range(depths):
        lo, hi = level_ptr[d], level_ptr[d + 1]
        pl = parent_pos[lo:hi] - level_ptr[d - 1] if d else parent_pos.new_empty(0)
        families = slice(family_ptr[d], family_ptr[d + 1])
        f_start, f_size = family_start[families] - lo, family_size[families]
        ids = leaf_id_at[lo:hi]
        local = (ids >= 0).nonzero().view(-1)
        levels.append(
            Level(
                start=lo,
                parent_local=pl,
                num_children=num_children[lo:hi],
                leaf_local=local,
                leaf_id=ids[local],
                count=count[lo:hi],
                family_start=f_start,
                family_size=f_size,
                fanout=_fanout(num_children[lo:hi]),
            )
        )
    return levels
