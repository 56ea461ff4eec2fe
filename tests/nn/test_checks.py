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


def _layers():
    """``{name: (layer, call)}``, new layers, for each layer that checks its features:
    ``call(layer, x)`` runs it on features ``x`` (16 of them per row) of any dtype."""
    from hiergraph.data import from_nested
    from hiergraph.masks import window_mask
    from hiergraph.nn import (
        ConeAttention,
        ConeConv,
        GraphHSAConv,
        HierarchicalSelfAttention,
        HierarchicalTransformerEncoder,
        HMatrixAttention,
        MaskedAttentionConv,
        VCCEncoder,
    )

    tree, edges = from_nested([[0, 1, 2], [3, 4]]), window_mask(5, 1)
    vip = torch.tensor([[True, False, False, False, False]])
    return {
        "HierarchicalTransformerEncoder": (HierarchicalTransformerEncoder(16, 8, 1, 2),
                                           lambda layer, x: layer(x, tree)),
        "HierarchicalSelfAttention": (HierarchicalSelfAttention(16, heads=2),
                                      lambda layer, x: layer(x, tree)),
        "GraphHSAConv": (GraphHSAConv(16, None, heads=2, norm=None),
                         lambda layer, x: layer(x, edges, tree)),
        "ConeConv": (ConeConv(16, 8), lambda layer, x: layer(x, edges)),
        "MaskedAttentionConv": (MaskedAttentionConv(16, 8), lambda layer, x: layer(x, edges)),
        "HMatrixAttention": (HMatrixAttention(16, 2, block_size=2),
                             lambda layer, x: layer(x[None])),
        "ConeAttention": (ConeAttention(16, 2),
                          lambda layer, x: layer(x[None], x[None], x[None])),
        "VCCEncoder": (VCCEncoder(1, 16, 2, local_size=2), lambda layer, x: layer(x[None], vip)),
    }  # fmt: skip


LAYERS = pytest.mark.parametrize("name", list(_layers()))


@LAYERS
def test_features_of_another_dtype_than_the_layer_are_refused(name):
    """float64 features into a float32 layer: a ``TypeError`` that names both dtypes and
    the two ways out (it was PyTorch's "mat1 and mat2 must have the same dtype" or "m1
    and m2 ... double != float"); after ``layer.double()`` the same features run."""
    layer, call = _layers()[name]
    x = torch.randn(5, 16, dtype=torch.float64)
    layer.eval()
    message = r"^(x|query) is torch.float64 but the layer's parameters are torch.float32: "
    with pytest.raises(TypeError, match=message + "convert the model"):
        call(layer, x)
    assert call(layer.double(), x) is not None


@LAYERS
def test_integer_features_are_refused_as_token_ids(name):
    """``[L]`` token ids given as features: "must hold floating-point features ... token
    ids? embed them first" (it was "x must have 16 features ..., got 5")."""
    layer, call = _layers()[name]
    with pytest.raises(TypeError, match=r"floating-point features, got torch.int64 \(token ids"):
        call(layer, torch.arange(5 * 16).view(5, 16))


@LAYERS
def test_autocast_features_of_its_dtype_pass(name):
    """Under autocast the layer's float32 parameters meet bf16 features legitimately (the
    output of an earlier autocast layer)."""
    layer, call = _layers()[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.nn.Linear(16, 16)(torch.randn(5, 16))
        assert x.dtype == torch.bfloat16
        assert call(layer.eval(), x) is not None
