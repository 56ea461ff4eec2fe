r"""HSA over a tree whose hub leaves hang under the root, on the original tree's plan.

:func:`~hiergraph.data.restructure.lift_leaves` moves chosen leaves ("hubs",
:mod:`~hiergraph.ops.hsa.hubs`) under their tree's root, in a position-free slot. The
result is a ragged tree with a plan of its own; but its HSA splits at the root, since the
top-down pass starts with all the mass there. The root's children are the original *top
nodes* :math:`W` (with the hubs below them removed) and the hubs :math:`j`, and

.. math::
    o_i = (1 - \mu_W)\,\vartheta_W + \mu_W\, o_i^{W}, \qquad
    o_j = (1 - \mu_j)\,\vartheta_j + \mu_j\, v_j, \qquad
    \mu_C = \frac{e^{a(C)}}{e^{a(C)} + e^{\mathrm{lse}(C)}},

for a leaf :math:`i` below :math:`W`, where :math:`o^W` is HSA inside :math:`W` alone
(unit mass at :math:`W`), :math:`a` the energies, and :math:`\mathrm{lse}`,
:math:`\vartheta` the root family's: its members' pooled queries, keys and values with the
:math:`\log n` key bias (:func:`root_family`; a hub has no position embedding,
:math:`\varepsilon_j = 0`, and the self energy :math:`a(j) = \tau\, q_j^\top k_j`).

Removing a leaf from below :math:`W` is masking it: a masked leaf is dropped from every
statistic, and a node left without leaves from every key set, as if it were removed. So on
an equal-fanout forest ``(B, b_1, …, b_D)`` (:attr:`TreeIndex.uniform`) the sub-trees of
the top nodes form the equal-fanout forest ``(B b_1, b_2, …, b_D)``, which
:func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` runs with the hubs masked.
Between its two passes, one batched family per tree (its ``b_1`` top nodes, from their
energies and pooled rows, and its hub slots) gives the hubs' outputs and what reaches every
top node, :math:`\log \mu_W` and :math:`(1 - \mu_W)\,\vartheta_W`, where the top-down
pass starts (``above``): the combination costs no pass of its own. A forest embedded in
an equal-fanout one (:attr:`TreeIndex.padded`, e.g. window trees of different lengths)
runs on that embedding, whose padding slots are masked leaves
(:mod:`~hiergraph.ops.hsa.padded`). Any other forest runs on its own levels
(:func:`~hiergraph.ops.hsa.attention.general_attention`), the same family per tree taking
the place of the roots' families. No tree is built and nothing is read on the host.
:mod:`hiergraph.integrations.hub_windows` shares the root family.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._precision import accumulation_dtype, widened
from hiergraph.ops.hsa.attention import general_attention
from hiergraph.ops.hsa.family_products import family_gram, fill_diagonal
from hiergraph.ops.hsa.heads_first import heads_first, per_depth, tie_leaves
from hiergraph.ops.hsa.inputs import check_inputs, check_leaf_flags, logit_scale
from hiergraph.ops.hsa.padded import on_slots, slot_mask
from hiergraph.ops.hsa.uniform import fits, uniform_hierarchical_attention
from hiergraph.ops.logspace import log_gates
from hiergraph.plan.tree_index import TreeIndex


def runs_lifted(index: TreeIndex) -> bool:
    """Whether :func:`lifted_attention` runs the forest ``index``: some node below a root (a
    forest of single leaves has no root family to lift a leaf into)."""
    return index.num_levels > 1


def _as_views(index: TreeIndex, q: Tensor) -> tuple[int, ...] | None:
    """The equal-fanout forest ``(B, b_1, …, b_D)`` that :func:`_lifted` runs as reshaped
    views: ``index`` itself, or its embedding (:attr:`TreeIndex.padded`, with every tree's
    top nodes at depth 1: none sunk below a chain, whose root family would be the chain's),
    with leaves at depth 2 or more and families within the blocks' size limit; ``None``:
    the levels of ``index`` run as they are (:func:`_lifted_general`)."""
    padded = index.padded_on(q.device, extended=False)  # hubs: no cost model off the CPU
    if index.uniform is not None:
        shape = index.uniform
    elif padded is not None and not padded.sunk:
        shape = padded.shape
    else:
        return None
    return shape if len(shape) > 2 and fits(shape, q) else None


def lifted_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    index: TreeIndex,
    lifted: Tensor,
    slots: int,
    *,
    pos_emb: Tensor | None,
    include_self: bool,
    leaf_mask: Tensor | None,
    scale: float | None = None,
    size_bias: bool = True,
    kernel: str = "dense",
) -> Tensor:
    r""":func:`~hiergraph.ops.hierarchical_attention` over ``lift_leaves(hierarchy,
    lifted)``, computed on the forest ``index`` itself, or on its equal-fanout embedding
    (:mod:`~hiergraph.ops.hsa.padded`; see the module docstring and :func:`runs_lifted`).

    Args:
        q, k: ``[L, H, d]`` leaf queries and keys, in leaf order.
        v: ``[L, H, d_v]``.
        index: the plan of the forest before lifting.
        lifted: ``[L]`` bool, the hubs: at most ``slots`` per tree, none masked.
        slots: hub slots per tree, at least the number of hubs of any tree (the caller's
            bound: the count is not read on the host).
        pos_emb: optional ``[N, c]`` or ``[N, H | 1, c]`` embeddings of the forest's
            nodes; hubs get none (:math:`\varepsilon_j = 0`).
        include_self, leaf_mask, scale, size_bias, kernel: as in
            :func:`~hiergraph.ops.hierarchical_attention` (the forest's levels, not reshaped
            views, with ``"blocks"`` or ``"edge"``).

    Returns:
        ``[L, H, d_v]``, zero at masked leaves.
    """
    pos = check_inputs(q, k, v, index, pos_emb, leaf_mask)
    check_leaf_flags(lifted, "lifted", "hub", index.num_leaves, q)
    options = dict(include_self=include_self, tau=logit_scale(scale, q), size_bias=size_bias)
    shape = _as_views(index, q) if kernel == "dense" else None
    if shape is None:  # the general path: bf16/fp16 in float32, as hierarchical_attention's
        out = _lifted_general(
            *widened(q, k, v), index, *widened(pos), lifted, slots, leaf_mask, kernel=kernel,
            **options,
        )  # fmt: skip
        return out.to(q.dtype)
    if index.uniform is not None:
        eps = None if pos is None else per_depth(pos, index)
        return _lifted(q, k, v, index.uniform, eps, lifted, slots, leaf_mask, **options)
    forest = index.padded_on(q.device, extended=False)
    return on_slots(
        _lifted, q, k, v, index, forest, pos, lifted=slot_mask(forest, lifted), slots=slots,
        leaf_mask=slot_mask(forest, leaf_mask), **options,
    )  # fmt: skip


def _lifted(q, k, v, shape, eps, lifted, slots, leaf_mask, *, include_self, tau, size_bias):
    """:func:`lifted_attention` on the leaf rows ``[L, H, ·]`` of the equal-fanout forest
    ``shape`` = ``(B, b_1, …, b_D)``, with position embeddings per depth (``eps``, as
    :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` takes them) and the
    hubs ``lifted`` and ``leaf_mask`` ``[L]`` over its leaves."""
    tie_leaves(shape, q, k, v, lifted, leaf_mask)
    trees, top = shape[0], shape[1]
    length, heads = q.shape[:2]
    per_tree = length // trees
    slots = per_tree if slots > per_tree else slots  # (a guard, not a symbolic min)
    # every tree's hubs first, in leaf order: [B, slots] rows, and which slots hold one
    marks = lifted.view(trees, per_tree)
    local = torch.sort((~marks).to(torch.uint8), dim=1, stable=True).indices[:, :slots]
    hub_real = marks.gather(1, local)
    hub_row = (local + per_tree * torch.arange(trees, device=q.device)[:, None]).view(-1)
    keep = ~lifted if leaf_mask is None else leaf_mask & ~lifted
    hub_rows = [heads_first(t.index_select(0, hub_row)) for t in (q, k, v)]
    sizes = torch.cat([keep.view(trees, top, -1).sum(-1), hub_real], 1)
    hubs = {}

    def above(energy: Tensor, pooled: list[Tensor]) -> tuple[Tensor, Tensor]:
        # a tree with at most one valid leaf has a member without keys
        log_mu, down, hubs["out"] = hub_family(
            energy, pooled, hub_rows, sizes, tau=tau, size_bias=size_bias,
            include_self=include_self, lonely=leaf_mask is not None,
            top_eps=None if eps is None else eps[0],
        )  # fmt: skip
        return log_mu, down

    # a top node's leaves: (1 - mu) theta of the node plus mu times HSA inside it, which
    # the top-down pass below the top nodes starts from
    out = uniform_hierarchical_attention(
        q, k, v, (trees * top, *shape[2:]), None if eps is None else eps[1:],
        include_self=include_self, left_only=False, leaf_mask=keep, tau=tau,
        size_bias=size_bias, above=above,
    )  # fmt: skip
    # the hubs' rows (zero so far: masked below); a slot without a hub writes its row back.
    # Without gradients bf16/fp16 passes run in float32, and so does the hubs' family
    hub_out = hubs["out"].flatten(1, 2).transpose(0, 1).to(out.dtype)  # [B * slots, H, d_v]
    hub_out = torch.where(hub_real.view(-1, 1, 1), hub_out, out.index_select(0, hub_row))
    return out.index_copy(0, hub_row, hub_out)


def _lifted_general(q, k, v, index, pos, lifted, slots, leaf_mask, *, include_self, tau,
                    size_bias, kernel):  # fmt: skip
    """:func:`lifted_attention` on the levels of any forest ``index`` (``pos``: its
    embeddings ``[N, H | 1, c]``): :func:`~hiergraph.ops.hsa.attention.general_attention`
    with the hubs masked, whose roots' families the family of every tree's top nodes and
    hub slots replaces (between its passes, :func:`hub_family`). The top nodes of a tree
    take slots ``[W]`` (``W`` the widest padded family of level 1, a width the plan holds
    on the host) and its hubs ``[slots]``, in leaf order; empty slots are no members."""
    length, trees, top = q.size(0), index.level_ptr[1], index.levels[1]
    width = max(block.width for block in top.blocks)
    at = torch.arange(top.size, device=q.device)
    first = at.new_full((trees,), top.size).scatter_reduce_(0, top.parent_local, at, "amin")
    top_slot = top.parent_local * width + at - first.index_select(0, top.parent_local)
    # every tree's hubs in leaf order, as rows of [B * slots] (one more: where the others go)
    tree = torch.where(lifted, index.node_tree.index_select(0, index.leaf_node), trees)
    leaves = torch.arange(length, device=q.device)
    order = (tree * length + leaves).argsort()  # the hubs tree by tree, then the others
    per_tree = torch.zeros(trees + 1, dtype=torch.long, device=q.device)
    per_tree.index_add_(0, tree, torch.ones_like(tree))
    hub_tree = tree.index_select(0, order)
    rank = leaves - (per_tree.cumsum(0) - per_tree).index_select(0, hub_tree)
    real = (hub_tree < trees) & (rank < slots)
    target = torch.where(real, hub_tree * slots + rank, trees * slots)
    hub_row = leaves.new_zeros(trees * slots + 1).scatter_(0, target, order)[:-1]
    hub_real = real.new_zeros(trees * slots + 1).scatter_(0, target, real)[:-1]
    hub_rows = [heads_first(t.index_select(0, hub_row)) for t in (q, k, v)]
    keep = ~lifted if leaf_mask is None else leaf_mask & ~lifted
    hubs = {}

    def slotted(x: Tensor) -> Tensor:
        """Rows ``[n_1, ...]`` of the top nodes in their slots ``[B W, ...]`` (empty: 0)."""
        return x.new_zeros(trees * width, *x.shape[1:]).index_copy(0, top_slot, x)

    def above(energy: Tensor | None, rows: list[Tensor], counts: Tensor, top_pos: Tensor | None):
        if energy is None:  # leaves without self energy
            energy = rows[0].new_full(rows[0].shape[:2], float("-inf"))
        sizes = torch.cat(
            [slotted(counts).view(trees, width), hub_real.view(trees, slots).to(counts.dtype)], 1
        )
        top_eps = None if top_pos is None else heads_first(slotted(top_pos))
        log_mu, down, hubs["out"] = hub_family(
            heads_first(slotted(energy)), [heads_first(slotted(t)) for t in rows], hub_rows,
            sizes, tau=tau, size_bias=size_bias, include_self=include_self, lonely=True,
            top_eps=top_eps,
        )  # fmt: skip
        return log_mu.index_select(1, top_slot).T, down.index_select(1, top_slot).transpose(0, 1)

    out = general_attention(
        q, k, v, index, pos, include_self=include_self, left_only=False, leaf_mask=keep,
        tau=tau, size_bias=size_bias, kernel=kernel, above=above,
    )  # fmt: skip
    # the hubs' rows (zero so far: masked); an empty slot writes to a row past the end
    hub_out = hubs["out"].flatten(1, 2).transpose(0, 1)  # [B * slots, H, d_v]
    written = torch.cat([out, out.new_zeros(1, *out.shape[1:])])
    return written.index_copy(0, torch.where(hub_real, hub_row, length), hub_out)[:length]


def hub_family(
    energy: Tensor,
    pooled: list[Tensor],
    hub_rows: list[Tensor],
    sizes: Tensor,
    *,
    tau: float,
    size_bias: bool,
    include_self: bool,
    lonely: bool,
    top_eps: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The root family of every tree over its ``W`` top nodes and ``G`` hub slots, between
    the passes of :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` (its
    ``above``): :math:`\log \mu` ``[H, B W]`` and :math:`(1 - \mu)\,\vartheta`
    ``[H, B W, d_v]`` of the top nodes, where the top-down pass below them starts, and the
    hubs' outputs :math:`(1 - \mu_j)\,\vartheta_j + \mu_j v_j` ``[H, B, G, d_v]``.

    Args:
        energy, pooled: the top nodes' energies ``[H, B W]`` and pooled ``[q, k, v]``.
        hub_rows: the hubs' ``[q, k, v]`` rows ``[H, B G, ·]``.
        sizes: ``[B, W + G]`` leaf counts of the members (0: not a member).
        tau, size_bias, lonely: as in :func:`root_family`; ``include_self``: the hubs'
            self energies (else ``-inf``).
        top_eps: optional position embeddings of the top nodes ``[H | 1, B W, c]`` (the
            hubs have none).
    """
    trees = sizes.size(0)
    members = [join(w, h, trees) for w, h in zip(pooled, hub_rows, strict=True)]
    energy = join(energy, self_energy(*hub_rows[:2], tau, include_self), trees)
    eps = None
    if top_eps is not None:
        hub_eps = top_eps.new_zeros(top_eps.size(0), hub_rows[0].size(1), top_eps.size(-1))
        eps = join(top_eps, hub_eps, trees)
    sizes = sizes.to(accumulation_dtype(energy.dtype))
    down, log_mu = root_family(*members, energy, sizes, tau, size_bias, lonely, eps)
    top = pooled[0].size(1) // trees
    hubs = torch.addcmul(
        down[:, :, top:], torch.exp(log_mu[:, :, top:, None]), members[2][:, :, top:]
    )
    return log_mu[:, :, :top].flatten(1), down[:, :, :top].flatten(1, 2), hubs


def root_family(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    energy: Tensor,
    sizes: Tensor,
    scale: float,
    size_bias: bool,
    lonely: bool,
    eps: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""``(1 - mu) theta`` ``[H, B, M, d_v]`` and ``log mu`` ``[H, B, M]`` of the root family of
    every tree: members ``q, k [H, B, M, d]``, ``v [H, B, M, d_v]``, energies ``[H, B, M]``,
    leaf counts ``sizes`` ``[B, M]`` (0: not a member) and optional position embeddings
    ``eps [H | 1, B, M, c]``. ``lonely``: some tree may have a single member, whose row of
    logits then has no key (``lse = -inf``, ``theta = 0``).

    The logits :math:`\tau q_C^\top k_B + \varepsilon_C^\top\varepsilon_B` take the key
    bias (``log n``, ``-inf`` for non-members) and the ``-inf`` diagonal in place;
    ``theta`` is scaled after the product (``d_v`` values per row, not ``M`` weights)."""
    bias = torch.log(sizes.clamp(min=1)) if size_bias else torch.zeros_like(sizes)
    logits = family_gram(q, k, scale).add_(bias.masked_fill(sizes <= 0, float("-inf"))[:, None])
    if eps is not None:
        logits = logits + family_gram(eps, eps)
    logits = fill_diagonal(logits, float("-inf"))
    keyless = torch.isneginf(logits).all(-1, keepdim=True) if lonely else None
    if keyless is not None:  # a row of zeros instead: finite weights and gradients there
        logits = logits.masked_fill(keyless, 0.0)
    # lse = max - log(max p): the largest weight is at least 1 / M, and two reductions over
    # the weights cost less than log-sum-exp's own pass of exponentials
    p = torch.softmax(logits, -1)
    lse = logits.amax(-1, keepdim=True) - torch.log(p.amax(-1, keepdim=True))
    if keyless is not None:
        lse, p = lse.masked_fill(keyless, float("-inf")), p.masked_fill(keyless, 0.0)
    log_keep, log_down = log_gates(energy, lse.squeeze(-1))
    return torch.matmul(p, v) * torch.exp(log_down).unsqueeze(-1), log_keep


def self_energy(q: Tensor, k: Tensor, scale: float, include_self: bool) -> Tensor:
    """``[H, n]`` self energies ``scale * q_i . k_i`` of leaf rows ``[H, n, d]`` (``-inf``
    without ``include_self``)."""
    energy = (q * k).sum(-1) * scale
    return energy if include_self else torch.full_like(energy, float("-inf"))


def join(nodes: Tensor, hubs: Tensor, count: int) -> Tensor:
    """Top-node rows ``[H, count * W, ·]`` and hub rows ``[H, count * G, ·]`` as one family
    per tree, ``[H, count, W + G, ·]``."""
    return torch.cat([nodes.unflatten(1, (count, -1)), hubs.unflatten(1, (count, -1))], 2)
