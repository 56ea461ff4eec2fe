r"""Multi-head H-matrix attention layer (H-Transformer-1D, Zhu & Soricut 2021)."""

from __future__ import annotations

from torch import Tensor, nn

from hiergraph._checks import check_bool, check_int
from hiergraph.data.windows import check_block_size
from hiergraph.nn._checks import check_dtype
from hiergraph.ops.hmatrix import hmatrix_attention


class HMatrixAttention(nn.Module):
    r"""Multi-head self-attention with the H-matrix approximation of softmax attention.

    .. math::
        \mathrm{out} = \big[\operatorname{softmax}(\hat S_1) V_1 \,\|\, \dots \,\|\,
                       \operatorname{softmax}(\hat S_h) V_h\big] W_O,
        \qquad Q_i, K_i, V_i = X W^Q_i, X W^K_i, X W^V_i,

    where :math:`\hat S_i` is the hierarchical (H-matrix) logit matrix of
    :func:`hiergraph.ops.hmatrix_attention`: exact logits for the
    ``block_size`` nearest tokens on each side, coarsened (mean-pooled) queries
    and keys for pairs further apart, one softmax normalisation per row.
    Time and memory are :math:`O(L \cdot \text{block\_size})` per head.

    Args:
        embed_dim (int): model width :math:`E`, divisible by :obj:`num_heads`.
        num_heads (int): number of heads :math:`h`.
        block_size (int, optional): :math:`N_r`, an even int; the numerical rank
            of every far block and the half-width of the exact window.
            (default: :obj:`16`)
        causal: attend only to positions :math:`j \le i` (decoder / LM).
        bias (bool, optional): learnable biases in the input and output
            projections. (default: :obj:`True`)

    Shapes:
        - **x**: ``[B, L, E]`` (batch first).
        - **key_padding_mask**: optional bool ``[B, L]``, ``True`` = padding.
        - **output**: ``[B, L, E]``; padded positions are zero before the
          output projection.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        block_size: int = 16,
        causal: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_int(embed_dim, "embed_dim")
        check_int(num_heads, "num_heads")
        block_size = check_block_size(block_size)
        check_bool(causal, "causal")
        check_bool(bias, "bias")
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.block_size, self.causal = block_size, causal
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for layer in (self.in_proj, self.out_proj):
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        r"""
        Args:
            x (torch.Tensor): ``[B, L, E]`` (batch first).
            key_padding_mask (torch.Tensor, optional): ``[B, L]`` bool, ``True`` =
                padding (as in PyTorch). (default: :obj:`None`)

        Returns:
            ``[B, L, E]``.
        """
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have shape [batch, length, {self.embed_dim}], got {tuple(x.shape)}"
            )
        check_dtype(x, self.in_proj.weight, "x")
        batch, length, _ = x.shape
        heads = (self.num_heads, self.embed_dim // self.num_heads)
        q, k, v = self.in_proj(x).view(batch, length, 3, *heads).permute(2, 0, 3, 1, 4)
        out = self.attend(q, k, v, key_padding_mask)  # [B, h, L, E/h]
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, self.embed_dim))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """The attention core on ``[B, h, L, E/h]`` heads (override to swap the kernel)."""
        return hmatrix_attention(q, k, v, self.block_size, self.causal, key_padding_mask)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.embed_dim}, heads={self.num_heads}, "
            f"block_size={self.block_size}, causal={self.causal})"
        )
