r"""H-Transformer-1D: a pre-LN Transformer encoder / language model with H-matrix attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from hiergraph._checks import check_bool, check_ids, check_int, check_probability
from hiergraph._deprecation import renamed_arguments
from hiergraph._precision import accumulation_dtype
from hiergraph.nn._reset import reset
from hiergraph.nn.hmatrix_attention import HMatrixAttention


def sinusoidal_positions(length: int, dim: int, device=None, dtype=None) -> Tensor:
    r"""``[length, dim]`` sinusoidal encoding: :math:`PE_{p,2i} = \sin(p\,\omega_i)`,
    :math:`PE_{p,2i+1} = \cos(p\,\omega_i)`, :math:`\omega_i = 10000^{-2i/\mathrm{dim}}`,
    returned in ``dtype`` (default: the default dtype),
    computed in float64 for float64 and in float32 otherwise."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    work = accumulation_dtype(dtype)  # positions past 256 (bf16) / 2048 (fp16) stay exact
    position = torch.arange(length, device=device, dtype=work).unsqueeze(1)
    freq = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=work) * (-math.log(10000.0) / dim)
    )
    pe = torch.zeros(length, dim, device=device, dtype=work)
    pe[:, 0::2] = torch.sin(position * freq)
    pe[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return pe.to(dtype)


class TransformerBlock(nn.Module):
    r"""Pre-LN block: :math:`x \leftarrow x + \mathrm{Attn}(\mathrm{LN}(x))`,
    :math:`x \leftarrow x + \mathrm{FFN}(\mathrm{LN}(x))` with a GELU FFN of width
    ``ff_mult * embed_dim``.

    The constructor does not call :meth:`reset_parameters`, so that the
    ``attention`` passed in keeps its weights (the block's own norms and FFN are
    initialised when built); :meth:`reset_parameters` re-initialises all of it.

    Args:
        attention (torch.nn.Module): maps ``([B, L, E], key_padding_mask)`` to
            ``[B, L, E]`` (``key_padding_mask``: ``[B, L]`` bool, ``True`` =
            padding, or ``None``).
        embed_dim (int): model width :math:`E`.
        ff_mult (int, optional): feed-forward width multiplier.
            (default: :obj:`4`)
        dropout (float, optional): dropout on the residual branches and inside the
            FFN. (default: :obj:`0.`)
    """

    def __init__(
        self, attention: nn.Module, embed_dim: int, ff_mult: int = 4, dropout: float = 0.0
    ):
        super().__init__()
        self.embed_dim, self.ff_mult = embed_dim, ff_mult
        self.attn_norm, self.attn = nn.LayerNorm(embed_dim), attention
        self.ff_norm = nn.LayerNorm(embed_dim)
        self.ff = nn.Sequential(
            nn.Linear(embed_dim, ff_mult * embed_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(ff_mult * embed_dim, embed_dim),
        )
        self.dropout = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        for module in (self.attn_norm, self.attn, self.ff_norm, self.ff):
            reset(module)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), key_padding_mask))
        return x + self.dropout(self.ff(self.ff_norm(x)))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.attn}, {self.embed_dim}, ff_mult={self.ff_mult})"


