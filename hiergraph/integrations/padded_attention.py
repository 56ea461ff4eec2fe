r"""Zero-shot attention replacements on padded batches ``[B, H, T, d]``, as transformers lay
them out: HSA over one hierarchy per example and its two same-FLOPs baselines.

* :func:`padded_hsa`: Hierarchical Self-Attention (Amizadeh et al., Sec. 4.3) over
  the valid tokens of every example, reusing the layer's per-head :math:`q, k, v`
  with :math:`\varepsilon = 0` (positions are already inside :math:`q, k`)
  and, by default, the include-self leaf energy (the self energy of App. G.1)
  that BERT's diagonal-including softmax needs. ``size_bias=False`` drops the
  :math:`\log n(B)` term of the sibling logits, so every sibling sub-tree counts
  as one token: an ablation, no longer the KL projection of Thm. 3.2.
* :func:`padded_window_hsa`: the same over window hierarchies, computed on the padded
  batch with the padding as masked leaves (no per-batch gather or tree).
* :func:`padded_block_attention`: softmax attention inside non-overlapping
  blocks of valid tokens (local attention, no long-range path).

Masks: a transformers layer receives an ``attention_mask`` (1 or ``True`` =
attend, or additive); :func:`valid_token_mask` turns it into the ``[B, T]``
bool ``token_mask`` the functions here take, ``True`` = real token. Padding
tokens (``token_mask`` ``False``) are removed before either runs: they are
neither keys nor counted in any statistic, and their output rows are 0. Their rows of
``q, k, v`` may hold any finite values (a NaN or inf there reaches the outputs, as in
:func:`torch.nn.functional.scaled_dot_product_attention`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_int, check_qkv_like
from hiergraph._deprecation import renamed_arguments
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.data.windows import window_forest
from hiergraph.nn.pool import leaf_batch
from hiergraph.ops.hsa.attention import hierarchical_attention

if TYPE_CHECKING:
    from torch_geometric.data import Batch

ADDITIVE_MASKED = -50.0
"""Additive mask entries at or below this value mask their key (:func:`valid_token_mask`)."""


def valid_token_mask(attention_mask: Tensor | None, batch: int, length: int) -> Tensor:
    r"""The ``token_mask`` ``[B, T]`` bool, ``True`` for real tokens (the keys every
    query may attend to), from the ``attention_mask`` a transformers attention layer
    receives (Hugging Face's convention: 1 or ``True`` = attend).

    Accepts ``None`` (no padding), ``[B, T]`` 0/1 masks, and 4-D masks
    ``[B, 1 or H, 1 or T, T]``: boolean (``True`` = attend) or additive float,
    whose entries are added to the logits: exactly 0 = attend, and any value
    :math:`\le` :data:`ADDITIVE_MASKED` (:math:`-50`) = masked, which covers the
    conventions in use (``-inf``, ``finfo(dtype).min``, BERT's ``-10000``,
    ``-1e4``, ``-1e9``). An entry :math:`m` scales a key's softmax weight by
    :math:`e^{m}`; at :math:`m \le -50` that is below :math:`2 \cdot 10^{-22}`,
    under the resolution of every float dtype, so the key is masked in the
    original softmax too. Entries in between (soft biases) cannot be honoured
    and raise. HSA needs a *key padding* mask: every valid query of an example,
    in every head, must see the same keys.

    Args:
        attention_mask (torch.Tensor, optional): the layer's mask (see above).
        batch (int): the batch size :math:`B`.
        length (int): the sequence length :math:`T`.

    Raises:
        ValueError: for any other shape, a ``[B, T]`` mask with entries other than 0
            and 1, an additive mask with entries that are neither 0 nor :math:`\le -50`,
            or a mask that differs between the
            queries or the heads of an example (causal, per-head or custom
            masks).
    """
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool)
    mask = attention_mask
    no = mask.new_zeros((), dtype=torch.bool)
    soft = no  # additive entries that are neither 0 nor masked (NaN included)
    not_binary = no  # entries of a [B, T] mask that are neither 0 nor 1
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.dim() == 4 and mask.is_floating_point():  # additive: 0 or a large negative
        allowed = mask == 0
        soft = ~(allowed | (mask <= ADDITIVE_MASKED))
    else:  # [B, T] 0/1
        allowed = mask > 0
        not_binary = (mask != 0) & (mask != 1)
    if allowed.dim() == 2:
        allowed = allowed[:, None, None, :]
    if allowed.dim() != 4 or allowed.size(0) != batch or allowed.size(-1) != length:
        raise ValueError(
            f"expected an attention mask [B={batch}, T={length}] or [B, 1|H, 1|T, T], got "
            f"shape {tuple(mask.shape)}"
        )
    token_mask = allowed.any(dim=2).any(dim=1)
    differs = no  # entries where a query or head sees other keys than the example's
    if allowed.size(1) > 1 or allowed.size(2) > 1:
        differs = allowed != token_mask[:, None, None, :]  # [B, 1|H, 1|T, T]
        if allowed.size(2) > 1:  # rows of padding queries are free
            differs = differs & token_mask[:, None, :, None]
    checks = torch.stack([not_binary.any(), soft.any(), differs.any()])
    any_not_binary, any_soft, any_differs = checks.tolist()  # one host read
    if any_not_binary:
        raise ValueError(
            f"a [B, T] attention mask holds 1 (attend) and 0 (padding); got "
            f"{mask[not_binary][:5].tolist()} (an additive mask is 4-D: [B, 1|H, 1|T, T])"
        )
    if any_soft:
        raise ValueError(
            f"an additive attention mask may hold only 0 (attend) and values <= "
            f"{ADDITIVE_MASKED:g} (masked, e.g. -inf, finfo.min, -10000); got "
            f"{mask[soft][:5].tolist()}: HSA cannot honour soft attention biases"
        )
    if any_differs:
        raise ValueError(
            "HSA replaces attention under a key padding mask only (every query of an "
            "example, in every head, attends to the same keys); this mask differs between "
            "queries or heads (causal, per-head or custom). Use HSA on encoder layers with "
            "padding masks, or the causal HSA op."
        )
    return token_mask


def window_hierarchies(lengths: Sequence[int], branching: Sequence[int]) -> SignalHierarchy:
    """One forest of :func:`~hiergraph.data.window_hierarchy` trees, one per non-empty
    example, built in one vectorised step (:func:`~hiergraph.data.windows.window_forest`).

    Args:
        lengths (Sequence[int]): valid tokens per example, ``>= 0``; an example
            without any gets no tree, and at least one must have some.
        branching (Sequence[int]): bottom-up window sizes, each ``>= 2``.
    """
    return window_forest(nonempty_lengths(lengths), branching)


def nonempty_lengths(lengths: Sequence[int]) -> list[int]:
    """The valid-token counts of the examples that have any, as ints (refusing fractions and
    negative counts)."""
    counts = [as_int(n, "lengths") for n in lengths]
    if any(n < 0 for n in counts):
        raise ValueError(f"lengths must be token counts >= 0, got {counts}")
    return [n for n in counts if n > 0]


def check_padded(q: Tensor, k: Tensor, v: Tensor, token_mask: Tensor) -> None:
    """Raise a ``ValueError`` unless ``q, k`` are ``[B, H, T, d]``, ``v`` is ``[B, H, T, d_v]``
    and ``token_mask`` is a ``[B, T]`` bool tensor with ``T >= 1``: the shapes every
    function here takes (and a ``TypeError`` unless ``q, k, v`` share one floating dtype)."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(
            f"q and k must be [B, H, T, d] with the same shape, got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    batch, heads, length, _ = q.shape
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must be [B, H, T, d_v] = [{batch}, {heads}, {length}, *], got {tuple(v.shape)}"
        )
    if token_mask.dtype != torch.bool or token_mask.shape != (batch, length):
        raise ValueError(
            f"token_mask must be a [B, T] = [{batch}, {length}] bool tensor "
            f"(valid_token_mask), got {token_mask.dtype} {tuple(token_mask.shape)}"
        )
    if length == 0:
        raise ValueError("the batch has no tokens (T = 0)")
    check_qkv_like(q, k, v)
    if token_mask.device != q.device:
        raise ValueError(f"token_mask is on {token_mask.device} but q is on {q.device}")


