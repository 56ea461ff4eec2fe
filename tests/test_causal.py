"""``causal=True`` means strictly causal in every op and layer that accepts it: earlier rows
are bit-identical when later tokens change."""

import pytest
import torch

from hiergraph.data import from_nested, window_forest
from hiergraph.nn import ConeAttention, HierarchicalSelfAttention, HMatrixAttention, HTransformer1D
from hiergraph.ops import causal_hierarchical_attention, hierarchical_attention, hmatrix_attention

L = 24


def _qkv(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3)]


def _changed_after(x, t, dim, seed=1):
    """``x`` with every entry after position ``t`` along ``dim`` redrawn."""
    x = x.clone()
    later = x.narrow(dim, t + 1, x.size(dim) - t - 1)
    if x.is_floating_point():
        gen = torch.Generator().manual_seed(seed)
        later.copy_(torch.randn(later.shape, generator=gen, dtype=x.dtype))
    else:
        later.copy_((later + 1) % 50)
    return x


def _tree_ops():
    window = window_forest([L], (4, 3))  # equal fanout: the reshaped-view paths
    # ragged (the edge-list paths): paragraphs of sentences of 1-5 tokens, 24 in all
    sizes, leaf = [[3, 2], [1, 4, 2], [5], [2, 3, 2]], iter(range(L))
    nested = from_nested([[[next(leaf) for _ in range(n)] for n in p] for p in sizes])
    ops = {}
    assert window.tree_index().uniform is not None and nested.tree_index().uniform is None
    for name, tree in (("window", window), ("nested", nested)):
        ops[f"hierarchical_attention-{name}"] = lambda q, k, v, t=tree: hierarchical_attention(
            q, k, v, t, include_self=True, causal=True
        )
        ops[f"causal_hierarchical_attention-{name}"] = lambda q, k, v, t=tree: (
            causal_hierarchical_attention(q, k, v, t)
        )
        layer = HierarchicalSelfAttention(8, heads=2, include_self=True, causal=True).double()
        ops[f"HierarchicalSelfAttention-{name}"] = lambda q, k, v, t=tree, m=layer: m(
            (q + v).flatten(1), t
        )
    return ops


TREE_OPS = _tree_ops()


@pytest.mark.parametrize("name", sorted(TREE_OPS))
def test_tree_ops_and_layers(name):
    fn = TREE_OPS[name]
    q, k, v = _qkv(L)
    out = fn(q, k, v)
    for t in (0, 5, 11, L - 2):
        out2 = fn(*(_changed_after(x, t, 0) for x in (q, k, v)))
        assert torch.equal(out[: t + 1], out2[: t + 1]), t
        assert torch.isfinite(out2).all() and not torch.equal(out[t + 1 :], out2[t + 1 :])


def _sequence_ops():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    hmatrix = HMatrixAttention(8, 2, block_size=4, causal=True).double()
    lm = HTransformer1D(
        50, embed_dim=8, num_layers=2, num_heads=2, block_size=4, causal=True
    ).double()
    cone = ConeAttention(8, 2).double()  # [B, L, E] inputs
    x = torch.randn(2, 32, 8, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 50, (2, 32), generator=gen)
    return {
        "hmatrix_attention": (lambda q: hmatrix_attention(q, k, v, 4, causal=True), q, 2),
        "HMatrixAttention": (hmatrix, x, 1),
        "HTransformer1D": (lm, tokens, 1),
        "ConeAttention": (lambda x: cone(x, x, x, is_causal=True, need_weights=False)[0], x, 1),
    }


SEQUENCE_OPS = _sequence_ops()


@pytest.mark.parametrize("name", sorted(SEQUENCE_OPS))
def test_sequence_ops_and_layers(name):
    fn, x, dim = SEQUENCE_OPS[name]
    out = fn(x)
    for t in (0, 7, 20, 30):
        out2 = fn(_changed_after(x, t, dim))
        assert torch.equal(out.narrow(dim, 0, t + 1), out2.narrow(dim, 0, t + 1)), t
        assert not torch.equal(out, out2)
