r"""VCC encoder: a stack of ordinary pre-LN transformer layers run on compressed sequences."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from hiergraph.data.windows import check_branching
from hiergraph.nn._checks import check_features, check_int, check_probability
from hiergraph.nn._reset import reset
from hiergraph.ops.vcc.layer import check_vip_inputs
from hiergraph.ops.vcc.padded import (
    open_empty_rows,
    partition_padded,
    vcc_layer_padded,
    vip_score_fn_padded,
)
from hiergraph.ops.vcc.segment_tree import check_budgets, two_resolution_budgets


def run_layer(layer: nn.Module, z: Tensor, key_bias: Tensor) -> Tensor:
    r"""``z + gamma(z)`` for ``z`` ``[B, r, d]`` with ``key_bias`` ``[B, r]`` added to every
    attention logit of each key (all queries, all heads).

    An ``nn.TransformerEncoderLayer`` runs its two residual blocks directly (pre- or
    post-LN, as it was built): its inference fast path would drop a float key bias, and
    its switch is global state."""
    if not isinstance(layer, nn.TransformerEncoderLayer):
        return layer(z, key_bias)
    if layer.norm_first:
        z = z + layer._sa_block(layer.norm1(z), None, key_bias)
        return z + layer._ff_block(layer.norm2(z))
    z = layer.norm1(z + layer._sa_block(z, None, key_bias))
    return layer.norm2(z + layer._ff_block(z))


def query_key(layer: nn.Module, x: Tensor, which: str) -> Tensor:
    r"""The layer's own attention queries (scaled by :math:`1/\sqrt{d_h}`) or keys of rows
    ``x`` ``[M, d]``, ``[M, H, d_h]``: LayerNorm then :math:`W_Q` / :math:`W_K`."""
    if isinstance(layer, nn.TransformerEncoderLayer):
        attn = layer.self_attn
        heads, dim = attn.num_heads, attn.embed_dim
        part = 0 if which == "q" else 1
        weight = attn.in_proj_weight[part * dim : (part + 1) * dim]
        bias = (
            attn.in_proj_bias[part * dim : (part + 1) * dim]
            if attn.in_proj_bias is not None
            else None
        )
        out = nn.functional.linear(layer.norm1(x), weight, bias).unflatten(-1, (heads, -1))
        return out / math.sqrt(dim // heads) if which == "q" else out
    return layer.query_key(x)[0 if which == "q" else 1]


def _check_layer(layer: nn.Module, where: str) -> None:
    if isinstance(layer, nn.TransformerEncoderLayer):
        if not (layer.norm_first and layer.self_attn.batch_first):
            raise ValueError(
                f"{where}: nn.TransformerEncoderLayer must be built with norm_first=True and "
                "batch_first=True (VCC applies the pre-LN layer to compressed rows)"
            )
        if not layer.self_attn._qkv_same_embed_dim:
            raise ValueError(f"{where}: kdim/vdim different from embed_dim are not supported")
    elif not callable(getattr(layer, "query_key", None)):
        raise TypeError(
            f"{where}: a custom layer must define forward(z, key_bias) -> z + gamma(z) and "
            "query_key(x) -> (q, k) of shape [M, H, d_h] (q scaled); or use "
            "nn.TransformerEncoderLayer(norm_first=True, batch_first=True)"
        )


def _layer_width(**groups: Sequence[nn.Module]) -> int | None:
    """The model width of the ``nn.TransformerEncoderLayer`` s in ``groups`` (they must
    agree); ``None`` when there are none (custom layers declare no width)."""
    widths = {
        f"{name}[{i}]": layer.self_attn.embed_dim
        for name, layers in groups.items()
        for i, layer in enumerate(layers)
        if isinstance(layer, nn.TransformerEncoderLayer)
    }
    if len(set(widths.values())) > 1:
        listed = ", ".join(f"{where}: {width}" for where, width in widths.items())
        raise ValueError(f"the transformer layers must share one width (embed_dim), got {listed}")
    return next(iter(widths.values()), None)


class VCCEncoder(nn.Module):
    r"""VIP-token-centric compression around a stack of transformer layers.

    Zeng et al., *VCC: Scaling Transformers to 128K Tokens or More by Prioritizing
    Important Tokens* (Sec. 3, Fig. 2). The VIP tokens :math:`P` (e.g. the
    question of a QA task) are moved to the front by a stable permutation;
    the other tokens :math:`C` go into a segment tree. Each layer then runs on
    the compressed sequence :math:`[P; S_c C]` of length
    :math:`r = n_p + n_c/k + h(k-1)` (two resolutions) with a
    :math:`\log s_j` bias on every key (the multiplicity :math:`D`), and

    .. math::
        X_{\text{new}} = S^\dagger \gamma(S X) + X,

    where :math:`S_c` keeps the ``num_refined`` (:math:`h`) blocks of size
    ``block_size`` (:math:`k`) that the VIP tokens attend to most as exact
    tokens and averages every other block. Tokens keep their own residual
    state; an unrefined block's tokens share one update. The permutation is
    undone at the end. Optional vanilla ``local_layers`` run first on the
    original order, within windows of ``local_size`` tokens (the paper's first
    4–6 layers on 512-token segments, Sec. 4).

    Layers are ``nn.TransformerEncoderLayer(..., norm_first=True, batch_first=True)``
    (built in when ``layers`` is an int) or custom modules with
    ``forward(z, key_bias) -> z + gamma(z)`` and ``query_key(x) -> (q, k)``.
    The selection uses each layer's own LayerNorm, :math:`W_Q`, :math:`W_K`
    (:func:`~hiergraph.ops.vcc.layer.vip_scores_padded`); it is discrete and gets
    no gradient. Inputs carry their own (absolute) position information:
    positions travel with the tokens; relative position biases are not supported
    (the layer sees its rows grouped by tree level).

    Every shape is static (:mod:`hiergraph.ops.vcc.padded`): with :obj:`vip_slots` set, a
    forward and backward run without a host synchronisation and can be captured
    (``torch.compile(fullgraph=True)``, CUDA graphs). Each layer runs on
    ``vip_slots + n/k - h + h k`` rows per sequence (two resolutions, ``n/k`` rounded up),
    empty ones masked.

    :meth:`reset_parameters` re-initialises every layer; the constructor does not
    call it, so that layers passed in (e.g. pretrained ones) keep their weights
    (built-in layers are initialised by PyTorch when they are built).

    Args:
        layers (int or Sequence[torch.nn.Module]): the VCC layers, or their number
            (built in, from :obj:`embed_dim`, :obj:`num_heads`, :obj:`ff_dim`,
            :obj:`dropout`).
        embed_dim (int, optional): model width of built-in layers.
            (default: :obj:`None`)
        num_heads (int, optional): heads of built-in layers. (default: :obj:`4`)
        ff_dim (int, optional): feed-forward width of built-in layers (GELU FFN).
            (default: :obj:`None`, i.e. :obj:`4 * embed_dim`)
        dropout (float, optional): dropout of built-in layers. (default: :obj:`0.`)
        block_size (int, optional): :math:`k`, the coarse block size
            (two-resolution scheme). (default: :obj:`16`)
        num_refined (int, optional): :math:`h`, the blocks refined to tokens per
            sequence and layer. (default: :obj:`90`)
        branching (Sequence[int], optional): a general tree instead (Algorithm 1):
            bottom-up window sizes; overrides :obj:`block_size` and
            :obj:`num_refined` together with :obj:`budgets`. (default: :obj:`None`)
        budgets (Sequence[int or None], optional): ``len(branching) + 1``
            per-level budgets, root first (``None`` = refine all).
            (default: :obj:`None`)
        local_layers (int or Sequence[torch.nn.Module], optional): vanilla layers
            (same kinds as :obj:`layers`) or their number. (default: :obj:`0`)
        local_size (int, optional): window of the local layers.
            (default: :obj:`512`)
        vip_slots (int, optional): VIP rows per sequence. A sequence's first
            :obj:`vip_slots` VIP tokens are VIP rows; further ones are compressed with
            the other tokens (as in the authors' code). :obj:`None` takes the largest
            number of VIP tokens in the batch, read from :obj:`vip_mask` once per
            forward (a host synchronisation on accelerators). (default: :obj:`None`)

    Shapes:
        - **input:** ``x`` ``[B, n, d]``; ``vip_mask`` ``[B, n]`` bool, ``True`` =
          VIP token; ``token_mask`` (optional) ``[B, n]`` bool, ``True`` = real
          (valid) token, ``False`` = padding.
        - **output:** ``[B, n, d]``, zero at padded positions.
    """

    def __init__(
        self,
        layers: int | Sequence[nn.Module],
        embed_dim: int | None = None,
        num_heads: int = 4,
        ff_dim: int | None = None,
        dropout: float = 0.0,
        *,
        block_size: int = 16,
        num_refined: int = 90,
        branching: Sequence[int] | None = None,
        budgets: Sequence[int | None] | None = None,
        local_layers: int | Sequence[nn.Module] = 0,
        local_size: int = 512,
        vip_slots: int | None = None,
    ):
        super().__init__()
        check_int(embed_dim, "embed_dim", optional=True)
        check_int(num_heads, "num_heads")
        check_int(ff_dim, "ff_dim", optional=True)
        check_probability(dropout, "dropout")
        check_int(block_size, "block_size", minimum=2)
        check_int(num_refined, "num_refined", minimum=0)
        check_int(vip_slots, "vip_slots", optional=True, minimum=0)
        build = dict(embed_dim=embed_dim, num_heads=num_heads, ff_dim=ff_dim, dropout=dropout)
        self.layers = self._layers(layers, "layers", **build)
        self.local_layers = self._layers(local_layers, "local_layers", **build)
        self.embed_dim = _layer_width(layers=self.layers, local_layers=self.local_layers)
        if branching is None:
            branching, budgets = (block_size,), two_resolution_budgets(num_refined)
        elif budgets is None or len(budgets) != len(branching) + 1:
            raise ValueError(
                "with branching=..., give budgets with len(branching) + 1 entries "
                "(root level first; None = refine all)"
            )
        branching = check_branching(branching)  # (NumPy ints as ints)
        check_budgets(budgets, len(branching) + 1, has_score=True)
        check_int(local_size, "local_size")
        self.branching, self.budgets, self.local_size = tuple(branching), tuple(budgets), local_size
        self.vip_slots = vip_slots

    @staticmethod
    def _layers(layers, where: str, embed_dim, num_heads, ff_dim, dropout) -> nn.ModuleList:
        if isinstance(layers, int) and not isinstance(layers, bool):
            if layers < 0:
                raise ValueError(f"{where} must be >= 0, got {layers}")
            if layers and (embed_dim is None or embed_dim % num_heads):
                raise ValueError(
                    f"built-in {where} need embed_dim divisible by num_heads, "
                    f"got embed_dim={embed_dim}, num_heads={num_heads}"
                )
            layers = [
                nn.TransformerEncoderLayer(
                    embed_dim,
                    num_heads,
                    ff_dim or 4 * embed_dim,
                    dropout,
                    activation="gelu",
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(layers)
            ]
        layers = nn.ModuleList(layers)
        for i, layer in enumerate(layers):
            _check_layer(layer, f"{where}[{i}]")
        return layers

    def reset_parameters(self) -> None:
        for layer in [*self.layers, *self.local_layers]:
            reset(layer)

    def forward(self, x: Tensor, vip_mask: Tensor, token_mask: Tensor | None = None) -> Tensor:
        r"""
        Args:
            x (torch.Tensor): ``[B, n, d]`` token features.
            vip_mask (torch.Tensor): ``[B, n]`` bool, ``True`` = VIP token. A sequence
                without any is compressed by position: every block scores 0, and the
                earliest blocks are refined (a stable top-k).
            token_mask (torch.Tensor, optional): ``[B, n]`` bool, ``True`` = real
                (valid) token, ``False`` = padding. (default: :obj:`None`, all real)

        Returns:
            ``[B, n, d]``, zero at padded positions.
        """
        if self.embed_dim is not None and isinstance(x, Tensor) and x.dim() == 3:
            shape = f"[batch, seq, embed_dim={self.embed_dim}]"
            check_features(x, self.embed_dim, "x", shape, next(self.parameters(), None))
        vip_mask, token_mask = check_vip_inputs(x, vip_mask, token_mask)
        if not x.shape[0] or not x.shape[1]:  # no sequence, or sequences of no token
            return torch.zeros_like(x)
        x = self.apply_local(x, token_mask)
        slots = int(vip_mask.sum(1).max()) if self.vip_slots is None else self.vip_slots
        p, c, part = partition_padded(x, vip_mask, token_mask, slots, self.branching)
        for layer in self.layers:
            score_fn = vip_score_fn_padded(
                query_key(layer, p, "q"),
                part.slot_real,
                lambda mean, layer=layer: query_key(layer, mean, "k"),
            )
            p, c = vcc_layer_padded(
                lambda z, b, layer=layer: run_layer(layer, z, b),
                p,
                part.slot_real,
                c,
                part.tree,
                self.budgets,
                score_fn,
            )
        return part.restore(p, c)

    def apply_local(self, x: Tensor, token_mask: Tensor) -> Tensor:
        """The vanilla ``local_layers`` within windows of ``local_size`` tokens, on the
        original order; ``x`` ``[B, n, d]``, ``token_mask`` ``[B, n]`` bool, ``True`` =
        real token (the output is zero at padding)."""
        if not len(self.local_layers):
            return x
        batch, length, dim = x.shape
        pad = -length % self.local_size
        real = nn.functional.pad(token_mask, (0, pad)).reshape(-1, self.local_size)
        windows = nn.functional.pad(x, (0, 0, 0, pad)).reshape(-1, self.local_size, dim)
        z = windows.masked_fill(~real.unsqueeze(-1), 0.0)  # NaN at padding stays out
        key_bias = torch.zeros(real.shape, dtype=x.dtype, device=x.device)
        key_bias = open_empty_rows(key_bias.masked_fill(~real, float("-inf")))
        for layer in self.local_layers:
            z = run_layer(layer, z, key_bias)
        z = z.masked_fill(~real.unsqueeze(-1), 0.0)
        return z.reshape(batch, length + pad, dim)[:, :length]

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(layers={len(self.layers)}, "
            f"local_layers={len(self.local_layers)}, branching={self.branching}, "
            f"budgets={self.budgets}, vip_slots={self.vip_slots})"
        )
