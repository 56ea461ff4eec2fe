"""Hierarchical KV cache: incremental decoding equals the strictly causal full pass."""

import random
from collections import Counter

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import SignalHierarchy, from_nested, window_hierarchy
from hiergraph.nn.flat_kv_cache import FlatKVCache
from hiergraph.nn.hierarchical_kv_cache import HierarchicalKVCache
from hiergraph.nn.kv_schedule import append_schedule
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal import causal_hierarchical_attention
from hiergraph.plan import CausalPlan
from tests.conftest import (
    DispatchedOps,
    assert_same_nans,
    hsa_kernel,
    kernel_or_torch_ops,
    random_qkv,
    relative_error,
    rounding_error,
    spy_calls,
    with_nan,
)
from tests.ops.hsa.test_causal import ordered_spec


def decode(h, q, k, v, pos_emb=None, scale=None):
    """Feed the leaves of ``h`` one by one into a fresh cache; outputs stacked ``[L, H, d_v]``."""
    plan = CausalPlan.from_hierarchy(h)
    heads, dim = q.shape[1:]
    pos_dim = 0 if pos_emb is None else pos_emb.size(-1)
    cache = HierarchicalKVCache(heads, dim, v.size(-1), pos_dim=pos_dim, scale=scale, dtype=q.dtype)
    outs = []
    for i, (close, open_) in enumerate(append_schedule(plan).tolist()):
        m = int(plan.leaf_depth[i])
        slots = cache.new_node_slots(close, open_)
        new_nodes = plan.ancestors[i, m - open_ : m + 1]
        assert slots == [(int(h.depth[n]), int(h.slot[n])) for n in new_nodes]
        emb = None if pos_emb is None else pos_emb[new_nodes]
        outs.append(cache.append(q[i], k[i], v[i], close=close, open=open_, pos_emb=emb))
    return torch.stack(outs), cache


@pytest.fixture(params=["kernel", "torch-ops"])
def step(request, monkeypatch):
    """Decoding steps in the compiled kernel (its steps counted) or on PyTorch operations."""
    return kernel_or_torch_ops(request, monkeypatch, native, "kv_step")


