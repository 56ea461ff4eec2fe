r"""Relational masks as ``edge_index``.

Convention (Mijangos et al., Lemma 1; rows are queries as in the paper's code,
App. B): a mask :math:`M` with :math:`M_{ij} = 1` meaning *query* :math:`i` may
attend *key* :math:`j` is the graph with one edge :math:`j \to i` per allowed
pair, i.e. a column ``[j, i]`` of ``edge_index``: **row 0 = source = key/value,
row 1 = target = query** (PyG's ``flow="source_to_target"``; the softmax is
over the incoming edges of each target). Every builder returns a
``LongTensor [2, E]`` sorted by target and then by source, without duplicates,
and states :math:`E` in its docstring. Self-loops are explicit: a builder includes the
diagonal only where its docstring says so.

Devices: a builder that takes a tensor (``edge_index``, ``parent``) returns
its edges on that tensor's device; the others take a keyword-only
``device`` (``None``, the default, keeps PyTorch's default device) and
give the same edges on every device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.types import Device

from hiergraph._checks import as_int, check_bool, check_seed, holds_integers
from hiergraph.masks.band import BandMask
from hiergraph.ops.edge_index import check_edge_index


def _check_count(name: str, value, minimum: int = 0) -> int:
    value = as_int(value, name)  # NumPy ints are ints
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


#: the largest id an int64 holds
_INT64_MAX = torch.iinfo(torch.long).max


def _canonical(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """Distinct edges ``[2, E]``, sorted by target and then by source."""
    if num_nodes * num_nodes > _INT64_MAX:  # the key below would overflow: sort the pairs
        return torch.unique(torch.stack([dst.long(), src.long()]), dim=1).flip(0)
    key = torch.unique(dst.long() * num_nodes + src.long())  # int64, for int32 inputs too
    return torch.stack([key % num_nodes, key // num_nodes])


def full_mask(n: int, self_loops: bool = True, *, device: Device = None) -> Tensor:
    r"""Self-attention: every query attends every key.

    Args:
        n (int): number of tokens, ``>= 0``.
        self_loops (bool, optional): include the diagonal (every query attends
            itself). (default: :obj:`True`)
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``, :math:`E = n^2` (:math:`n(n-1)` without
    self-loops).
    """
    band = BandMask((_check_count("n", n),), max(n - 1, 0), max(n - 1, 0))
    check_bool(self_loops, "self_loops")
    edge_index = band.edge_index(device)
    return edge_index if self_loops else edge_index[:, edge_index[0] != edge_index[1]]


def causal_mask(n: int, *, device: Device = None) -> Tensor:
    r"""Masked (autoregressive) attention: :math:`j \le i`, diagonal included.

    Args:
        n (int): number of tokens, ``>= 0``.
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``, :math:`E = n(n+1)/2`; every edge has
    ``source <= target``.
    """
    return BandMask((_check_count("n", n),), max(n - 1, 0), 0).edge_index(device)


def window_mask(n: int, p: int, causal: bool = False, *, device: Device = None) -> Tensor:
    r"""Sliding window of width :math:`p`: :math:`|i - j| \le p`, or
    :math:`i - p \le j \le i` when ``causal`` (the paper's "strided" attention,
    Def. 8, whose code's ``stride`` is :math:`p + 1`).

    Args:
        n (int): number of tokens, ``>= 0``.
        p (int): window width :math:`p \ge 0`: the keys on each side of a query
            (on its left only when :obj:`causal`); a width past ``n - 1`` is
            clamped to it.
        causal (bool, optional): keep only the keys :math:`i - p \le j \le i`.
            (default: :obj:`False`)
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``; with :math:`q = \min(p, n - 1)`:
    :math:`E = (2q+1)\,n - q(q+1)` (bidirectional),
    :math:`E = (q+1)\,n - q(q+1)/2` (causal).
    """
    _check_count("n", n)
    _check_count("p", p)
    check_bool(causal, "causal")
    return BandMask((n,), p, 0 if causal else p).edge_index(device)


def dilated_mask(
    n: int, p: int, dilation: int, causal: bool = False, *, device: Device = None
) -> Tensor:
    r"""Dilated (strided, Child et al.) window: :math:`j \equiv i \pmod s` and
    :math:`|i - j| \le p\,s` (:math:`0 \le i - j \le p\,s` when ``causal``).

    Args:
        n (int): number of tokens, ``>= 0``.
        p (int): window width :math:`p \ge 0`, in steps of :obj:`dilation`.
        dilation (int): the stride :math:`s \ge 1` between attended keys
            (:math:`s = 1` is :func:`window_mask`).
        causal (bool, optional): keep only the keys at or left of the query.
            (default: :obj:`False`)
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``. Each residue class :math:`r < s` is a
    plain window of width :math:`p` on :math:`n_r = \lceil (n - r)/s \rceil`
    positions, so :math:`E = \sum_{r} E_{\text{window}}(n_r, p)` with
    :math:`E_{\text{window}}` from :func:`window_mask`.
    """
    _check_count("n", n)
    _check_count("p", p)
    _check_count("dilation", dilation, 1)
    check_bool(causal, "causal")
    return BandMask((n,), p, 0 if causal else p, dilation).edge_index(device)


def block_diagonal_mask(sizes: Sequence[int], *, device: Device = None) -> Tensor:
    r"""Full attention inside consecutive blocks (segments) of the given sizes.

    Args:
        sizes (Sequence[int]): block sizes :math:`b_k \ge 0`, in order; the blocks
            cover the tokens ``0 .. sum(sizes) - 1``.
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``, :math:`E = \sum_k b_k^2`.
    """
    sizes = [_check_count("block size", b) for b in sizes]
    reach = max(sizes, default=1) - 1
    return BandMask(tuple(sizes), max(reach, 0), max(reach, 0)).edge_index(device)


def cross_mask(num_src: int, num_dst: int, joint: bool = True, *, device: Device = None) -> Tensor:
    r"""Encoder-decoder (cross) attention: every decoder query attends every
    encoder key, and nothing else.

    Args:
        num_src (int): number of encoder tokens (keys/values), ``>= 0``.
        num_dst (int): number of decoder tokens (queries), ``>= 0``.
        joint (bool, optional): with :obj:`True` both node sets share one index
            space: encoder nodes are ``0 .. num_src - 1``, decoder nodes
            ``num_src .. num_src + num_dst - 1`` (encoder rows get no incoming
            edge). With :obj:`False` the indices are bipartite (sources
            ``0 .. num_src - 1``, targets ``0 .. num_dst - 1``), for
            ``layer((x_src, x_dst), edge_index)``. (default: :obj:`True`)
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``, :math:`E = m\,n` with :math:`m` =
    ``num_src``, :math:`n` = ``num_dst``.
    """
    _check_count("num_src", num_src)
    _check_count("num_dst", num_dst)
    check_bool(joint, "joint")
    src = torch.arange(num_src, device=device).repeat(num_dst)
    dst = torch.arange(num_dst, device=device).repeat_interleave(num_src)
    return torch.stack([src, dst + num_src if joint else dst])


def global_tokens_mask(
    edge_index: Tensor, num_nodes: int, num_global: int, read_only: bool = False
) -> Tensor:
    r"""Add :math:`g` global tokens, numbered ``num_nodes .. num_nodes + g - 1``,
    to a base mask ``edge_index [2, E_base]`` over :math:`n` tokens.

    Global tokens attend each other and every token; every token attends them.

    Args:
        edge_index (torch.Tensor): the base mask ``[2, E_base]`` over the tokens
            ``0 .. num_nodes - 1`` (row 0 = key, row 1 = query); duplicates are
            removed.
        num_nodes (int): number of tokens :math:`n`, ``>= 0``.
        num_global (int): number of global tokens :math:`g`, ``>= 0``.
        read_only (bool, optional): with :obj:`True` the global tokens are
            *memory* tokens: every token attends them, but they attend only each
            other. (default: :obj:`False`)

    Returns ``[2, E]`` on ``edge_index``'s device,
    :math:`E = E_{\text{base}} + 2gn + g^2` (:math:`E_{\text{base}} + gn + g^2`
    when ``read_only``), :math:`E_{\text{base}}` counting distinct edges.
    """
    num_nodes = _check_count("num_nodes", num_nodes)
    num_global = _check_count("num_global", num_global)
    check_bool(read_only, "read_only")
    check_edge_index(edge_index, num_nodes)
    tokens = torch.arange(num_nodes, device=edge_index.device)
    glob = torch.arange(num_nodes, num_nodes + num_global, device=edge_index.device)
    pairs = [
        (edge_index[0], edge_index[1]),
        (glob.repeat(num_nodes), tokens.repeat_interleave(num_global)),  # tokens read globals
        (glob.repeat(num_global), glob.repeat_interleave(num_global)),  # globals read globals
    ]
    if not read_only:
        pairs.append((tokens.repeat(num_global), glob.repeat_interleave(num_nodes)))
    src, dst = (torch.cat(side) for side in zip(*pairs, strict=True))
    return _canonical(src, dst, num_nodes + num_global)


def random_mask(
    n: int, num_edges: int, seed: int = 0, self_loops: bool = True, *, device: Device = None
) -> Tensor:
    r"""Uniformly random sparse mask with exactly ``num_edges`` distinct edges.

    Args:
        n (int): number of tokens, ``>= 0``.
        num_edges (int): number of distinct edges, in :math:`[n, n^2]` with
            :obj:`self_loops`, in :math:`[0, n(n-1)]` without.
        seed (int, optional): seed of the draw, in ``[0, 2**64 - 1]``. The same
            ``seed`` gives the same mask, on every ``device``: the edges are drawn
            on the CPU and then moved. (default: :obj:`0`)
        self_loops (bool, optional): with :obj:`True` all :math:`n` self-loops
            are included (so no query is isolated) and the other
            ``num_edges - n`` edges are drawn uniformly without replacement among
            the :math:`n(n-1)` off-diagonal pairs; otherwise all ``num_edges`` are
            off-diagonal. (default: :obj:`True`)
        device (torch.device or str, optional): the device of the result.
            (default: :obj:`None`, PyTorch's default device)

    Returns ``[2, E]`` on ``device``, :math:`E` = ``num_edges``.

    Raises:
        ValueError: ``seed`` outside ``[0, 2**64 - 1]`` (the range of
            ``torch.Generator.manual_seed``; a negative seed is refused, not aliased), ``n``
            above 3,037,000,500 (pairs are numbered in int64) or ``num_edges`` outside
            its range: more than the pairs there are, or fewer than :math:`n` with
            ``self_loops``.
    """
    n = _check_count("n", n)
    num_edges = _check_count("num_edges", num_edges)
    seed = check_seed(seed)  # (2**64: an overflow in manual_seed)
    check_bool(self_loops, "self_loops")
    if n * (n - 1) > _INT64_MAX:  # (an overflow in randint)
        raise ValueError(
            f"n must be at most 3037000500 for random_mask (its n * (n - 1) off-diagonal "
            f"pairs are numbered in int64), got {n}"
        )
    loops = n if self_loops else 0
    if not loops <= num_edges <= loops + n * (n - 1):
        raise ValueError(
            f"num_edges must lie in [{loops}, {loops + n * (n - 1)}] for n = {n} "
            f"(self_loops={self_loops}), got {num_edges}"
        )
    cpu = torch.device("cpu")  # draw on the CPU: one seed, one mask, on every device
    generator = torch.Generator(cpu).manual_seed(seed)
    want, pairs = num_edges - loops, n * (n - 1)
    if pairs <= 4 * want + 1024:  # dense enough: shuffle all off-diagonal pair ids
        picked = torch.randperm(pairs, generator=generator, device=cpu)[:want]
    else:  # sparse: rejection sampling of pair ids, then a uniform subset
        picked = torch.empty(0, dtype=torch.long, device=cpu)
        while picked.numel() < want:
            size = (2 * (want - picked.numel()),)
            draw = torch.randint(pairs, size, generator=generator, device=cpu)
            picked = torch.unique(torch.cat([picked, draw]))
            picked = picked[torch.randperm(picked.numel(), generator=generator, device=cpu)[:want]]
    dst, rest = picked // max(n - 1, 1), picked % max(n - 1, 1)
    src = rest + (rest >= dst).long()  # skip the diagonal
    diag = torch.arange(loops, device=cpu)
    edge_index = _canonical(torch.cat([src, diag]), torch.cat([dst, diag]), n)
    return edge_index.to(torch.empty(0, device=device).device)  # None: the default device


def graph_mask(edge_index: Tensor, num_nodes: int, self_loops: bool = True) -> Tensor:
    r"""A given graph ``edge_index [2, E_in]`` (PyG direction: ``edge_index[0]``
    sends to ``edge_index[1]``) as a mask: duplicates removed, self-loops added
    (``self_loops=True``) or removed.

    Args:
        edge_index (torch.Tensor): the graph ``[2, E_in]`` over the nodes
            ``0 .. num_nodes - 1``.
        num_nodes (int): number of nodes :math:`n`, ``>= 0``.
        self_loops (bool, optional): with :obj:`True` every node gets its
            self-loop; with :obj:`False` the graph's self-loops are removed.
            (default: :obj:`True`)

    Returns ``[2, E]`` on ``edge_index``'s device,
    :math:`E = |\{\text{distinct non-loop edges}\}| + n` (without the :math:`n`
    when ``self_loops=False``).
    """
    num_nodes = _check_count("num_nodes", num_nodes)
    check_edge_index(edge_index, num_nodes)
    check_bool(self_loops, "self_loops")
    src, dst = edge_index[:, edge_index[0] != edge_index[1]]
    if self_loops:
        loop = torch.arange(num_nodes, device=edge_index.device)
        src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
    return _canonical(src, dst, num_nodes)


def sibling_mask(parent: Tensor, self_loops: bool = True) -> Tensor:
    r"""Family structure of a signal hierarchy: siblings attend siblings.

    Nodes :math:`i, j` are siblings iff they share a parent; roots have no
    family, so they attend only themselves (with ``self_loops``) and never each
    other, which keeps the trees of a batch apart.

    Args:
        parent (torch.Tensor): ``[num_nodes]`` integer parent of every node, in
            ``[-1, num_nodes)``; a root has ``parent = -1`` (or is its own parent,
            as in :class:`~hiergraph.data.SignalHierarchy`).
        self_loops (bool, optional): include the diagonal (every node attends
            itself). (default: :obj:`True`)

    Returns ``[2, E]`` on ``parent``'s device; with families of sizes
    :math:`b_f` and :math:`R` roots: :math:`E = \sum_f b_f^2 + R`
    (:math:`\sum_f b_f(b_f - 1)` without self-loops).
    """
    if not (isinstance(parent, Tensor) and holds_integers(parent)) or parent.dim() != 1:
        raise TypeError("parent must be a 1-D integer tensor [num_nodes] (-1 for roots)")
    check_bool(self_loops, "self_loops")
    parent, n = parent.long(), parent.numel()  # (int32 ids too, as every edge input takes)
    if parent.numel() and (parent.min() < -1 or parent.max() >= n):
        raise ValueError(
            f"parent ids must lie in [-1, {n}), got [{int(parent.min())}, {int(parent.max())}]"
        )
    node = torch.arange(n, device=parent.device)
    family = torch.where((parent < 0) | (parent == node), -1 - node, parent)  # roots: own family
    order = torch.argsort(family, stable=True)
    sizes = torch.unique_consecutive(family[order], return_counts=True)[1]
    src_rank, dst_rank = block_diagonal_mask(sizes.tolist(), device=parent.device)
    src, dst = order[src_rank], order[dst_rank]
    keep = (src != dst) | self_loops
    return _canonical(src[keep], dst[keep], n)
