"""Flat KV cache: causal softmax attention over every previous token, prompt and steps."""

import pytest
import torch

from hiergraph.nn.flat_kv_cache import FlatKVCache
from tests.conftest import random_qkv


@pytest.mark.parametrize("capacity", [0, 1, 8])
def test_flat_cache_is_causal_softmax(capacity):
    q, k, v = (t.float() for t in random_qkv(50, heads=3, dim=4, dv=5, seed=3))
    cache = FlatKVCache(3, 4, 5, capacity=capacity)
    cache.extend(k[:20], v[:20])  # a prompt longer than the initial capacity, then decoding
    out = torch.stack([cache.append(q[i], k[i], v[i]) for i in range(20, 50)])
    logits = torch.einsum("ihd,jhd->hij", q, k) / 2.0
    logits = logits.masked_fill(~torch.ones(50, 50, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.einsum("hij,jhd->ihd", logits.softmax(-1), v)
    assert (out - ref[20:]).abs().max() <= 1e-6
    assert cache.nbytes() == 50 * 3 * 9 * 4


@pytest.mark.parametrize("cache_dtype, input_dtype", [(torch.float32, torch.float64),
                                                       (torch.float64, torch.float32)])  # fmt: skip
def test_the_flat_cache_casts_its_inputs_too(cache_dtype, input_dtype):
    """As the hierarchical cache (a float64 query met float32 keys in one product)."""
    q, k, v = (t.to(input_dtype) for t in random_qkv(5, seed=4))
    cache = FlatKVCache(2, 4, 3, dtype=cache_dtype)
    out = torch.stack([cache.append(q[i], k[i], v[i]) for i in range(5)])
    assert out.dtype == cache_dtype
    ref = FlatKVCache(2, 4, 3, dtype=torch.float64)
    expected = torch.stack([ref.append(*(t[i].double() for t in (q, k, v))) for i in range(5)])
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_flat_cache_computes_in_float32(dtype):
    """Logits beyond float16's 65,504 (here up to ~3e5) stay finite: the products and the
    softmax run in float32, the output is rounded once."""
    q, k, v = (t.to(dtype) for t in random_qkv(16, seed=1))
    q, k = q * 200, k * 200
    cache = FlatKVCache(2, 4, 3, dtype=dtype)
    out = torch.stack([cache.append(q[i], k[i], v[i]) for i in range(16)])
    assert out.dtype == dtype
    ref = FlatKVCache(2, 4, 3, dtype=torch.float32)
    expected = torch.stack([ref.append(*(t[i].float() for t in (q, k, v))) for i in range(16)])
    torch.testing.assert_close(out.float(), expected.to(dtype).float(), atol=0, rtol=0)


def test_flat_cache_bad_shapes():
    cache = FlatKVCache(heads=4, dim=8, dim_v=6)
    q, k, v = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 6)
    with pytest.raises(ValueError, match=r"\[heads=4, dim=8\].*\(1, 8\)"):
        cache.append(q, k[:1], v)  # one head for an H=4 cache: no silent broadcast
    with pytest.raises(ValueError, match=r"\[heads=4, dim=8\]"):
        cache.append(q[:, :4], k, v)
    with pytest.raises(ValueError, match=r"v must be \[heads=4, dim_v=6\]"):
        cache.append(q, k, v[:1])
    with pytest.raises(ValueError, match=r"k must be \[T=3, heads=4, dim=8\]"):
        cache.extend(torch.randn(3, 1, 8), torch.randn(3, 4, 6))
    with pytest.raises(ValueError, match=r"v must be \[T=3, heads=4, dim_v=6\]"):
        cache.extend(torch.randn(3, 4, 8), torch.randn(2, 4, 6))
    assert cache.num_tokens == 0  # nothing was stored by the failed calls
    cache.append(q, k, v)
    assert cache.num_tokens == 1
