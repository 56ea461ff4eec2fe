"""The argument and input checks the layers share (``hiergraph/nn/_checks.py``): those of
the KV caches, through both caches."""

import pytest
import torch

from hiergraph.nn.flat_kv_cache import FlatKVCache
from hiergraph.nn.hierarchical_kv_cache import HierarchicalKVCache

CACHES = pytest.mark.parametrize("cache", [HierarchicalKVCache, FlatKVCache])


@CACHES
def test_bad_cache_sizes(cache):
    for sizes, name in (((0, 4), "heads"), ((2, 0), "dim"), ((2, 4, 0), "dim_v")):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            cache(*sizes)
    with pytest.raises(TypeError, match="heads must be a positive int, got 2.0"):
        cache(2.0, 4)


@CACHES
@pytest.mark.parametrize(
    "scale, error", [(float("nan"), ValueError), (float("inf"), ValueError), ("0.5", TypeError),
                     (True, TypeError)]
)  # fmt: skip
def test_bad_cache_scales(cache, scale, error):
    with pytest.raises(error, match="scale must be a finite number"):
        cache(2, 4, scale=scale)


@CACHES
def test_bad_cache_dtypes(cache):
    """A complex cache dtype and integer inputs are refused (they were cast silently, the
    imaginary parts lost)."""
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        cache(2, 4, dtype=torch.complex64)
    q = torch.randn(2, 4)
    with pytest.raises(TypeError, match="k must be a floating-point tensor, got torch.int64"):
        cache(2, 4).append(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.long), q)