def empty_output(q: Tensor, v: Tensor) -> Tensor:
    """The ``[B, T, H, d_v]`` zeros of a padded op whose ``q`` ``[B, H, T, d]`` has no
    element (no example, head or token)."""
    batch, heads, length, _ = q.shape
    return v.new_zeros(batch, length, heads, v.size(-1))


def padded_hsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    token_mask: Tensor,
    hierarchy: SignalHierarchy | Batch,
    *,
    include_self: bool = True,
    size_bias: bool = True,
    scale: float | None = None,
) -> Tensor:
    r"""HSA over the valid tokens of a padded batch.

    Args:
        q (torch.Tensor): queries ``[B, H, T, d]``.
        k (torch.Tensor): keys ``[B, H, T, d]``.
        v (torch.Tensor): values ``[B, H, T, d_v]``.
        token_mask (torch.Tensor): ``[B, T]`` bool, ``True`` for real tokens
            (:func:`valid_token_mask`).
        hierarchy (SignalHierarchy or Batch): a forest (a PyG batch of
            :class:`~hiergraph.data.SignalHierarchy` trees, or
            :func:`window_hierarchies`) with one tree per example with at least one
            valid token, whose leaves are that example's valid tokens in order.
        include_self (bool, optional): the BERT-style diagonal (the self energy of
            App. G.1). (default: :obj:`True`)
        size_bias (bool, optional): keep the :math:`\log n(B)` sibling bias (HSA
            proper); :obj:`False` is the ablation baseline (every sibling sub-tree
            weighs as one token). (default: :obj:`True`)
        scale (float, optional): logit scale. (default: :obj:`None`, i.e.
            :math:`1/\sqrt{d}`)

    Returns:
        ``[B, T, H, d_v]`` (the layout transformers' attention functions return),
        zero at padding tokens.
    """
    check_padded(q, k, v, token_mask)
    lengths = token_mask.sum(1)
    lengths = lengths[lengths > 0]
    leaves = torch.bincount(leaf_batch(hierarchy), minlength=lengths.numel())
    if not torch.equal(leaves.to(lengths.device), lengths):
        raise ValueError(
            f"the hierarchies' trees have {leaves.tolist()} leaves but the examples have "
            f"{lengths.tolist()} valid tokens; give each example (with at least one valid "
            f"token) a tree over its valid tokens, in order"
        )
    pick = [t.transpose(1, 2)[token_mask] for t in (q, k, v)]  # [L, H, .] in example order
    out = hierarchical_attention(
        *pick, hierarchy, include_self=include_self, scale=scale, size_bias=size_bias
    )
    full = v.new_zeros(v.size(0), v.size(2), v.size(1), v.size(3))
    full[token_mask] = out
    return full


