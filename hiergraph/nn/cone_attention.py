r"""``ConeAttention``: dense multi-head cone attention, a drop-in for ``nn.MultiheadAttention``."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hiergraph._checks import check_positive
from hiergraph.nn._checks import check_dtype, check_int, check_probability
from hiergraph.ops.cone import DEFAULT_RADIUS, penumbral, umbral
from hiergraph.ops.logspace import masked_softmax


class ConeAttention(nn.Module):
    r"""Multi-head attention with cone scores (Tseng et al., "Coneheads: Hierarchy Aware
    Attention", NeurIPS 2023, https://arxiv.org/abs/2306.00392).

    Same constructor core and call signature as
    ``torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)``;
    only the score changes:

    .. math::
        \mathrm{head}_h = \operatorname{softmax}_j\big(-\gamma\, H(\phi(\mathbf{q}^h_i),
            \phi(\mathbf{k}^h_j)) + M_{ij}\big)\, \mathbf{V}^h, \qquad
        \mathrm{out} = [\mathrm{head}_1, \dots, \mathrm{head}_{n_h}]\, W_O,

    with :math:`\phi` = ξ (penumbral) or ψ (umbral) applied to each head's
    ``embed_dim // num_heads`` query/key coordinates (the last one becomes the
    height; see ``hiergraph.ops.cone``) and :math:`M` the masks. There is no
    :math:`1/\sqrt{d}`; :math:`\gamma` plays that role.

    Masks follow ``nn.MultiheadAttention``: boolean ``True`` means *not allowed*
    (``key_padding_mask``: ``True`` = padding), float masks are added to the
    logits. Unlike it, a query with no allowed key gets all-zero weights (its
    output is the output-projection bias), not NaN.

    As a drop-in for ``nn.MultiheadAttention`` it keeps that module's call
    signature, including ``need_weights`` (where the rest of the package says
    ``return_attention_weights``) and the ``(out, weights or None)`` return:
    ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer`` call their
    attention with ``need_weights=False`` and take element ``[0]``.

    Args:
        embed_dim (int): model size; divisible by :obj:`num_heads` with a per-head
            size ``>= 2``.
        num_heads (int): number of heads.
        dropout (float, optional): dropout on the attention weights.
            (default: :obj:`0.`)
        bias (bool, optional): biases in the input and output projections.
            (default: :obj:`True`)
        kdim (int, optional): key feature size. (default: :obj:`None`, i.e.
            :obj:`embed_dim`)
        vdim (int, optional): value feature size. (default: :obj:`None`, i.e.
            :obj:`embed_dim`)
        variant (str, optional): ``"penumbral"`` or ``"umbral"``.
            (default: :obj:`"penumbral"`)
        r (float, optional): penumbral light-source height / umbral ball radius.
            (default: :obj:`None`, i.e. :obj:`1.0` / :obj:`0.1`)
        gamma (float, optional): score temperature :math:`\gamma > 0`.
            (default: :obj:`1.0`)
        squared (bool, optional): penumbral score :math:`-\gamma H^2` (authors'
            code). (default: :obj:`False`)
        height_scale (float, optional): umbral ψ height :math:`e^{c x_d}` with
            ``c = height_scale``; :obj:`None` for ``c = 1/head_dim`` (authors'
            code). (default: :obj:`1.0`)

    Shapes (batch first, as ``nn.MultiheadAttention(batch_first=True)``):
        - query ``[B, L, embed_dim]``, key ``[B, S, kdim]``, value ``[B, S, vdim]``
          (or unbatched ``[L, ·]``, ``[S, ·]``);
        - ``key_padding_mask`` ``[B, S]``; ``attn_mask`` ``[L, S]`` or ``[B * num_heads, L, S]``;
        - returns ``(out [B, L, embed_dim], weights)`` with weights ``[B, L, S]``
          (head-averaged), ``[B, num_heads, L, S]``, or ``None`` if not ``need_weights``.
    """

    #: Always batch-first. With ``_qkv_same_embed_dim`` and ``in_proj_bias`` these
    #: attributes also keep ``nn.TransformerEncoderLayer`` off its native fast path,
    #: which would bypass this module's ``forward``.
    batch_first = True
    _qkv_same_embed_dim = False
    in_proj_bias = None

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        variant: str = "penumbral",
        r: float | None = None,
        gamma: float = 1.0,
        squared: bool = False,
        height_scale: float | None = 1.0,
    ) -> None:
        super().__init__()
        check_int(embed_dim, "embed_dim")
        check_int(num_heads, "num_heads")
        check_int(kdim, "kdim", optional=True)
        check_int(vdim, "vdim", optional=True)
        check_probability(dropout, "dropout")
        check_positive(gamma, "gamma")
        if r is not None:
            check_positive(r, "r")
        if height_scale is not None:  # (refused at the first forward before)
            check_positive(height_scale, "height_scale")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        head_dim = embed_dim // num_heads
        if head_dim < 2:
            raise ValueError(
                f"cone attention needs embed_dim // num_heads >= 2 (horizontal coordinates "
                f"plus a height), got {head_dim}"
            )
        if variant not in DEFAULT_RADIUS:
            raise ValueError(f"variant must be one of {sorted(DEFAULT_RADIUS)}, got {variant!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout = dropout
        self.variant = variant
        r = DEFAULT_RADIUS[variant] if r is None else r
        if variant == "penumbral":
            self.score = partial(penumbral, r=r, gamma=gamma, squared=squared)
        else:
            self.score = partial(umbral, r=r, gamma=gamma, height_scale=height_scale)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights and zero biases, as ``nn.MultiheadAttention``."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        r"""Attend from ``query`` to ``key``/``value``; see the class docstring for shapes.

        Args:
            query (torch.Tensor): ``[B, L, embed_dim]`` or ``[L, embed_dim]``.
            key (torch.Tensor): ``[B, S, kdim]`` or ``[S, kdim]``.
            value (torch.Tensor): ``[B, S, vdim]`` or ``[S, vdim]``.
            key_padding_mask (torch.Tensor, optional): ``[B, S]``, bool ``True`` =
                padding, or float (added to the logits). (default: :obj:`None`)
            need_weights (bool, optional): also return the attention weights
                (``nn.MultiheadAttention``'s name). (default: :obj:`True`)
            attn_mask (torch.Tensor, optional): ``[L, S]`` or
                ``[B * num_heads, L, S]``, bool ``True`` = not allowed, or float.
                (default: :obj:`None`)
            average_attn_weights (bool, optional): average the returned weights over
                the heads. (default: :obj:`True`)
            is_causal (bool, optional): without :obj:`attn_mask`, apply the causal
                mask ``j > i``. (default: :obj:`False`)
        """
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query[None], key[None], value[None]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        self._check_inputs(query, key, value, unbatched)
        B, L, S = query.size(0), query.size(1), key.size(1)

        q, k, v = (
            self._split_heads(proj(x))
            for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        )
        logits = self.score(q, k)  # [B, heads, L, S], float32 or wider
        allowed = torch.ones(L, S, dtype=torch.bool, device=query.device)
        if is_causal and attn_mask is None:
            allowed = allowed.tril()
        H = self.num_heads
        masks = (
            ("attn_mask", attn_mask, {(L, S): (1, 1, L, S), (B * H, L, S): (B, H, L, S)}),
            ("key_padding_mask", key_padding_mask, {(B, S): (B, 1, 1, S)}),
        )
        for name, mask, shapes in masks:
            if mask is None:
                continue
            if tuple(mask.shape) not in shapes:
                raise ValueError(
                    f"{name} must have shape {' or '.join(map(str, shapes))}, "
                    f"got {tuple(mask.shape)}"
                )
            if mask.device != q.device:
                raise ValueError(f"{name} is on {mask.device} but query is on {q.device}")
            if mask.dtype != torch.bool and not mask.is_floating_point():
                raise TypeError(  # an int 0/1 mask would be *added* to the logits
                    f"{name} must be bool (True = masked) or floating (added to the "
                    f"logits), got {mask.dtype}"
                )
            mask = mask.reshape(shapes[tuple(mask.shape)])
            if mask.dtype == torch.bool:
                allowed = allowed & ~mask
            else:
                logits = logits + mask
        _, weights = masked_softmax(logits, allowed)
        weights = F.dropout(weights, p=self.dropout, training=self.training)

        out = weights.to(v.dtype) @ v  # [B, heads, L, head_dim]
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, self.embed_dim))
        if need_weights:
            weights = weights.mean(dim=1) if average_attn_weights else weights
            weights = weights[0] if unbatched else weights
        else:
            weights = None
        return (out[0] if unbatched else out), weights

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.embed_dim}, num_heads={self.num_heads}, "
            f"variant={self.variant!r})"
        )

    def _split_heads(self, x: Tensor) -> Tensor:
        """``[B, T, embed_dim] -> [B, heads, T, head_dim]``."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, unbatched: bool) -> None:
        expected = (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        )
        for name, x, dim in expected:
            if x.dim() != 3 or x.size(-1) != dim:
                raise ValueError(
                    f"{name} must be [batch, seq, {dim}] (batch first) or [seq, {dim}]: "
                    f"{dim} features, got shape {tuple(x.shape[1:] if unbatched else x.shape)}"
                )
            check_dtype(x, self.q_proj.weight, name)
        if key.shape[:2] != value.shape[:2] or key.size(0) != query.size(0):
            raise ValueError(
                f"query, key and value must share the batch size and key/value the sequence "
                f"length, got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
