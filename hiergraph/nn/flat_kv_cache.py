r"""The standard key–value cache: causal softmax attention over every previous token.

The baseline of :class:`~hiergraph.nn.HierarchicalKVCache` (and the cache of
``attention='flat'`` in :class:`~hiergraph.nn.HTEDecoder`): :math:`O(N)` time per token and
:math:`O(N)` memory for ``N`` tokens, against :math:`O(b \log_b N)` for the hierarchical one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._precision import accumulation_dtype
from hiergraph.nn._checks import check_cache_arguments, check_cache_inputs, check_int


class FlatKVCache:
    r"""A standard key–value cache: causal softmax attention over all previous tokens.

    :math:`\mathrm{out}_i = \sum_{j \le i} \mathrm{softmax}_j(\tau q_i^\top k_j)\,v_j`
    with :math:`O(N)` time per token and :math:`O(N)` memory.

    Args:
        heads, dim, dim_v, scale, dtype, device: as in :class:`HierarchicalKVCache`.
        capacity: initial number of token slots (doubled when full).
    """

    def __init__(
        self,
        heads: int,
        dim: int,
        dim_v: int | None = None,
        scale: float | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
        capacity: int = 1024,
    ):
        check_cache_arguments(heads, dim, dim_v, scale, dtype)
        check_int(capacity, "capacity", minimum=0)
        dim_v = dim if dim_v is None else dim_v
        self.heads, self.dim, self.dim_v = heads, dim, dim_v
        self.tau = dim**-0.5 if scale is None else scale
        self.keys = torch.empty((heads, capacity, dim), dtype=dtype, device=device)
        self.values = torch.empty((heads, capacity, dim_v), dtype=dtype, device=device)
        self.num_tokens = 0

    def extend(self, k: Tensor, v: Tensor) -> None:
        """Store the keys ``[T, H, d]`` and values ``[T, H, d_v]`` of ``T`` tokens (a prompt).

        Raises:
            ValueError: if the shapes do not match the cache's ``heads, dim, dim_v``.
        """
        check_cache_inputs(self, k.shape[:1], None, k, v)
        self._store(k, v)

    def _store(self, k: Tensor, v: Tensor) -> None:
        """:meth:`extend` without its check."""
        n, t = self.num_tokens, k.size(0)
        if n + t > self.keys.size(1):  # at least double: amortised O(1) per token
            size = max(2 * self.keys.size(1), n + t)
            self.keys, self.values = _grown(self.keys, size), _grown(self.values, size)
        self.keys[:, n : n + t] = k.transpose(0, 1)
        self.values[:, n : n + t] = v.transpose(0, 1)
        self.num_tokens = n + t

    def append(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``q, k: [H, d]``, ``v: [H, d_v]`` → ``[H, d_v]``.

        Raises:
            ValueError: if the shapes do not match the cache's ``heads, dim, dim_v``.
        """
        check_cache_inputs(self, (), q, k, v)
        self._store(k[None], v[None])  # (cast to the cache's dtype as they are stored)
        n = self.num_tokens - 1
        keys, values = self.keys[:, : n + 1], self.values[:, : n + 1]
        # in float32 for bf16/fp16 caches (their logits overflow fp16 from 65,504 on)
        work = accumulation_dtype(keys.dtype)
        logits = torch.einsum("hd,hnd->hn", q.to(work), keys.to(work))
        weights = torch.softmax(self.tau * logits, -1)
        return torch.einsum("hn,hnd->hd", weights, values.to(work)).to(keys.dtype)

    def nbytes(self) -> int:
        """Bytes of the cached keys and values (the used part)."""
        per_token = self.keys[:, 0].numel() + self.values[:, 0].numel()
        return self.num_tokens * per_token * self.keys.element_size()


def _grown(buffer: Tensor, size: int) -> Tensor:
    """``buffer`` ``[H, S, c]`` with its token axis grown to ``size`` slots (new slots unset)."""
    out = buffer.new_empty(buffer.size(0), size, buffer.size(2))
    out[:, : buffer.size(1)] = buffer
    return out
