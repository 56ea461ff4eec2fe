r"""Banded masks: a small descriptor that lets attention run as blocked dense kernels.

Sliding windows, causal windows, dilated (strided) windows, causal and full
attention and block-diagonal masks are all *bands* over a sequence cut into
contiguous segments (see :mod:`hiergraph.ops.masked.banded`). A
:class:`BandMask` names such a mask with four numbers instead of
:math:`O(N\,w)` edges; :meth:`BandMask.edge_index` materialises the edges and
:meth:`BandMask.detect` recognises a band in an arbitrary ``edge_index``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_bool
from hiergraph.ops.edge_index import check_edge_index
from hiergraph.ops.masked.banded import band_predicate, clamped_band, segment_ids


def _band_size(length: Tensor, before: int, after: int) -> Tensor:
    r"""Edges of a plain band on sequences of the given lengths (elementwise):
    :math:`\sum_i |[i-b, i+a] \cap [0, n)|`."""
    # sum over offsets t in [-a, b] of the number of i with 0 <= i - t < n
    b = torch.clamp(length - 1, min=0).clamp(max=before)
    a = torch.clamp(length - 1, min=0).clamp(max=after)
    return (b + a + 1) * length - b * (b + 1) // 2 - a * (a + 1) // 2


@dataclass(frozen=True)
class BandMask:
    r"""Query :math:`i` attends key :math:`j` iff both lie in the same segment,
    :math:`(i - j) \bmod s = 0` and :math:`-a\,s \le i - j \le b\,s`.

    Attributes:
        lengths: lengths of the contiguous segments (a batch of sequences);
            positions are numbered ``0 .. sum(lengths) - 1`` segment after segment.
        before: :math:`b \ge 0`, keys to the left (in steps of ``dilation``).
        after: :math:`a \ge 0`, keys to the right (in steps of ``dilation``).
        dilation: :math:`s \ge 1`.

    Edge count: with :math:`n_{r}` the size of residue class :math:`r` of a
    segment of length :math:`n` (:math:`n_r = \lceil (n - r)/s \rceil`),
    :math:`b' = \min(b, n_r - 1)` and :math:`a' = \min(a, n_r - 1)`,

    .. math::
        E = \sum_{\text{segments}} \sum_{r=0}^{s-1}
            (b' + a' + 1)\,n_r - \tfrac{b'(b'+1)}{2} - \tfrac{a'(a'+1)}{2}.

    Every query attends itself, so no row of a band is empty. A reach past the longest
    segment is clamped to it (``before``, ``after`` at most :math:`\lfloor (n - 1)/s
    \rfloor`, and a dilation that leaves only the diagonal becomes 1): the same band.
    """

    lengths: tuple[int, ...]
    before: int
    after: int
    dilation: int = 1

    def __post_init__(self):
        object.__setattr__(self, "lengths", tuple(as_int(n, "lengths") for n in self.lengths))
        for name in ("before", "after", "dilation"):
            object.__setattr__(self, name, as_int(getattr(self, name), name))
        if any(n < 0 for n in self.lengths):
            raise ValueError(f"segment lengths must be >= 0, got {self.lengths}")
        if self.before < 0 or self.after < 0:
            raise ValueError(
                f"before and after must be >= 0, got before={self.before}, after={self.after}"
            )
        if self.dilation < 1:
            raise ValueError(f"dilation must be >= 1, got {self.dilation}")
        band = clamped_band(self.lengths, self.before, self.after, self.dilation)
        for name, value in zip(("before", "after", "dilation"), band, strict=True):
            object.__setattr__(self, name, value)

    @property
    def num_nodes(self) -> int:
        return sum(self.lengths)

    @property
    def num_edges(self) -> int:
        """The edge count of the class docstring, in closed form (computed on the CPU)."""
        lengths = torch.tensor(self.lengths, dtype=torch.long, device="cpu")
        classes = [torch.clamp(lengths - r, min=0) for r in range(self.dilation)]
        return sum(
            int(_band_size(-(-c // self.dilation), self.before, self.after).sum()) for c in classes
        )

    def segment_ids(self, device: torch.device | None = None) -> Tensor:
        """``[num_nodes]`` segment of every position."""
        return segment_ids(self.lengths, device)

    def edge_index(self, device: torch.device | None = None) -> Tensor:
        """``[2, num_edges]`` edges (row 0 = key/source, row 1 = query/target),
        sorted by target and then by source."""
        n = self.num_nodes
        dst = torch.arange(n, device=device)[:, None]
        src = dst - torch.arange(self.before, -self.after - 1, -1, device=device) * self.dilation
        inside = (src >= 0) & (src < n)
        src, dst = src.clamp(0, max(n - 1, 0)), dst.expand_as(src)
        keep = inside & band_predicate(
            dst, src, self.segment_ids(device), self.before, self.after, self.dilation
        )
        return torch.stack([src[keep], dst[keep]])

    @classmethod
    def detect(
        cls, edge_index: Tensor, num_nodes: int, *, check_range: bool = True
    ) -> BandMask | None:
        """The band whose edge set equals ``edge_index``'s, or ``None``.

        Exact: all edges must satisfy the band's predicate, be distinct, and be
        as many as the band has. Segments are inferred from the links between
        neighbours (``i -> i+1``), so they are recognised for ``dilation = 1``;
        a dilated band is recognised on a single segment. Costs :math:`O(E)`
        (plus a sort when the edges are not sorted by target, then source).

        ``check_range=False`` skips the check of the ids against ``num_nodes``, for a caller
        that has checked them (or was told not to): ids out of range then give no defined
        result.

        Raises:
            TypeError, ValueError: ``edge_index`` is no edge list over ``num_nodes`` nodes
                (:func:`~hiergraph.ops.edge_index.check_edge_index`: an int64 or int32
                tensor ``[2, E]``, ids in ``[0, num_nodes)``).
        """
        num_nodes = as_int(num_nodes, "num_nodes")
        check_bool(check_range, "check_range")
        check_edge_index(edge_index, num_nodes, check_range=bool(check_range))
        if edge_index.size(1) == 0:
            return None
        src, dst = edge_index.long()  # int32 ids: the key below is int64
        offset = dst - src
        before, after = int(offset.max()), -int(offset.min())
        if before < 0 or after < 0:  # the diagonal lies outside the offset range
            return None
        dilation = int(torch.where(offset == 0, num_nodes, offset.abs()).min())
        dilation = 1 if dilation == num_nodes else dilation
        if dilation > 1 and bool((offset % dilation != 0).any()):
            return None
        lengths = (num_nodes,)
        if dilation == 1 and before + after > 0:
            step = 1 if before > 0 else -1  # the link i -> i+1 (or i+1 -> i) of a segment
            linked = torch.zeros(num_nodes - 1, dtype=torch.bool, device=src.device)
            linked[torch.minimum(src, dst)[offset == step]] = True
            cuts = torch.cat([(~linked).nonzero().view(-1) + 1, src.new_tensor([num_nodes])])
            lengths = tuple(torch.diff(cuts, prepend=cuts.new_zeros(1)).tolist())
        band = cls(lengths, before // dilation, after // dilation, dilation)
        if band.num_edges != edge_index.size(1):
            return None
        if len(lengths) > 1:
            segment = band.segment_ids(src.device)
            if bool((segment[src] != segment[dst]).any()):
                return None
        # one key per (target, offset): below num_nodes * width, far from int64's limit for
        # any edge list in memory (dst * num_nodes + src overflowed past 3.04e9 nodes)
        width = (before + after) // dilation + 1
        key = dst * width + (src - dst + before) // dilation
        distinct = bool((key[1:] > key[:-1]).all()) or key.unique().numel() == key.numel()
        return band if distinct else None
