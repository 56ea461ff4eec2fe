"""The dense blocks of the block kernel: :class:`FamilyBlock`, families of one (padded)
width of one level run as one batch, and how a level's families are cut into them (slice
blocks of long runs of equal size, gather blocks whose widths :func:`padded_widths` chooses
at the least cost, :mod:`hiergraph.plan.costs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph.plan._to_device import moved
from hiergraph.plan.costs import BLOCK_COST, SLICE_SAVING


@dataclass
class FamilyBlock:
    """``count`` families of (padded) width ``width`` of one level, run as one dense batch.

    Positions are local to the level. A *slice* block (``start`` set) holds
    ``count`` consecutive families of exactly ``width`` members at positions
    ``start .. start + count * width``: its members are a view, no gather. A
    *gather* block (``index`` set) lists the members' positions ``[count,
    width]``; where ``valid`` is false the slot is padding and repeats the
    family's first member (it is masked as a query and as a key); ``padding`` ``[count]``
    counts those slots per family. ``parents`` ``[count]`` are the families' parents, local
    to the previous level. ``offset``: a gather block's first slot among its level's gather
    slots (``gather_src`` of :attr:`Level.gathers`).
    """

    width: int
    count: int
    parents: Tensor
    start: int | None = None
    index: Tensor | None = None
    valid: Tensor | None = None
    offset: int = 0
    padding: Tensor | None = None

    @property
    def slot_cost(self) -> float:
        """What the block's slots cost the block kernel, in gather slots
        (:mod:`hiergraph.plan.costs`; its fixed cost not included)."""
        slots = self.count * self.width
        return slots if self.start is None else slots * (1 - SLICE_SAVING)

    def rows(self, x: Tensor) -> Tensor:
        """The members' rows of ``x`` (``[n_level, ...]``) as ``[count, width, ...]``."""
        if self.start is not None:
            rows = x.narrow(0, self.start, self.count * self.width)
        else:
            rows = x.index_select(0, self.index.view(-1))
        return rows.reshape(self.count, self.width, *x.shape[1:])

    def slots(self, x: Tensor | None, gathered: Tensor | None) -> Tensor:
        """The block's ``[count, width, ...]`` slots: of a slice block, rows of the level's
        ``x`` (``[n_level, ...]``); of a gather block, rows of the level's ``gathered``
        slots (:meth:`Level.gather`, :meth:`Level.result_buffers`). A view where the rows
        are contiguous."""
        if self.start is not None:
            rows = x.narrow(0, self.start, self.count * self.width)
        else:
            rows = gathered.narrow(0, self.offset, self.count * self.width)
        return rows.reshape(self.count, self.width, *rows.shape[1:])

    def to(self, device) -> FamilyBlock:
        return moved(self, device)


def gather_slots(blocks: list[FamilyBlock], size: int) -> dict:
    """A level's :attr:`Level.gathers`: ``gather_src`` and how results come back
    (``node_slot`` on a level of gather blocks only, else ``gather_slots`` and
    ``gather_rows``); empty without gather blocks."""
    gathers = [b for b in blocks if b.start is None]  # in offset order
    if not gathers:
        return {}
    src = torch.cat([b.index.view(-1) for b in gathers])
    slots = torch.cat([b.valid.view(-1) for b in gathers]).nonzero().view(-1)
    rows = src.index_select(0, slots)
    if len(gathers) == len(blocks):  # every node has a gather slot
        node_slot = torch.empty(size, dtype=torch.long, device=src.device)
        return dict(gather_src=src, node_slot=node_slot.index_copy_(0, rows, slots))
    return dict(gather_src=src, gather_slots=slots, gather_rows=rows)


def padded_widths(sizes: list[int], counts: list[int]) -> list[int]:
    """The padded width of each family size in ``sizes`` (ascending, distinct; ``counts``
    families each) in the gather blocks of one level.

    The sizes are cut into runs of consecutive sizes, each one gather block as wide as its
    largest size, at the least cost :data:`~hiergraph.plan.costs.BLOCK_COST` per block
    plus one per slot (a dynamic program over the cut points): a few families are
    cheaper padded a little wider than run on their own, many keep their width."""
    best, cut = [0.0] + [float("inf")] * len(sizes), [0] * (len(sizes) + 1)
    for last in range(1, len(sizes) + 1):
        families = 0
        for first in range(last, 0, -1):  # the block of sizes[first - 1 : last]
            families += counts[first - 1]
            cost = best[first - 1] + BLOCK_COST + sizes[last - 1] * families
            if cost < best[last]:
                best[last], cut[last] = cost, first - 1
    widths, last = [0] * len(sizes), len(sizes)
    while last:
        first = cut[last]
        widths[first:last] = [sizes[last - 1]] * (last - first)
        last = first
    return widths


def make_blocks(
    family_start: Tensor, family_size: Tensor, parent_local: Tensor
) -> list[FamilyBlock]:
    """Cut one level's families into slice blocks (long runs of equal size) and gather
    blocks (:func:`padded_widths`)."""
    device = family_start.device
    num_families = family_size.numel()
    if not num_families:
        return []
    blocks = []
    new_run = torch.ones(num_families, dtype=torch.bool, device=device)
    new_run[1:] = family_size[1:] != family_size[:-1]
    run_id = torch.cumsum(new_run, 0) - 1
    run_len = torch.bincount(run_id)
    # a run of one size becomes a slice block if it saves more than a block costs, or if
    # it is the whole level
    run_slots = run_len * family_size[new_run]
    in_run = (run_slots[run_id] * SLICE_SAVING >= BLOCK_COST) | (run_len.numel() == 1)
    firsts = (new_run & in_run).nonzero().view(-1)
    for first, length in zip(firsts.tolist(), run_len[run_id[firsts]].tolist(), strict=True):
        width, start = int(family_size[first]), int(family_start[first])
        parents = parent_local[family_start[first : first + length]]
        blocks.append(FamilyBlock(width, length, parents, start=start))
    rest = (~in_run).nonzero().view(-1)
    if rest.numel():
        sizes, inverse, counts = family_size[rest].unique(return_inverse=True, return_counts=True)
        widths = padded_widths(sizes.tolist(), counts.tolist())
        fam_width = torch.tensor(widths, dtype=torch.long, device=device)[inverse]
        offset = 0  # the gather blocks' slots, block after block
        for w in sorted(set(widths)):
            fams = rest[fam_width == w]
            local = torch.arange(w, device=device)
            start, size = family_start[fams], family_size[fams]
            valid = local < size[:, None]
            index = start[:, None] + torch.where(valid, local, 0)
            parents = parent_local[start]
            block = FamilyBlock(
                w,
                fams.numel(),
                parents,
                index=index,
                valid=valid,
                offset=offset,
                padding=(~valid).sum(1),
            )
            blocks.append(block)
            offset += block.count * block.width
    return blocks
