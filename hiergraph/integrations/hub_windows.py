r"""HSA over hub window trees, computed on the padded batch ``[B, H, T, d]``.

:func:`padded_hub_window_hsa` returns what :func:`~hiergraph.integrations.padded_hsa` returns
over :func:`~hiergraph.integrations.hub_window_hierarchies` with the hubs
:func:`~hiergraph.integrations.select_hubs` picks, without building a tree per batch: the
trees' shapes follow from the examples' lengths alone.

An example's hub tree splits at its root, whose children are the example's hubs (single
leaves) and its *top windows*: the window trees over its other tokens, cut one level below
the root, each over :math:`s = b_1 \cdots b_{h-1}` consecutive tokens (the last one
partial), where :math:`h` is the height of the window tree of those tokens (single tokens
when :math:`h \le 1`: the root is then one flat family over all tokens). HSA's top-down
pass starts with all mass at the root, so a leaf :math:`i` under the top window :math:`W`
receives

.. math::
    o_i = (1 - \mu_W)\,\vartheta_W + \mu_W\, o_i^{W},
    \qquad \mu_W = \frac{e^{a(W)}}{e^{a(W)} + e^{\mathrm{lse}(W)}},

where :math:`\mathrm{lse}(W)` and :math:`\vartheta_W` are the root family's (over its
members' pooled queries, keys and values, with the :math:`\log n` key bias) and
:math:`o^{W}_i` is HSA over the tree :math:`W` alone, with unit mass at its root
(:func:`~hiergraph.ops.hierarchical_attention` for the notation). A hub :math:`j`, a leaf
with the self energy :math:`a(j) = \tau\, q_j^\top k_j` (``include_self``), receives
:math:`(1 - \mu_j)\,\vartheta_j + \mu_j\, v_j`.

The top windows of all examples whose trees have the same height form one equal-fanout
forest once each example's other tokens are moved to the front, in order, and padded to
the same number of windows:
:func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention` runs it as reshaped views,
and between its passes the root family (from the windows' energies :math:`a(W)` and pooled
rows, and the hubs) sets what its top-down pass starts from, as in
:mod:`hiergraph.ops.hsa.lifted`. A batch whose examples' trees differ in height runs one
such forest per height.

On the CPU without gradients (inference, the zero-shot case), the compiled kernel
(:func:`~hiergraph.ops.hsa.native.hub_tree_attention`) runs each example's whole tree, its
top windows and its root family with the hubs, as one task per example and head, reading
the tokens' rows where the projections wrote them and writing the outputs in place: no
token is gathered into tree order or scattered back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from hiergraph.data.windows import check_branching
from hiergraph.integrations.hubs import checked_hub_scores, lifted_tokens
from hiergraph.integrations.padded_attention import check_padded, empty_output
from hiergraph.nn._checks import check_int
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.heads_first import heads_first, transposed
from hiergraph.ops.hsa.lifted import hub_family, self_energy
from hiergraph.ops.hsa.uniform import uniform_hierarchical_attention


def padded_hub_window_hsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    token_mask: Tensor,
    branching: Sequence[int],
    hubs: int,
    *,
    include_self: bool = True,
    size_bias: bool = True,
    scale: float | None = None,
) -> Tensor:
    r""":func:`~hiergraph.integrations.padded_hsa` over
    :func:`~hiergraph.integrations.hub_window_hierarchies`: every example's ``hubs`` keys
    with the highest root-level score (:func:`~hiergraph.integrations.hub_scores`) hang
    under the root, windows of ``branching`` cover its other tokens. The same result,
    computed on the padded batch (see the module docstring).

    Args:
        q (torch.Tensor): queries ``[B, H, T, d]``.
        k (torch.Tensor): keys ``[B, H, T, d]``.
        v (torch.Tensor): values ``[B, H, T, d_v]``.
        token_mask (torch.Tensor): ``[B, T]`` bool, ``True`` for real tokens.
        branching (Sequence[int]): bottom-up window sizes, each ``>= 2``.
        hubs (int): hubs per example (at most ``n - 1`` of its ``n`` tokens).
        include_self, size_bias, scale: as in :func:`~hiergraph.integrations.padded_hsa`.

    Returns:
        ``[B, T, H, d_v]``, zero at padding tokens.
    """
    check_padded(q, k, v, token_mask)
    branching = check_branching(branching)
    check_int(hubs, "hubs", minimum=0)
    if not q.numel():  # no example, head or token: the (empty) output
        return empty_output(q, v)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    lifted = lifted_tokens(checked_hub_scores(q, k, token_mask, scale), token_mask, hubs)
    options = dict(include_self=include_self, size_bias=size_bias, scale=scale)
    return hub_window_attention(q, k, v, token_mask, lifted, branching, **options)


def hub_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    token_mask: Tensor,
    lifted: Tensor,
    branching: tuple[int, ...],
    *,
    include_self: bool,
    size_bias: bool,
    scale: float,
) -> Tensor:
    """HSA over the hub window trees of the given hubs (``lifted``: ``[B, T]`` bool, at
    most ``n - 1`` of an example's ``n`` valid tokens); otherwise as
    :func:`padded_hub_window_hsa`."""
    batch, heads, length, _ = q.shape
    hub_count = (lifted & token_mask).sum(1)
    # one host read: the trees' shapes (per example, the tokens that are not hubs, and hubs)
    others, num_hubs = torch.stack([token_mask.sum(1) - hub_count, hub_count]).tolist()
    # every example's tokens in tree order: the others in order, its hubs, the padding
    order = torch.sort(torch.where(token_mask, lifted.long(), 2), dim=1, stable=True).indices
    rows = [t.transpose(1, 2).reshape(batch * length, heads, -1) for t in (q, k, v)]
    heights: dict[int, list[int]] = {}
    for b, n in enumerate(others):
        if n > 0:
            heights.setdefault(_height(n, branching), []).append(b)
    # the output rows, and one more that every padding slot writes to
    out = rows[2].new_zeros(batch * length + 1, heads, rows[2].size(-1))
    options = dict(include_self=include_self, size_bias=size_bias, scale=scale)
    for height, examples in heights.items():
        width = math.prod(branching[: max(height - 1, 0)])  # tokens per top window
        slots = _slots(order, examples, others, num_hubs, width)
        if width > 1 and native.applies_to_hub_trees(*rows, len(examples)):
            # the whole trees in the kernel, which reads and writes the tokens' rows in place
            leaf_rows, hub_rows = (t.masked_fill(~real, -1) for t, real in slots)
            fanout = (leaf_rows.size(1) // width, *reversed(branching[: height - 1]))
            native.hub_tree_attention(*rows, leaf_rows, hub_rows, fanout, out, **options)
            continue
        # a tree of one token and no hub: its root family has a single member
        lonely = height == 0 and any(others[b] + num_hubs[b] == 1 for b in examples)
        for result, token in _root_split(rows, slots, height, branching, lonely, **options):
            out.index_copy_(0, token.view(-1), result.flatten(1, -2).transpose(0, 1))
    return out[:-1].view(batch, length, heads, -1)


def _height(n: int, branching: tuple[int, ...]) -> int:
    """Levels of windows :func:`~hiergraph.data.window_hierarchy` cuts over ``n`` tokens
    (``0`` for one token; after the tuple, one root over what is left)."""
    height = 0
    while n > 1:
        n = -(-n // branching[height]) if height < len(branching) else 1
        height += 1
    return height


def _slots(
    order: Tensor, examples: list[int], others: list[int], num_hubs: list[int], width: int
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The rows in the batch of the tokens of the examples ``examples``' top windows of
    ``width`` tokens (the others, padded to the most windows ``W``), ``[B', W * width]``,
    and of their hubs, ``[B', G]``, each with whether the slot holds a token (a padding
    slot points at some token of the batch)."""
    length, device = order.size(1), order.device
    n = torch.as_tensor([others[b] for b in examples], device=device)
    g = torch.as_tensor([num_hubs[b] for b in examples], device=device)
    windows = max(-(-others[b] // width) for b in examples)
    hubs = max(num_hubs[b] for b in examples)
    index = torch.as_tensor(examples, device=device)
    order = order[index]
    at = torch.arange(windows * width, device=device)
    real = at < n[:, None]  # [count, slots]
    start = (index * length)[:, None]
    token = order.gather(1, at.clamp(max=length - 1).expand(len(examples), -1)) + start
    hub_at = n[:, None] + torch.arange(hubs, device=device)
    hub_real = hub_at < (n + g)[:, None]  # [count, hubs]
    hub_token = order.gather(1, hub_at.clamp(max=length - 1)) + start
    return (token, real), (hub_token, hub_real)


def _root_split(
    rows, slots, height, branching, lonely, *, include_self, size_bias, scale
) -> tuple[tuple[Tensor, Tensor], ...]:
    """The outputs of the examples whose tokens' rows ``slots`` (:func:`_slots`) picks,
    whose trees have height ``height``: of their top windows' tokens ``[H, B', W, s, d_v]``
    and of their hubs ``[H, B', G, d_v]``, each with its tokens' rows in the batch
    (``[B', W, s]`` and ``[B', G]``; padding slots: the row after the last). ``lonely``:
    some tree's root family has a single member (:func:`~hiergraph.ops.hsa.lifted.root_family`)."""
    (token, real), (hub_token, hub_real) = slots
    width = math.prod(branching[: max(height - 1, 0)])  # tokens per top window
    count, windows, dump = token.size(0), token.size(1) // width, rows[0].size(0)
    weight = real.view(-1, 1, 1)
    leaves = [transposed(t.index_select(0, token.view(-1)), weight) for t in rows]
    hub_rows = [heads_first(t.index_select(0, hub_token.view(-1))) for t in rows]

    sizes = torch.cat([real.view(count, windows, width).sum(-1), hub_real], 1)  # [count, M]
    options = dict(tau=scale, size_bias=size_bias, include_self=include_self, lonely=lonely)
    hubs_out = {}

    def above(energy: Tensor, pooled: list[Tensor]) -> tuple[Tensor, Tensor]:
        log_mu, down, hubs_out["rows"] = hub_family(energy, pooled, hub_rows, sizes, **options)
        return log_mu, down

    # a window's leaves: (1 - mu) theta of the window plus mu times HSA inside it
    if width > 1:  # HSA inside every top window, from what reaches it
        shape = (count * windows, *reversed(branching[: height - 1]))
        out_windows = uniform_hierarchical_attention(
            *(t.transpose(0, 1) for t in leaves), shape, None, include_self=include_self,
            left_only=False, leaf_mask=real.view(-1), tau=scale, size_bias=size_bias,
            padding=True, above=above,
        ).transpose(0, 1)  # fmt: skip
    else:  # the top windows are the tokens themselves
        log_mu, down = above(self_energy(leaves[0], leaves[1], scale, include_self), leaves)
        out_windows = torch.addcmul(down, torch.exp(log_mu).unsqueeze(-1), leaves[2])
    out_windows = out_windows.unflatten(1, (count, windows, width))
    out_hubs = hubs_out["rows"].to(rows[0].dtype)  # float32 where the passes run in it
    return (
        (out_windows, token.masked_fill(~real, dump).view(count, windows, width)),
        (out_hubs, hub_token.masked_fill(~hub_real, dump)),
    )