def padded_window_hsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    token_mask: Tensor,
    branching: Sequence[int],
    *,
    include_self: bool = True,
    size_bias: bool = True,
    scale: float | None = None,
) -> Tensor:
    r""":func:`padded_hsa` over the window hierarchies of the valid tokens, computed on the
    padded batch: the same result, without gathering the valid tokens or building a tree
    per batch.

    Every example gets the window tree of its whole padded length ``T``
    (:func:`~hiergraph.data.window_forest` of ``B`` equal trees, built once per shape and
    reused), and the padding tokens are masked leaves (``leaf_mask``): they count 0 in every
    statistic, so windows that hold only padding drop out of their families and a window
    left with a single valid child passes all of its mass down unchanged. What remains is
    the window tree of the example's valid tokens, the tree :func:`window_hierarchies`
    builds, since the valid tokens come first (right padding; a batch with a valid token
    after a padding one runs :func:`padded_hsa` over :func:`window_hierarchies`). When
    ``T`` is a product of the window sizes the forest has equal fanout and HSA runs as
    reshaped views of whole levels, heads first.

    Args:
        q, k, v, token_mask, include_self, size_bias, scale: as in :func:`padded_hsa`.
        branching (Sequence[int]): bottom-up window sizes, as in
            :func:`window_hierarchies`.

    Returns:
        ``[B, T, H, d_v]``, zero at padding tokens.
    """
    check_padded(q, k, v, token_mask)
    if not q.numel():  # no example, head or token: the (empty) output
        return empty_output(q, v)
    batch, heads, length, _ = q.shape
    options = dict(include_self=include_self, size_bias=size_bias, scale=scale)
    leading = token_mask.cumsum(1) == torch.arange(1, length + 1, device=token_mask.device)
    # one host read: right padding only? no padding at all?
    right_padded, unpadded = torch.stack([(leading | ~token_mask).all(), token_mask.all()]).tolist()
    if not right_padded:  # a valid token after a padding one
        trees = window_hierarchies(token_mask.sum(1).tolist(), branching)
        return padded_hsa(q, k, v, token_mask, trees.to(q.device), **options)
    forest = _padded_forest(batch, length, tuple(branching), str(token_mask.device))
    leaves = [_token_rows(t) for t in (q, k, v)]
    # without padding, no leaf mask: every count is a constant of its level (a cheaper path)
    leaf_mask = None if unpadded else token_mask.reshape(-1)
    out = hierarchical_attention(*leaves, forest, leaf_mask=leaf_mask, **options)
    return out.reshape(batch, length, heads, -1).contiguous()