class HTransformer1D(nn.Module):
    r"""Token embedding + sinusoidal positions + ``num_layers`` pre-LN blocks of H-matrix attention.

    Zhu & Soricut, *H-Transformer-1D* (ACL 2021): a standard Transformer whose
    attention is replaced by :class:`~hiergraph.nn.HMatrixAttention`, so a layer
    costs :math:`O(L \cdot \text{block\_size})` instead of :math:`O(L^2)`. With
    ``causal=True`` and ``lm_head=True`` it is a decoder-only language model
    (position :math:`i` never sees tokens :math:`> i`); with ``causal=False`` it
    is a bidirectional encoder.

    Args:
        vocab_size (int): vocabulary size (formerly ``num_tokens``).
        embed_dim (int, optional): model width. (default: :obj:`256`)
        num_layers (int, optional): number of blocks (formerly ``depth``).
            (default: :obj:`4`)
        num_heads (int, optional): heads per block. (default: :obj:`8`)
        block_size (int, optional): :math:`N_r` of the H-matrix attention (even;
            the default attention's only). (default: :obj:`16`)
        causal (bool, optional): causal attention (language modelling); with an
            :obj:`attention` factory, the modules it builds must be causal themselves
            (a ``causal`` attribute that is :obj:`True`). (default: :obj:`False`)
        ff_mult (int, optional): feed-forward width multiplier.
            (default: :obj:`4`)
        dropout (float, optional): dropout on the residual branches and inside
            the FFN. (default: :obj:`0.`)
        lm_head (bool, optional): end with a linear map to :obj:`vocab_size`
            logits; otherwise return the final (layer-normalised) hidden states.
            (default: :obj:`True`)
        attention (Callable[[int, int], torch.nn.Module], optional): factory
            ``(embed_dim, num_heads) -> module`` to use another attention with the
            same call signature (e.g. a flat baseline of equal size); it is given
            neither :obj:`block_size` nor :obj:`causal`.
            (default: :obj:`None`, i.e. :class:`HMatrixAttention`)

    Shapes:
        - **tokens**: ``[B, L]`` int64.
        - **key_padding_mask**: optional bool ``[B, L]``, ``True`` = padding.
        - **output**: ``[B, L, vocab_size]`` logits, or ``[B, L, embed_dim]``.
    """

    @renamed_arguments(num_tokens="vocab_size", depth="num_layers")
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        num_layers: int = 4,
        num_heads: int = 8,
        block_size: int = 16,
        causal: bool = False,
        ff_mult: int = 4,
        dropout: float = 0.0,
        lm_head: bool = True,
        attention: Callable[[int, int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        check_int(vocab_size, "vocab_size")
        check_int(embed_dim, "embed_dim")  # (True and 2.0 failed inside torch, 0 was taken)
        check_int(num_layers, "num_layers", minimum=0)
        check_int(num_heads, "num_heads")
        check_int(ff_mult, "ff_mult")
        check_probability(dropout, "dropout")  # (True was 1.0)
        check_bool(causal, "causal")
        check_bool(lm_head, "lm_head")  # ("no" added the head)
        if attention is None:

            def attention(dim: int, heads: int) -> nn.Module:
                return HMatrixAttention(dim, heads, block_size=block_size, causal=causal)

        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(_attention(attention, embed_dim, num_heads, causal), embed_dim,
                             ff_mult, dropout)
            for _ in range(num_layers)
        )  # fmt: skip
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size) if lm_head else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.embed.reset_parameters()
        for block in self.blocks:
            block.reset_parameters()
        self.norm.reset_parameters()
        if self.head is not None:
            self.head.reset_parameters()

    def forward(self, tokens: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        r"""
        Args:
            tokens (torch.Tensor): ``[B, L]`` int64 token ids.
            key_padding_mask (torch.Tensor, optional): ``[B, L]`` bool, ``True`` =
                padding (as in PyTorch). (default: :obj:`None`)

        Returns:
            ``[B, L, vocab_size]`` logits, or ``[B, L, embed_dim]`` without
            :obj:`lm_head`.
        """
        if not isinstance(tokens, Tensor):  # (an AttributeError)
            raise TypeError(
                f"tokens must be an int64 tensor [batch, length], got {type(tokens).__name__}"
            )
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(
                f"tokens must be an int64 tensor [batch, length], got {tokens.dtype} "
                f"{tuple(tokens.shape)}"
            )
        check_ids(tokens, self.embed.num_embeddings, "token", "vocab_size", device_assert=False)
        x = self.embed(tokens)
        x = x * math.sqrt(x.shape[-1]) + sinusoidal_positions(
            tokens.shape[1], x.shape[-1], x.device, x.dtype
        )
        for block in self.blocks:
            x = block(x, key_padding_mask)
        x = self.norm(x)
        return self.head(x) if self.head is not None else x

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.embed.num_embeddings}, "
            f"embed_dim={self.embed.embedding_dim}, num_layers={len(self.blocks)}, "
            f"lm_head={self.head is not None})"
        )


def _attention(factory: Callable, dim: int, heads: int, causal: bool) -> nn.Module:
    """``factory(dim, heads)``, refused when ``causal`` asks for causal attention and the
    module built is not causal (a language model that would see the tokens ahead)."""
    module = factory(dim, heads)
    if causal and getattr(module, "causal", False) is not True:
        raise ValueError(
            f"causal=True, but the attention factory built {type(module).__name__}, which is "
            "not causal (its 'causal' attribute is not True): build causal modules in the "
            "factory"
        )
    return module
