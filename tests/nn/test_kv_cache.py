"""Hierarchical KV cache: incremental decoding equals the strictly causal full pass."""

import random

import pytest
import torch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.nn.kv_cache import FlatKVCache, HierarchicalKVCache, append_schedule
from hiergraph.ops.hsa_causal import causal_hierarchical_attention
from hiergraph.plan import CausalPlan
from tests.conftest import random_qkv
from tests.ops.test_hsa_causal import ordered_spec


def decode(h, q, k, v, pos_emb=None):
    """Feed the leaves of ``h`` one by one into a fresh cache; outputs stacked ``[L, H, d_v]``."""
    plan = CausalPlan.from_hierarchy(h)
    heads, dim = q.shape[1:]
    pos_dim = 0 if pos_emb is None else pos_emb.size(-1)
    cache = HierarchicalKVCache(heads, dim, v.size(-1), pos_dim=pos_dim, dtype=q.dtype)
    outs = []
    for i, (close, open_) in enumerate(append_schedule(plan).tolist()):
        m = int(plan.leaf_depth[i])
        slots = cache.new_node_slots(close, open_)
        new_nodes = plan.ancestors[i, m - open_ : m + 1]
        assert slots == [(int(h.depth[n]), int(h.slot[n])) for n in new_nodes]
        emb = None if pos_emb is None else pos_emb[new_nodes]
        outs.append(cache.append(q[i], k[i], v[i], close=close, open=open_, pos_emb=emb))
    return torch.stack(outs), cache


def document_spec(rng, paragraphs=4):
    """document -> paragraphs -> sentences -> tokens, leaves numbered in reading order."""
    counter = iter(range(10**6))
    return [
        [[next(counter) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
        for _ in range(paragraphs)
    ]


def test_incremental_equals_full_pass_on_random_trees():
    rng = random.Random(0)
    tolerance = {torch.float32: 1e-6, torch.float64: 1e-12}
    for seed in range(12):
        spec = ordered_spec(rng, rng.randint(2, 24))
        if isinstance(spec, int):
            continue
        h = from_nested(spec)
        q, k, v = random_qkv(h.num_leaves, seed=seed)
        pe = torch.randn(h.num_nodes, 2, 3, generator=torch.Generator().manual_seed(seed))
        for dtype, tol in tolerance.items():
            args = [t.to(dtype) for t in (q, k, v)]
            full = causal_hierarchical_attention(*args, h, pos_emb=pe.to(dtype))
            inc, _ = decode(h, *args, pos_emb=pe.to(dtype))
            assert torch.isfinite(full).all() and torch.isfinite(inc).all(), (seed, dtype)
            torch.testing.assert_close(inc, full, atol=tol, rtol=0, msg=f"seed {seed} {dtype}")


def test_incremental_equals_full_pass_on_a_document_hierarchy():
    h = from_nested(document_spec(random.Random(1), paragraphs=3))
    q, k, v = (t.float() for t in random_qkv(h.num_leaves, heads=4, dim=16, dv=16, seed=1))
    full = causal_hierarchical_attention(q, k, v, h)
    inc, _ = decode(h, q, k, v)
    assert (inc - full).abs().max() <= 1e-6


def test_long_window_sequence_and_bounded_cache():
    n, b = 400, 3
    h = window_hierarchy(n, (b, b, b, b))  # 400 -> 134 -> 45 -> 15 -> 5 -> root
    q, k, v = (t.float() for t in random_qkv(n, heads=2, dim=8, dv=8, seed=2))
    full = causal_hierarchical_attention(q, k, v, h)
    inc, cache = decode(h, q, k, v)
    assert (inc - full).abs().max() <= 1e-6
    # right-skewed sub-tree: at most b - 1 closed children per open level
    assert cache.depth == 5
    assert all(level.count <= b - 1 for level in cache.levels[1:])
    assert cache.levels[0].count <= 4
    flat = FlatKVCache(2, 8)
    for i in range(n):
        flat.append(q[i], k[i], v[i])
    assert cache.nbytes() * 5 < flat.nbytes()


def test_append_schedule_of_a_small_tree():
    h = from_nested([[0, 1], [[2], 3], 4])
    assert append_schedule(h).tolist() == [[0, 1], [0, 0], [1, 2], [1, 0], [1, 0]]
    with pytest.raises(ValueError, match="one tree"):
        from torch_geometric.data import Batch

        append_schedule(Batch.from_data_list([h, h]))


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


def test_bad_events_and_shapes():
    cache = HierarchicalKVCache(2, 4)
    q = torch.randn(2, 4)
    with pytest.raises(ValueError, match="first token"):
        cache.append(q, q, q, close=1)
    cache.append(q, q, q, open=1)
    with pytest.raises(ValueError, match="root is never closed"):
        cache.append(q, q, q, close=2)
    with pytest.raises(ValueError, match=">= 0"):
        cache.append(q, q, q, open=-1)
    with pytest.raises(ValueError, match=r"\[heads=2, dim=4\]"):
        cache.append(q[:1], q[:1], q[:1])
    with pytest.raises(ValueError, match="pos_emb"):
        cache.append(q, q, q, pos_emb=torch.zeros(1, 2, 3))


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


def test_schedule_round_trip():
    from hiergraph.nn.hte_decoder import from_schedule

    rng = random.Random(5)
    for _ in range(10):
        spec = ordered_spec(rng, rng.randint(2, 20))
        if isinstance(spec, int):
            continue
        h = from_nested(spec)
        g = from_schedule(append_schedule(h))
        assert torch.equal(g.parent, h.parent) and torch.equal(g.slot, h.slot)