def _token_rows(x: Tensor) -> Tensor:
    """``[B, H, T, c]`` as the op's rows ``[B * T, H, c]`` with at most one copy: a view of
    the ``[B, T, H, c]`` memory transformers layers project into (the op's copy to heads
    first then also zeroes the padding rows), else rows of heads-first ``[H, B * T, c]``
    memory, which the op reads as they are."""
    batch, heads, length, _ = x.shape
    if x.transpose(1, 2).is_contiguous():
        return x.transpose(1, 2).reshape(batch * length, heads, -1)
    return x.transpose(0, 1).reshape(heads, batch * length, -1).transpose(0, 1)


@torch.compiler.disable
@functools.lru_cache(maxsize=16)
def _padded_forest(batch: int, length: int, branching: tuple[int, ...], device: str):
    """The tree index of ``batch`` window trees over ``length`` tokens (cached per shape;
    host-side, so ``torch.compile`` calls it rather than tracing the tree's construction)."""
    return window_forest([length] * batch, branching).to(device).tree_index()


@renamed_arguments(block="block_size")
def padded_block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    token_mask: Tensor,
    block_size: int,
    scale: float | None = None,
) -> Tensor:
    r"""Softmax attention (with the diagonal) inside consecutive blocks of ``block_size``
    valid tokens; the same shapes as :func:`padded_hsa`.

    .. math::
        \mathrm{out}_i = \sum_{j \in \mathrm{blk}(i)}
            \mathrm{softmax}_j\big(\tau\, q_i^\top k_j\big)\, v_j

    Args:
        q (torch.Tensor): queries ``[B, H, T, d]``.
        k (torch.Tensor): keys ``[B, H, T, d]``.
        v (torch.Tensor): values ``[B, H, T, d_v]``.
        token_mask (torch.Tensor): ``[B, T]`` bool, ``True`` for real tokens.
        block_size (int): tokens per block (formerly ``block``).
        scale (float, optional): logit scale :math:`\tau`. (default: :obj:`None`,
            i.e. :math:`1/\sqrt{d}`)
    """
    check_padded(q, k, v, token_mask)
    check_int(block_size, "block_size")  # (2.5 failed in pad, True was 1)
    batch, heads, length, _ = q.shape
    # one block holds them all: the same attention, and no [block, block] logits past the
    # sequence (block_size=10**6 on 3 tokens asked for 4 TB)
    block = min(block_size, max(length, 1))
    scale = q.size(-1) ** -0.5 if scale is None else scale
    # move valid tokens to the front (stable), so blocks follow the valid tokens
    order = torch.argsort((~token_mask).to(torch.int8), dim=1, stable=True)
    valid = token_mask.gather(1, order)
    pad = -length % block
    blocks = (length + pad) // block

    def blocked(t: Tensor) -> Tensor:
        t = t.gather(2, order[:, None, :, None].expand(-1, heads, -1, t.size(-1)))
        t = torch.nn.functional.pad(t, (0, 0, 0, pad))
        return t.view(batch, heads, blocks, block, t.size(-1))

    valid = torch.nn.functional.pad(valid, (0, pad)).view(batch, 1, blocks, 1, block)
    logits = blocked(q) @ blocked(k).transpose(-1, -2) * scale
    weights = torch.softmax(logits.masked_fill(~valid, float("-inf")), dim=-1)
    weights = torch.where(valid.transpose(-1, -2), weights, 0.0)  # padding rows: all -inf
    out = (weights @ blocked(v)).flatten(2, 3)[:, :, :length]
    full = torch.zeros_like(out).scatter_(2, order[:, None, :, None].expand_as(out), out)
    return full.transpose(1, 2)