def document_spec(rng, paragraphs=4):
    """document -> paragraphs -> sentences -> tokens, leaves numbered in reading order."""
    counter = iter(range(10**6))
    return [
        [[next(counter) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
        for _ in range(paragraphs)
    ]


def test_incremental_equals_full_pass_on_random_trees(step):
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
    assert step is None or step


def test_a_nan_query_decodes_like_the_full_pass(step):
    """A NaN in one token's query makes NaN the decoded outputs the full pass makes NaN (its
    own, and later tokens whose prefixes hold it), whether the steps run in the kernel or
    on PyTorch operations."""
    h = from_nested([[0, 1, [2, 3]], [4, 5], [[6, 7], 8]])
    q, k, v = random_qkv(h.num_leaves, seed=1)
    q = with_nan(q, 4).detach()
    full = causal_hierarchical_attention(q, k, v, h)
    inc, _ = decode(h, q, k, v)
    assert_same_nans(inc, full, atol=1e-12, rtol=0)
    assert step is None or step


def test_kernel_and_torch_steps_share_the_store(monkeypatch):
    """Steps that alternate between the kernel and PyTorch operations (the kernel turned on
    and off mid-sequence) decode like the full pass: both keep the same store."""
    hsa_kernel()
    steps = spy_calls(monkeypatch, native, "kv_step")
    h = from_nested(ordered_spec(random.Random(3), 80, 6, 5))
    plan = CausalPlan.from_hierarchy(h)
    q, k, v = random_qkv(h.num_leaves, seed=3)
    pe = torch.randn(h.num_nodes, q.size(1), 3, dtype=torch.float64)
    full = causal_hierarchical_attention(q, k, v, h, pos_emb=pe)
    cache = HierarchicalKVCache(q.size(1), q.size(2), v.size(2), pos_dim=3, dtype=q.dtype)
    outs = []
    for i, (close, open_) in enumerate(append_schedule(plan).tolist()):
        monkeypatch.setattr(native, "_enabled", i % 3 != 1)
        m = int(plan.leaf_depth[i])
        emb = pe[plan.ancestors[i, m - open_ : m + 1]]
        outs.append(cache.append(q[i], k[i], v[i], close=close, open=open_, pos_emb=emb))
    torch.testing.assert_close(torch.stack(outs), full, atol=1e-12, rtol=0)
    assert len(steps) == sum(i % 3 != 1 for i in range(len(outs)))  # the kernel's steps


def assert_decodes_like_the_full_pass(h, seed, pos_dim=3):
    """Token by token, the cache equals the strictly causal full pass (float64 and float32)."""
    q, k, v = random_qkv(h.num_leaves, seed=seed)
    pe = None
    if pos_dim:
        gen = torch.Generator().manual_seed(seed)
        pe = torch.randn(h.num_nodes, q.size(1), pos_dim, generator=gen, dtype=torch.float64)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        args = [t.to(dtype) for t in (q, k, v)]
        emb = None if pe is None else pe.to(dtype)
        full = causal_hierarchical_attention(*args, h, pos_emb=emb)
        inc, _ = decode(h, *args, pos_emb=emb)
        torch.testing.assert_close(inc, full, atol=tol, rtol=0, msg=f"seed {seed} {dtype}")


@pytest.mark.parametrize(
    ("max_depth", "max_branch", "num_leaves", "grows"),
    [(12, 3, 60, "levels"), (3, 24, 90, "capacity"), (10, 12, 150, "both")],
)
def test_incremental_equals_full_pass_on_deep_and_wide_trees(
    max_depth, max_branch, num_leaves, grows, step
):
    """Trees deeper than the initial store (8 levels) and families wider than its initial
    capacity (8 children): the store grows mid-sequence, with position embeddings."""
    rng = random.Random(max_depth * 100 + max_branch)
    grew = set()
    for seed in range(3):
        h = from_nested(ordered_spec(rng, num_leaves, max_depth, max_branch))
        assert_decodes_like_the_full_pass(h, seed)
        if int(h.depth.max()) > 8:
            grew.add("levels")
        if int(torch.bincount(h.parent[h.parent >= 0]).max()) > 8:
            grew.add("capacity")
    assert grew >= ({"levels", "capacity"} if grows == "both" else {grows}), grew


PATTERNS = pytest.mark.parametrize(
    "spec",
    [
        [[[[[[[[[[0, 1]]]]]]]]], 2],  # open 9 nodes at once, then close them all at once
        [[[0]], 1, [[2, [3]]], 4, [[[5], 6]], [7]],  # mixed close/open depths
        list(range(30)),  # leaves straight below the root (depth 1, a wide root)
        [0, [[[1, 2]]], 3, [[4, [5, [6, [7, 8]]]]], 9],  # leaf first, then deeper and back
        [[0], [1], [2], [[3], [4]], [[[5]]], [[[6]]]],  # one-leaf families (unary chains)
    ],
    ids=["chain", "mixed", "flat", "zigzag", "unary"],
)


@PATTERNS
@pytest.mark.parametrize("pos_dim", [0, 3])
def test_close_and_open_patterns(spec, pos_dim, step):
    h = from_nested(spec)
    for seed in range(2):
        assert_decodes_like_the_full_pass(h, seed, pos_dim=pos_dim)
    assert step is None or step


def prompt_tree(h, size):
    """The tree of the first ``size`` leaves of ``h`` (the nodes above them) and the ids of its
    nodes in ``h``, in the same order."""
    plan = CausalPlan.from_hierarchy(h)
    above = plan.ancestors[:size]
    keep = torch.zeros(h.num_nodes, dtype=torch.bool)
    keep[above[above >= 0]] = True
    ids = keep.nonzero().view(-1)
    new_id = torch.full((h.num_nodes,), -1).index_copy(0, ids, torch.arange(ids.numel()))
    parent = new_id[h.parent[ids]]
    parent[parent == torch.arange(ids.numel())] = -1  # the root
    return SignalHierarchy.from_parent(parent, slot=h.slot[ids]), ids


def assert_prefill_then_append_decodes_like_appends(h, sizes, seed, pos_dim=3):
    """For every prompt size, ``prefill`` then ``append`` gives the outputs, the families and
    the bytes of appending every token (float64)."""
    plan = CausalPlan.from_hierarchy(h)
    q, k, v = random_qkv(h.num_leaves, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    pe = torch.randn(h.num_nodes, q.size(1), pos_dim, generator=gen, dtype=q.dtype)
    emb = pe if pos_dim else None
    ref, ref_cache = decode(h, q, k, v, pos_emb=emb)
    events = append_schedule(plan).tolist()
    for size in sizes:
        prompt, ids = prompt_tree(h, size)
        cache = HierarchicalKVCache(q.size(1), q.size(2), v.size(2), pos_dim=pos_dim, dtype=q.dtype)
        outs = [cache.prefill(q[:size], k[:size], v[:size], prompt,
                              pos_emb=pe[ids] if pos_dim else None)]  # fmt: skip
        assert cache.num_tokens == size and outs[0].shape == (size, *v.shape[1:])
        for i in range(size, h.num_leaves):
            close, open_ = events[i]
            m = int(plan.leaf_depth[i])
            new = pe[plan.ancestors[i, m - open_ : m + 1]] if pos_dim else None
            outs.append(cache.append(q[i], k[i], v[i], close=close, open=open_, pos_emb=new)[None])
        torch.testing.assert_close(torch.cat(outs), ref, atol=1e-12, rtol=0, msg=f"size {size}")
        assert cache.family_sizes == ref_cache.family_sizes and cache.depth == ref_cache.depth
        assert cache.nbytes() == ref_cache.nbytes()


@pytest.mark.parametrize("pos_dim", [0, 3])
def test_prefill_then_append_equals_appending_every_token(pos_dim, step):
    """Prompts of every length cut from random mixed-depth trees, then decoding on: the
    same outputs, families and bytes as a cache that appended every token."""
    rng = random.Random(pos_dim)
    for seed in range(6):
        h = from_nested(ordered_spec(rng, rng.randint(2, 30)))
        if h.num_leaves < 2 or int(CausalPlan.from_hierarchy(h).leaf_depth.min()) < 1:
            continue
        assert_prefill_then_append_decodes_like_appends(
            h, range(1, h.num_leaves + 1), seed, pos_dim
        )
    assert step is None or step


def test_sequences_of_one_tree_decode_as_one_cache_of_their_heads(step):
    """``B`` sequences with the same events decode together as one cache of ``B * H`` heads
    (the class docstring's recipe): each sequence's outputs are those of its own cache."""
    h, batch, heads = window_hierarchy(40, (4, 3)), 3, 2
    sequences = [random_qkv(h.num_leaves, heads=heads, seed=seed) for seed in range(batch)]
    pe = torch.randn(
        h.num_nodes, heads, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    folded = [torch.cat(rows, 1) for rows in zip(*sequences, strict=True)]  # [L, B * H, ·]
    out, _ = decode(h, *folded, pos_emb=pe.repeat(1, batch, 1))
    for b, (q, k, v) in enumerate(sequences):
        ref, _ = decode(h, q, k, v, pos_emb=pe)
        torch.testing.assert_close(out[:, b * heads : (b + 1) * heads], ref, atol=1e-12, rtol=0)
    assert step is None or step


@PATTERNS
@pytest.mark.parametrize("pos_dim", [0, 3])
def test_prefill_at_every_close_and_open_pattern(spec, pos_dim):
    """A prompt ending at every token of trees that close and open families in every pattern
    (a path of one-child nodes, leaves below the root, unary chains)."""
    h = from_nested(spec)
    assert_prefill_then_append_decodes_like_appends(h, range(1, h.num_leaves + 1), 0, pos_dim)


def test_prefill_of_deep_wide_and_window_prompts(step):
    """Prompts whose tree is deeper or wider than the initial store (it grows to fit), and
    window-tree prefixes of a long sequence."""
    rng = random.Random(11)
    deep = from_nested(ordered_spec(rng, 60, 12, 3))
    wide = from_nested(ordered_spec(rng, 90, 3, 24))
    window = window_hierarchy(300, (4, 4, 4))
    for seed, (h, sizes) in enumerate(
        [(deep, (30, 59, 60)), (wide, (20, 45, 90)), (window, (1, 63, 64, 65, 200, 299))]
    ):
        assert_prefill_then_append_decodes_like_appends(h, sizes, seed)
    assert step is None or step


def test_prefill_runs_without_autograd_in_the_cache_dtype():
    h = from_nested([[0, 1], [2, [3, 4]], 5])
    q, k, v = random_qkv(h.num_leaves, seed=5)
    full = causal_hierarchical_attention(q, k, v, h)
    cache = HierarchicalKVCache(2, 4, 3, dtype=torch.float32)
    out = cache.prefill(*(t.clone().requires_grad_() for t in (q, k, v)), h)
    assert out.dtype == torch.float32 and not out.requires_grad
    torch.testing.assert_close(out, full.float(), atol=1e-6, rtol=0)


def test_bad_prefills():
    h = from_nested([[0, 1], [2, 3]])
    q = torch.randn(4, 2, 4)
    cache = HierarchicalKVCache(2, 4)
    with pytest.raises(ValueError, match=r"\[T=4, heads=2, dim=4\]"):
        cache.prefill(q[:3], q[:3], q[:3], h)
    with pytest.raises(ValueError, match="pos_emb"):
        cache.prefill(q, q, q, h, pos_emb=torch.zeros(h.num_nodes, 2, 3))
    with pytest.raises(ValueError, match="one tree"):
        batch = Batch.from_data_list([h, h])
        cache.prefill(torch.cat([q, q]), torch.cat([q, q]), torch.cat([q, q]), batch)
    with pytest.raises(ValueError, match="below a root"):
        cache.prefill(q[:1], q[:1], q[:1], SignalHierarchy.from_parent(torch.tensor([-1])))
    cache.prefill(q, q, q, h)
    with pytest.raises(ValueError, match="holds 4 tokens"):
        cache.prefill(q, q, q, h)


def test_inputs_are_cast_to_the_cache_dtype():
    h = from_nested([[0, 1, 2], [3, [4, 5]], 6])
    q, k, v = random_qkv(h.num_leaves, seed=4)
    full = causal_hierarchical_attention(q, k, v, h)
    cache = HierarchicalKVCache(2, 4, 3, dtype=torch.float64)
    events = append_schedule(h).tolist()
    out = [cache.append(q[i].float(), k[i].float(), v[i].float(), close=c, open=o)
           for i, (c, o) in enumerate(events)]  # fmt: skip
    assert all(t.dtype == torch.float64 for t in out)
    torch.testing.assert_close(torch.stack(out), full, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_caches_keep_their_sums_in_float32(dtype, step):
    """A bf16/fp16 cache stores its statistics (running sums) in float32 and rounds each
    output once: over the 4,096 tokens of a window tree its outputs err against float64 (on
    the same rounded inputs) as much as the float64 outputs rounded to ``dtype``, in the
    compiled step and on tensor operations. With a bf16 store they erred 170 times that
    (27%), with an fp16 one 4 times."""
    tree = window_hierarchy(4096, (16, 8, 4))
    q, k, v = (t.to(dtype) for t in random_qkv(4096, dim=8, dv=8, seed=1))
    out, _ = decode(tree, q, k, v)
    want = causal_hierarchical_attention(q.double(), k.double(), v.double(), tree)
    assert relative_error(out, want) <= 1.25 * rounding_error(want, dtype)
    assert out.dtype == dtype


def test_append_runs_without_autograd():
    """Inputs that require grad (a decoder's projections outside no_grad) decode the same,
    and the outputs carry no graph: the cache writes into preallocated buffers."""
    h = from_nested([[0, 1], [2, [3, 4]], 5])
    q, k, v = random_qkv(h.num_leaves, seed=5)
    events = append_schedule(h).tolist()
    outs = []
    for grad in (False, True):
        cache = HierarchicalKVCache(2, 4, 3, dtype=torch.float64)
        args = [t.clone().requires_grad_(grad) for t in (q, k, v)]
        outs.append(torch.stack([cache.append(*(t[i] for t in args), close=c, open=o)
                                 for i, (c, o) in enumerate(events)]))  # fmt: skip
    assert not outs[1].requires_grad
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)


def test_a_step_is_a_few_fused_ops_whatever_the_context(monkeypatch):
    """A token that continues its family costs the same few dispatched ops at every context
    (one batched attention for all levels, two ops per level for the energies), not a
    Python walk of many small ops per level (about 150 here, more as the context grew):
    the path of accelerators, without the CPU kernel."""
    monkeypatch.setattr(native, "_enabled", False)
    h = window_hierarchy(1200, (4, 4, 4, 4))  # depth 5 for every leaf
    cache = HierarchicalKVCache(2, 8)
    x = torch.randn(2, 8)
    counts = {}
    for i, (close, open_) in enumerate(append_schedule(h).tolist()):
        with DispatchedOps() as ops:
            cache.append(x, x, x, close=close, open=open_)
        if close == open_ == 0:
            counts.setdefault(i < 600, []).append(len(ops.calls))
    early, late = (Counter(counts[key]).most_common(1)[0][0] for key in (True, False))
    assert 0 < early == late <= 32, (early, late)


def test_append_has_no_host_sync(monkeypatch):
    """Every event kind (growth of the store included) runs without reading a tensor value
    on the host, as on an accelerator (without the CPU kernel)."""
    monkeypatch.setattr(native, "_enabled", False)
    from hiergraph._device import cpu_as_accelerator
    from tests.host_sync import HostSyncRecorder

    # a family of 12 (capacity grows), a chain 11 deep (levels grow), multi-level closes
    h = from_nested([list(range(12)), [[[[[[[[[[12, 13]]]]]]]]], 14], [15, [16, 17]], 18])
    plan = CausalPlan.from_hierarchy(h)
    q, k, v = random_qkv(h.num_leaves, seed=7)
    pe = torch.randn(h.num_nodes, 2, 3, dtype=torch.float64)
    events = append_schedule(plan).tolist()
    emb = [pe[plan.ancestors[i, int(plan.leaf_depth[i]) - o : int(plan.leaf_depth[i]) + 1]]
           for i, (_, o) in enumerate(events)]  # fmt: skip
    cache = HierarchicalKVCache(2, 4, 3, pos_dim=3, dtype=torch.float64)
    with cpu_as_accelerator(), HostSyncRecorder() as rec:
        for i, (close, open_) in enumerate(events):
            cache.append(q[i], k[i], v[i], close=close, open=open_, pos_emb=emb[i])
    assert int(h.depth.max()) > 8 and int(torch.bincount(h.parent[h.parent >= 0]).max()) > 8
    assert rec.num_ops > 0 and rec.unique_syncs() == []


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
    assert all(count <= b - 1 for count in cache.family_sizes[1:])
    assert cache.family_sizes[0] <= 4
    flat = FlatKVCache(2, 8)
    for i in range(n):
        flat.append(q[i], k[i], v[i])
    assert cache.nbytes() * 5 < flat.nbytes()


def test_bad_events_and_shapes():
    cache = HierarchicalKVCache(2, 4)
    q = torch.randn(2, 4)
    with pytest.raises(ValueError, match="first token"):
        cache.append(q, q, q, close=1)
    cache.append(q, q, q, open=1)
    with pytest.raises(ValueError, match="root is never closed"):
        cache.append(q, q, q, close=2)
    with pytest.raises(ValueError, match="open must be an int >= 0, got -1"):
        cache.append(q, q, q, open=-1)
    for bad in (1.5, True):  # (a slicing error; True was 1)
        with pytest.raises(TypeError, match="close must be an int >= 0"):
            cache.append(q, q, q, close=bad)
    with pytest.raises(ValueError, match=r"\[heads=2, dim=4\]"):
        cache.append(q[:1], q[:1], q[:1])
    with pytest.raises(ValueError, match="pos_emb"):
        cache.append(q, q, q, pos_emb=torch.zeros(1, 2, 3))


@pytest.mark.parametrize("scale", [0.0, -0.4, 1e-9])
def test_any_scale_decodes_like_the_full_pass(scale):
    """Every logit scale the full pass takes, zero included (all keys alike)."""
    h = from_nested(ordered_spec(random.Random(3), 14))
    q, k, v = random_qkv(h.num_leaves, seed=3)
    full = causal_hierarchical_attention(q, k, v, h, scale=scale)
    inc, _ = decode(h, q, k, v, scale=scale)
    torch.testing.assert_close(inc, full, atol=1e-12, rtol=0)


def test_the_kernel_step_checks_its_inputs():
    ext = hsa_kernel()
    cache = HierarchicalKVCache(2, 4, 3, dtype=torch.float64)
    store = (cache._keys, cache._values, cache._query, cache._prefix, cache._ng, cache._g)
    q, v = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    ext.kv_step(*store, q, q, v, 1, 1, [1], [1], 0, 0.5)
    with pytest.raises(RuntimeError, match="channels"):
        ext.kv_step(*store, q, q, q, 1, 1, [1], [1], 0, 0.5)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.kv_step(*store, q.float(), q, v, 1, 1, [1], [1], 0, 0.5)
    with pytest.raises(RuntimeError, match="bad slot"):
        ext.kv_step(*store, q, q, v, 1, 1, [1], [1], 1, 0.5)
    with pytest.raises(RuntimeError, match="bad depths"):
        ext.kv_step(*store, q, q, v, 1, 2, [1], [1], 0, 0.5)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.kv_step(cache._keys.mT, *store[1:], q, q, v, 1, 1, [1], [1], 0, 0.5)
