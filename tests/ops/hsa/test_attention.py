"""HSA invariants (Amizadeh et al.: exactness, row-stochasticity, batching) and the fast
path against the dense reference."""

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Batch

import hiergraph.ops.hsa.family_dense as family_attention
from hiergraph.data import SignalHierarchy, from_nested, random_window_hierarchy, window_hierarchy
from hiergraph.ops import (
    causal_hierarchical_attention,
    causal_hierarchical_attention_matrix,
    hierarchical_attention,
    hierarchical_attention_matrix,
    hierarchy_energy,
)
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.inputs import KERNELS
from hiergraph.plan import TreeIndex, family_block
from tests.conftest import (
    hsa_kernel,
    leaves_below,
    random_qkv,
    random_spec,
    spy_calls,
    unordered_backward_nodes,
)

F64 = dict(dtype=torch.float64)


def theta_fast(q, k, h, **kw):
    """Attention matrix from the fast path with one-hot values (V = I)."""
    num_leaves, heads, _ = q.shape
    eye = torch.eye(num_leaves, **F64).unsqueeze(1).expand(-1, heads, -1)
    return hierarchical_attention(q, k, eye, h, **kw).permute(1, 0, 2)


def apply(theta, v):
    return torch.einsum("hij,jhd->ihd", theta, v)


# ----------------------------------------------------------- fast == reference
def test_fast_equals_dense_reference_on_200_random_trees():
    """Done criterion of the foundation issue: <= 1e-10 on >= 200 mixed-depth trees."""
    rng = random.Random(0)
    trees, refs, qkvs = [], {False: [], True: []}, []
    for t in range(200):
        h = from_nested(random_spec(rng, rng.randint(1, 14)))
        q, k, v = random_qkv(h.num_leaves, seed=t)
        pe = torch.randn(h.num_nodes, 3, generator=torch.Generator().manual_seed(t), **F64)
        for inc in (False, True):
            ref = apply(hierarchical_attention_matrix(q, k, h, include_self=inc, pos_emb=pe), v)
            refs[inc].append(ref)
            for kernel in ("dense", "edge"):
                out = hierarchical_attention(
                    q, k, v, h, include_self=inc, pos_emb=pe, kernel=kernel
                )
                # assert_close fails on NaN (a running max(worst, nan) would keep worst)
                torch.testing.assert_close(out, ref, atol=1e-10, rtol=0, msg=f"tree {t}")
        trees.append(h)
        qkvs.append((q, k, v, pe))
    # the same 200 trees batched 20 at a time
    for start in range(0, 200, 20):
        batch = Batch.from_data_list(trees[start : start + 20])
        q, k, v, pe = (torch.cat(t) for t in zip(*qkvs[start : start + 20], strict=True))
        for inc, kernel in ((False, "dense"), (True, "dense"), (False, "edge"), (True, "edge")):
            out = hierarchical_attention(
                q, k, v, batch, include_self=inc, pos_emb=pe, kernel=kernel
            )
            ref = torch.cat(refs[inc][start : start + 20])
            assert (out - ref).abs().max().item() <= 1e-10


@pytest.mark.parametrize("causal", [False, True])
def test_dense_reference_takes_every_embedding_shape(causal):
    """``[N, c]``, ``[N, 1, c]`` (one head's rows for every head) and ``[N, H, c]`` as the
    op takes them; the one-head forms give the expanded form's matrix."""
    h = window_hierarchy(6, (2, 3))
    q, k, _ = random_qkv(6)  # 2 heads
    pe = torch.randn(h.num_nodes, 3, **F64)
    reference = causal_hierarchical_attention_matrix if causal else hierarchical_attention_matrix
    options = {} if causal else {"include_self": True}
    expanded = reference(q, k, h, pos_emb=pe[:, None].expand(-1, 2, -1), **options)
    for form in (pe, pe[:, None]):
        torch.testing.assert_close(reference(q, k, h, pos_emb=form, **options), expanded)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    num_leaves=st.integers(1, 24),
    max_depth=st.integers(1, 5),
    max_branch=st.integers(1, 7),
    include_self=st.booleans(),
    heads=st.integers(1, 3),
)
def test_property_fast_equals_reference(
    seed, num_leaves, max_depth, max_branch, include_self, heads
):
    rng = random.Random(seed)
    h = from_nested(random_spec(rng, num_leaves, max_depth, max_branch))
    q, k, v = random_qkv(num_leaves, heads=heads, seed=seed)
    theta = hierarchical_attention_matrix(q, k, h, include_self=include_self)
    for kernel in ("dense", "edge"):
        out = hierarchical_attention(q, k, v, h, include_self=include_self, kernel=kernel)
        assert torch.allclose(out, apply(theta, v), atol=1e-12, rtol=0)
    rows = theta.sum(-1)
    if num_leaves > 1 or include_self:
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-12)
    assert torch.all(theta >= 0)


@pytest.mark.parametrize("slice_saving", [None, 30.0])  # default; runs of >= 4 slots slice
@pytest.mark.parametrize("branching", [(2, 3), (4, 2, 2), (8,), (2, 4, 8), (2, 2, 2, 2)])
def test_window_hierarchies_equal_reference(monkeypatch, branching, slice_saving):
    """Fixed windows (slice and gather blocks, broadcast views) = the dense reference,
    with partial last windows, padding, positions, with and without include-self."""
    if slice_saving is not None:
        monkeypatch.setattr(family_block, "SLICE_SAVING", slice_saving)
    for n in (37, 64):
        h = window_hierarchy(n, branching)
        q, k, v = random_qkv(n, heads=2, seed=n)
        pe = torch.randn(h.num_nodes, 3, generator=torch.Generator().manual_seed(1), **F64)
        mask = torch.rand(n, generator=torch.Generator().manual_seed(2)) > 0.2
        for inc in (False, True):
            opts = dict(include_self=inc, pos_emb=pe, leaf_mask=mask)
            ref = apply(hierarchical_attention_matrix(q, k, h, **opts), v) * mask[:, None, None]
            for kernel in ("dense", "edge"):
                out = hierarchical_attention(q, k, v, h, kernel=kernel, **opts)
                assert (out - ref).abs().max() <= 1e-12


@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_without_size_bias_equals_reference(kernel):
    """``size_bias=False`` = the reference without log n(B), on ragged
    families, with padding and positions; gradients through the hand-written backward."""
    gen = torch.Generator().manual_seed(3)
    h = Batch.from_data_list([random_window_hierarchy(n, (3, 2), generator=gen) for n in (13, 6)])
    q, k, v = random_qkv(h.num_leaves, heads=2, dim=3, dv=2, seed=7)
    pe = torch.randn(h.num_nodes, 2, generator=torch.Generator().manual_seed(0), **F64)
    mask = torch.rand(h.num_leaves, generator=gen) > 0.2
    for inc in (False, True):
        opts = dict(include_self=inc, pos_emb=pe, leaf_mask=mask)
        ref = hierarchical_attention_matrix(q, k, h, size_bias=False, **opts)
        out = hierarchical_attention(q, k, v, h, kernel=kernel, size_bias=False, **opts)
        assert (out - apply(ref, v) * mask[:, None, None]).abs().max() <= 1e-12
        biased = hierarchical_attention(q, k, v, h, kernel=kernel, **opts)
        assert (out - biased).abs().max() > 1e-3

    def fn(q, k, v):
        return hierarchical_attention(q, k, v, h, kernel=kernel, size_bias=False, leaf_mask=mask)

    assert torch.autograd.gradcheck(fn, tuple(t.requires_grad_(True) for t in (q, k, v)))


@pytest.mark.parametrize("kernel", ["dense", "edge"])
@pytest.mark.parametrize("opts", [{}, {"include_self": True, "leaky_causal": True}])
def test_backward_adds_rows_in_index_order(kernel, opts):
    """Every gather of the forward is an ``index_select`` (or a slice), so the backward adds
    gradient rows in index order and a multi-threaded CPU backward is bitwise reproducible
    (``x[index]`` accumulates with unordered atomic adds; the edge kernel used it)."""
    h = Batch.from_data_list([window_hierarchy(24, (2, 3)), window_hierarchy(10, (4,))])
    q, k, v = (t.requires_grad_() for t in random_qkv(h.num_leaves))
    pe = torch.randn(h.num_nodes, 2, generator=torch.Generator().manual_seed(0), **F64)
    out = hierarchical_attention(q, k, v, h, kernel=kernel, pos_emb=pe, **opts)
    assert unordered_backward_nodes(out) == []


def test_kernels_agree_on_large_ragged_batch_with_gradients():
    gen = torch.Generator().manual_seed(4)
    trees = [random_window_hierarchy(n, (5, 3, 2), generator=gen) for n in (300, 1, 77, 150)]
    h = Batch.from_data_list(trees)
    q, k, v = random_qkv(h.num_leaves, heads=3, dim=5, dv=4, seed=5)
    pe = torch.randn(h.num_nodes, 1, 2, **F64)
    results = []
    for kernel in ("dense", "edge"):
        inputs = [t.clone().requires_grad_(True) for t in (q, k, v, pe)]
        out = hierarchical_attention(*inputs[:3], h, pos_emb=inputs[3], kernel=kernel)
        out.sin().sum().backward()
        results.append([out, *(t.grad for t in inputs)])
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("limit", [1, 7, 60])
@pytest.mark.parametrize("include_self,causal", [(False, False), (True, False), (True, True)])
def test_memory_guard_chunked_blocks_equal_dense(monkeypatch, limit, include_self, causal):
    """Blocks above MAX_BLOCK_ELEMENTS run in query-row chunks: same output and gradients."""
    monkeypatch.setattr(family_block, "SLICE_SAVING", 30.0)  # runs of >= 4 slots slice
    rng = random.Random(limit)
    trees = [from_nested(random_spec(rng, rng.randint(1, 30), max_branch=9)) for _ in range(12)]
    trees.append(window_hierarchy(40, (8, 5)))  # slice blocks too
    h = Batch.from_data_list(trees)
    q, k, v = random_qkv(h.num_leaves, heads=2, seed=limit)
    pe = torch.randn(h.num_nodes, 2, 3, generator=torch.Generator().manual_seed(1), **F64)
    opts = dict(include_self=include_self, leaky_causal=causal)
    ref = apply(hierarchical_attention_matrix(q, k, h, pos_emb=pe, **opts), v)
    results = []
    for max_elements in (family_attention.MAX_BLOCK_ELEMENTS, limit):
        monkeypatch.setattr(family_attention, "MAX_BLOCK_ELEMENTS", max_elements)
        inputs = [t.clone().requires_grad_(True) for t in (q, k, v, pe)]
        out = hierarchical_attention(*inputs[:3], h, pos_emb=inputs[3], **opts)
        out.sin().sum().backward()
        results.append([out, *(t.grad for t in inputs)])
    assert (results[1][0] - ref).abs().max() <= 1e-12
    for a, b in zip(*results, strict=True):
        assert (a - b).abs().max() <= 1e-12


def test_memory_guard_chunks_cover_a_giant_family(monkeypatch):
    """A 1,500-leaf family (one block) is cut into row chunks of at most the limit."""
    monkeypatch.setattr(family_attention, "MAX_BLOCK_ELEMENTS", 1 << 18)
    h = window_hierarchy(1500, (1500,))
    (block,) = h.tree_index().levels[-1].blocks
    chunks = family_attention._row_chunks(block, heads=3)
    assert len(chunks) == 26 and chunks[0].start == 0 and chunks[-1].stop == 1500  # 58 rows
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:], strict=False))
    assert max(block.count * 3 * (c.stop - c.start) * 1500 for c in chunks) <= 1 << 18
    q, k, v = random_qkv(1500, heads=3, seed=2)
    out = hierarchical_attention(q.float(), k.float(), v.float(), h)
    ref = hierarchical_attention(q, k, v, h, kernel="edge")
    assert torch.allclose(out.double(), ref, atol=1e-5)


def _prune(spec, keep: set):
    """``spec`` without the leaves outside ``keep`` (and the sub-trees left empty)."""
    if isinstance(spec, int):
        return spec if spec in keep else None
    children = [c for c in (_prune(c, keep) for c in spec) if c is not None]
    return children or None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    include_self=st.booleans(),
    kernel=st.sampled_from(["dense", "edge"]),
)
def test_property_batched_and_padded_equal_per_example(seed, sizes, include_self, kernel):
    """Batched = per-example, and masked leaves = the tree without them."""
    rng = random.Random(seed)
    specs = [random_spec(rng, n) for n in sizes]
    q, k, v = random_qkv(sum(sizes), seed=seed)
    mask = torch.rand(sum(sizes), generator=torch.Generator().manual_seed(seed)) > 0.3
    opts = dict(include_self=include_self, kernel=kernel)
    batch = Batch.from_data_list([from_nested(s) for s in specs])
    out = hierarchical_attention(q, k, v, batch, **opts)
    padded = hierarchical_attention(q, k, v, batch, leaf_mask=mask, **opts)
    assert torch.all(padded[~mask] == 0)
    start = 0
    for spec, n in zip(specs, sizes, strict=True):
        part = slice(start, start + n)
        alone = hierarchical_attention(q[part], k[part], v[part], from_nested(spec), **opts)
        assert torch.allclose(out[part], alone, atol=1e-12, rtol=0)
        kept = mask[part].nonzero().view(-1).tolist()
        pruned = _prune(spec, set(kept))
        if pruned is not None:
            relabel = {old: new for new, old in enumerate(kept)}

            def rename(s, relabel=relabel):
                return relabel[s] if isinstance(s, int) else [rename(c) for c in s]

            rows = torch.tensor(kept) + start
            ref = hierarchical_attention(
                q[rows], k[rows], v[rows], from_nested(rename(pruned)), **opts
            )
            assert torch.allclose(padded[rows], ref, atol=1e-12, rtol=0)
        start += n


# ------------------------------------------------------------- flat reduction
def test_flat_tree_is_softmax_without_diagonal():
    n = 9
    q, k, v = random_qkv(n, heads=3, dim=8, dv=5)
    h = from_nested(list(range(n)))
    pe = torch.randn(h.num_nodes, 4, **F64)
    logits = torch.einsum("ihd,jhd->hij", q, k) / 8**0.5 + (pe[:n] @ pe[:n].T)
    masked = logits.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    expected = apply(torch.softmax(masked, -1), v)
    assert torch.allclose(hierarchical_attention(q, k, v, h, pos_emb=pe), expected, atol=1e-13)


def test_flat_tree_include_self_is_standard_sdpa():
    n = 12
    q, k, v = random_qkv(n, heads=2, dim=8, dv=8)
    out = hierarchical_attention(q, k, v, window_hierarchy(n, ()), include_self=True)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    assert torch.allclose(out, ref.transpose(0, 1), atol=1e-13)


# ---------------------------------------------------- structure of the matrix
@pytest.mark.parametrize("seed", range(6))
def test_row_stochastic_and_block_constraint(seed):
    rng = random.Random(seed)
    h = from_nested(random_spec(rng, 16, max_depth=4, max_branch=4))
    q, k, v = random_qkv(16, seed=seed)
    theta = theta_fast(q, k, h)
    assert torch.allclose(theta.sum(-1), torch.ones(2, 16, **F64), atol=1e-12)
    assert torch.all(theta >= 0) and torch.all(torch.diagonal(theta, dim1=1, dim2=2) == 0)
    const = torch.full((16, 2, 3), 2.5, **F64)
    assert torch.allclose(hierarchical_attention(q, k, const, h), const, atol=1e-12)
    # block constraint: theta[:, i, j] constant over i in l(A), j in l(B) for siblings A != B
    below = leaves_below(h, 16)
    idx = h.tree_index()
    free_values = 0
    for start, size in zip(idx.family_start.tolist(), idx.family_size.tolist(), strict=True):
        members = idx.order[start : start + size].tolist()
        free_values += size * (size - 1)
        for a in members:
            for b in members:
                if a != b:
                    block = theta[:, below[a]][:, :, below[b]]
                    spread = block.amax((1, 2)) - block.amin((1, 2))
                    assert torch.all(spread <= 1e-14)
    for head in theta:
        off = head[~torch.eye(16, dtype=torch.bool)]
        assert len(torch.unique(off.round(decimals=12))) <= free_values


def test_uniform_case_any_tree():
    rng = random.Random(3)
    for _ in range(5):
        n = rng.randint(2, 20)
        h = from_nested(random_spec(rng, n))
        zero = torch.zeros(n, 1, 4, **F64)
        theta = theta_fast(zero, zero, h)[0]
        expected = (torch.ones(n, n, **F64) - torch.eye(n, **F64)) / (n - 1)
        assert torch.allclose(theta, expected, atol=1e-14)


def test_shift_invariance_not_scale_invariance():
    rng = random.Random(5)
    h = from_nested(random_spec(rng, 15))
    q, k, v = random_qkv(15)
    # a constant extra coordinate adds 0.5 * 3 * 2 = 3 to every energy (self energies too)
    q3 = torch.cat([q, torch.full((15, 2, 1), 3.0, **F64)], -1)
    k3 = torch.cat([k, torch.full((15, 2, 1), 2.0, **F64)], -1)
    for inc in (False, True):
        base = hierarchical_attention(q, k, v, h, scale=0.5, include_self=inc)
        shifted = hierarchical_attention(q3, k3, v, h, scale=0.5, include_self=inc)
        assert torch.allclose(base, shifted, atol=1e-12)
        scaled = hierarchical_attention(q, k, v, h, scale=1.0, include_self=inc)
        assert torch.isfinite(scaled).all()  # (NaN would also be 'not close')
        assert not torch.allclose(base, scaled, atol=1e-3)


def test_unary_node_transparency():
    """Wrapping a sub-tree or leaf in a single-child node that takes over its PE changes nothing."""
    # leaves 0..3 first, then internal nodes (ids are kept): root 4, node 5 over leaves 0 and 1
    plain = SignalHierarchy.from_parent([5, 5, 4, 4, -1, 4])
    # the same tree with node 5 wrapped by 6 and leaf 2 wrapped by 7
    wrapped = SignalHierarchy.from_parent([5, 5, 7, 4, -1, 6, 4, 4])
    assert plain.parent.tolist() == [5, 5, 4, 4, 4, 4]
    pe_plain = torch.randn(6, 3, **F64)
    pe_wrapped = torch.cat([pe_plain, pe_plain[[5, 2]]])  # wrappers copy their child's PE
    q, k, v = random_qkv(4, seed=7)
    for inc in (False, True):
        a = hierarchical_attention(q, k, v, plain, pos_emb=pe_plain, include_self=inc)
        b = hierarchical_attention(q, k, v, wrapped, pos_emb=pe_wrapped, include_self=inc)
        assert torch.allclose(a, b, atol=1e-14)


def test_child_permutation_and_leaf_relabelling_equivariance():
    rng = random.Random(11)
    spec = random_spec(rng, 12, max_depth=3, max_branch=4)
    h = from_nested(spec)
    q, k, v = random_qkv(12, seed=2)
    base = hierarchical_attention(q, k, v, h)

    def reverse(s):
        return s if isinstance(s, int) else [reverse(c) for c in reversed(s)]

    assert torch.allclose(
        hierarchical_attention(q, k, v, from_nested(reverse(spec))), base, atol=1e-13
    )
    sigma = list(range(12))
    rng.shuffle(sigma)  # leaf r becomes leaf sigma[r]

    def relabel(s):
        return sigma[s] if isinstance(s, int) else [relabel(c) for c in s]

    inv = torch.argsort(torch.tensor(sigma))
    out = hierarchical_attention(q[inv], k[inv], v[inv], from_nested(relabel(spec)))
    assert torch.allclose(out, base[inv], atol=1e-13)


# ---------------------------------------------------------------- batching
def test_batch_equals_per_example_and_dummy_root_leaks():
    rng = random.Random(21)
    specs = [random_spec(rng, n) for n in (5, 9, 1, 7)]
    trees = [from_nested(s) for s in specs]
    q, k, v = random_qkv(22, seed=3)
    out = hierarchical_attention(q, k, v, Batch.from_data_list(trees))
    start = 0
    for t in trees:
        part = slice(start, start + t.num_leaves)
        assert torch.allclose(
            out[part], hierarchical_attention(q[part], k[part], v[part], t), atol=1e-14
        )
        start += t.num_leaves

    def shift(s, off):
        return s + off if isinstance(s, int) else [shift(c, off) for c in s]

    offsets = [0, 5, 14, 15]
    joint = from_nested([shift(s, o) for s, o in zip(specs, offsets, strict=True)])  # unmasked root
    leaked = hierarchical_attention(q, k, v, joint)
    assert (leaked - out).abs().max() > 1e-3


@pytest.mark.parametrize("branching", [(2, 4), (4, 2)])  # (4, 2): node-major leaf families
def test_padding_invariance(branching):
    """Masked leaves, whatever their finite rows hold, are removed from every statistic."""
    q, k, v = random_qkv(32, seed=4)
    n = 21
    mask = torch.arange(32) < n
    q, k, v = (torch.where(mask[:, None, None], t, 1e3 * t) for t in (q, k, v))
    for inc in (False, True):
        ref = hierarchical_attention(q[:n], k[:n], v[:n], window_hierarchy(n, branching),
                                     include_self=inc)  # fmt: skip
        for kernel in KERNELS:
            out = hierarchical_attention(
                q,
                k,
                v,
                window_hierarchy(32, branching),
                leaf_mask=mask,
                include_self=inc,
                kernel=kernel,
            )
            assert torch.allclose(out[:n], ref, atol=1e-13) and torch.all(out[n:] == 0)
    # masked leaves anywhere in a ragged tree = the tree without them
    h = from_nested([[0, 1, 2], [3, [4, 5]], 6])
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 1], dtype=torch.bool)
    small = from_nested([[0, 1], [2], 3])  # leaves 0, 2, 3, 6 of the padded tree
    keep = mask.nonzero().view(-1)
    qs, ks, vs = random_qkv(7, seed=8)
    out = hierarchical_attention(qs, ks, vs, h, leaf_mask=mask, include_self=True)
    ref = hierarchical_attention(qs[keep], ks[keep], vs[keep], small, include_self=True)
    assert torch.allclose(out[keep], ref, atol=1e-14)


# ------------------------------------------------------- optimality, gradient
def test_gradient_identity_with_energy():
    """With V = K: out_i = -(N / tau) dphi(R)/dq_i."""
    rng = random.Random(8)
    for inc in (False, True):
        h = from_nested(random_spec(rng, 10, max_depth=3))
        q, k, _ = random_qkv(10, heads=2, dim=4, seed=9)
        pe = torch.randn(h.num_nodes, 2, generator=torch.Generator().manual_seed(0), **F64)
        q.requires_grad_(True)
        phi = hierarchy_energy(q, k, h, pos_emb=pe, include_self=inc, scale=0.5)
        (grad,) = torch.autograd.grad(phi.sum(), q)
        out = hierarchical_attention(q.detach(), k, k, h, pos_emb=pe, include_self=inc, scale=0.5)
        assert torch.allclose(out, -10 / 0.5 * grad, atol=1e-12)


def _kl(theta, target):
    mask = theta > 0
    return (theta[mask] * (theta[mask].log() - target[mask].log())).sum()


def _feasible(h, gate_logits, sibling_logits, n):
    """A block-constrained row-stochastic matrix from free gates and sibling distributions."""
    pairs = h.tree_index().sibling_pairs
    order = h.tree_index().order
    q_node, k_node = order[pairs[0]], order[pairs[1]]
    theta = torch.zeros(n, n, **F64)
    below = leaves_below(h, n)
    for leaf in range(n):
        path, a = [], leaf
        while h.parent[a] != a:
            path.append(a)
            a = int(h.parent[a])
        mass = torch.ones((), **F64)
        for c in reversed(path):
            keys = k_node[q_node == c]
            mu = torch.zeros((), **F64) if h.is_leaf[c] else torch.sigmoid(gate_logits[c])
            if keys.numel() == 0:
                mu = torch.ones((), **F64)
            probs = torch.softmax(sibling_logits[c][: keys.numel()], 0)
            for b, p in zip(keys.tolist(), probs, strict=True):
                theta[leaf, below[b]] = mass * (1 - mu) * p / len(below[b])
            mass = mass * mu
    return theta


def test_kl_optimality():
    """HSA's matrix is the KL-closest block-constrained stochastic matrix to flat attention."""
    h = from_nested([[0, 1, [2, 3]], [4, 5], 6])
    n = 7
    q, k, _ = random_qkv(n, heads=1, dim=3, seed=12)
    pe = torch.randn(h.num_nodes, 2, generator=torch.Generator().manual_seed(0), **F64)
    theta = hierarchical_attention_matrix(q, k, h, pos_emb=pe)[0]
    # flat target (eq. 13): energies of leaf pairs with highest-distinct-ancestor PEs
    anc = [[leaf] for leaf in range(n)]
    for path in anc:
        while h.parent[path[-1]] != path[-1]:
            path.append(int(h.parent[path[-1]]))
    logits = torch.full((n, n), float("-inf"), **F64)
    for i in range(n):
        for j in range(n):
            if i != j:
                common = set(anc[i]) & set(anc[j])
                a = next(x for x in anc[i] if int(h.parent[x]) in common)
                b = next(x for x in anc[j] if int(h.parent[x]) in common)
                logits[i, j] = q[i, 0] @ k[j, 0] / 3**0.5 + pe[a] @ pe[b]
    target = torch.softmax(logits, -1)
    best = _kl(theta, target)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):  # random feasible matrices are never better
        cand = _feasible(
            h,
            torch.randn(h.num_nodes, generator=gen, **F64) * 3,
            torch.randn(h.num_nodes, n, generator=gen, **F64) * 3,
            n,
        )
        assert torch.allclose(cand.sum(1), torch.ones(n, **F64))
        assert _kl(cand, target) >= best - 1e-12
    # and a generic optimiser over the feasible set converges to HSA's matrix
    gate = torch.zeros(h.num_nodes, **F64, requires_grad=True)
    sib = torch.zeros(h.num_nodes, n, **F64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [gate, sib],
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = _kl(_feasible(h, gate, sib, n), target)
        loss.backward()
        return loss

    opt.step(closure)
    found = _feasible(h, gate, sib, n).detach()
    assert abs(_kl(found, target) - best) < 1e-9
    assert torch.allclose(found, theta, atol=1e-4)


def test_edge_kernel_on_the_cpu_kernel_equals_tensor_operations(monkeypatch):
    """``kernel="edge"`` on the CPU runs the family softmax in the compiled kernel
    (:func:`~hiergraph.ops.hsa.native.edge_softmax`); elsewhere gathers and scatters. Both
    give the same outputs and gradients (float64) with masked leaves, embeddings shared by
    the heads or per head, self energies and left-sibling masking."""
    hsa_kernel()
    calls = spy_calls(monkeypatch, native, "edge_softmax")
    rng = random.Random(8)
    for seed in range(12):
        h = from_nested(random_spec(rng, rng.randint(2, 16)))
        q, k, v = random_qkv(h.num_leaves, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        pe = torch.randn(h.num_nodes, *((2,) if seed % 2 else ()), 3, generator=gen, **F64)
        mask = torch.rand(h.num_leaves, generator=gen) > 0.2
        leaky = seed % 4 == 1  # (needs self energies)
        options = dict(include_self=leaky or seed % 3 == 0, leaky_causal=leaky, kernel="edge")
        inputs = [t.clone().requires_grad_() for t in (q, k, v, pe)]
        results = []
        for on in (True, False):
            monkeypatch.setattr(native, "_enabled", on)
            out = hierarchical_attention(
                *inputs[:3], h, pos_emb=inputs[3], leaf_mask=mask, **options
            )
            results.append((out, *torch.autograd.grad(out.square().sum(), inputs)))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=f"seed {seed}")
    assert calls


@pytest.mark.parametrize("kernel", ["dense", "edge"])
@pytest.mark.parametrize("include_self", [False, True])
def test_gradcheck(kernel, include_self):
    h = Batch.from_data_list([from_nested([[0, 1, [2, 3]], 4]), from_nested([[0], [1, 2]])])
    q, k, v = random_qkv(8, heads=2, dim=3, dv=2, seed=13)
    pe = torch.randn(h.num_nodes, 2, generator=torch.Generator().manual_seed(0), **F64)
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 1, 0], dtype=torch.bool)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, pe))

    def fn(q, k, v, pe):
        return hierarchical_attention(
            q, k, v, h, pos_emb=pe, include_self=include_self, leaf_mask=mask, kernel=kernel
        )

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize(
    "spec", [0, [0], [[0], [1, 2]], [[[0]], 1], [[0, 1], [[2]]], list(range(5))]
)
def test_degenerate_trees_are_nan_free(spec):
    h = from_nested(spec)
    n = h.num_leaves
    for inc, causal in ((False, False), (True, False), (True, True)):
        for mask in (None, torch.zeros(n, dtype=torch.bool)):
            q, k, v = (t.requires_grad_(True) for t in random_qkv(n, seed=1))
            out = hierarchical_attention(
                q, k, v, h, include_self=inc, leaky_causal=causal, leaf_mask=mask
            )
            # (a lone leaf without self energy outputs 0 * v: a loss on it has a backward)
            out.square().sum().backward()
            for t in (out, q.grad, k.grad, v.grad):
                assert t is None or torch.isfinite(t).all()
            assert v.grad is not None


def test_float32_large_logits_stable():
    h = window_hierarchy(64, (4, 4))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(64, 2, 8, generator=gen) * 40
    k = torch.randn(64, 2, 8, generator=gen) * 40
    v = torch.randn(64, 2, 8, generator=gen)
    out = hierarchical_attention(q, k, v, h)
    ref = hierarchical_attention(q.double(), k.double(), v.double(), h)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.allclose(out.double(), ref, atol=1e-4)


# ------------------------------------------------------------------ causal
def test_leaky_causal_masks_future_values_and_documents_leak():
    n = 12
    h = window_hierarchy(n, (2, 3))
    q, k, v = random_qkv(n, seed=6)
    theta = theta_fast(q, k, h, include_self=True, leaky_causal=True)
    ref = hierarchical_attention_matrix(q, k, h, include_self=True, leaky_causal=True)
    assert torch.allclose(theta, ref, atol=1e-13)
    assert torch.all(theta.triu(1) == 0)
    assert torch.allclose(theta.sum(-1), torch.ones(2, n, **F64), atol=1e-12)
    # the documented leak: the last token's query moves earlier rows through ancestor means
    q2 = q.clone()
    q2[-1] += 5.0
    theta2 = theta_fast(q2, k, h, include_self=True, leaky_causal=True)
    assert (theta2[:, :-1] - theta[:, :-1]).abs().max() > 1e-6
    for flag in ("causal", "leaky_causal"):
        with pytest.raises(ValueError, match="include_self"):
            hierarchical_attention(q, k, v, h, **{flag: True})


def test_causal_is_strictly_causal_and_equals_the_causal_op():
    """``causal=True`` is the prefix-statistics op: earlier rows are bit-identical when
    later tokens change."""
    n = 12
    h = window_hierarchy(n, (2, 3))
    q, k, v = random_qkv(n, seed=7)
    out = hierarchical_attention(q, k, v, h, include_self=True, causal=True)
    ref = causal_hierarchical_attention(q, k, v, h)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    for t in range(n - 1):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[t + 1 :] += torch.randn_like(x[t + 1 :])
        out2 = hierarchical_attention(q2, k2, v2, h, include_self=True, causal=True)
        assert torch.equal(out2[: t + 1], out[: t + 1])
    with pytest.raises(ValueError, match="not both"):
        hierarchical_attention(q, k, v, h, include_self=True, causal=True, leaky_causal=True)
    with pytest.raises(ValueError, match="leaf_mask"):
        mask = torch.ones(n, dtype=torch.bool)
        hierarchical_attention(q, k, v, h, include_self=True, causal=True, leaf_mask=mask)


@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_causal_runs_the_kernel_asked_for(monkeypatch, kernel):
    """``causal=True`` passes ``kernel`` on to the causal op (it was dropped: ``'edge'`` ran
    the reshaped views); the block kernel has no causal form and is refused."""
    from hiergraph.ops.hsa import causal

    calls = spy_calls(monkeypatch, causal, "_edge_attention")
    h = window_hierarchy(12, (2, 3))
    q, k, v = random_qkv(12, seed=5)
    out = hierarchical_attention(q, k, v, h, include_self=True, causal=True, kernel=kernel)
    assert len(calls) == (kernel == "edge")
    torch.testing.assert_close(out, causal_hierarchical_attention(q, k, v, h, kernel="edge"))
    with pytest.raises(ValueError, match="the strictly causal op's"):
        hierarchical_attention(q, k, v, h, include_self=True, causal=True, kernel="blocks")


@pytest.mark.parametrize("causal", [False, True])
def test_every_form_of_the_hierarchy_gives_the_same_result(causal):
    """A hierarchy, its batch, its ``TreeIndex`` and its ``CausalPlan`` are the same tree
    (a plan's index is a field, the others' a method)."""
    h = window_hierarchy(12, (2, 3))
    q, k, v = random_qkv(12, seed=3)
    index = h.tree_index()
    forms = (h, Batch.from_data_list([h]), index, index.causal_plan)
    outs = [hierarchical_attention(q, k, v, f, include_self=True, causal=causal) for f in forms]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=0, rtol=0)


# ---------------------------------------------------------------- bad input
def test_bad_inputs():
    h = window_hierarchy(6, (2,))
    q, k, v = random_qkv(6)
    with pytest.raises(ValueError, match="6 leaves"):
        hierarchical_attention(q[:5], k[:5], v[:5], h)
    with pytest.raises(ValueError, match="same shape"):
        hierarchical_attention(q, k[..., :3], v, h)
    with pytest.raises(ValueError, match=r"\[num_leaves, heads, dim\]"):
        hierarchical_attention(q[None], k[None], v[None], h)
    with pytest.raises(TypeError, match="floating dtype"):
        hierarchical_attention(q, k, v.float(), h)
    for no_heads_or_channels in ((q[:, :0], k[:, :0], v[:, :0]), (q[..., :0], k[..., :0], v)):
        with pytest.raises(ValueError, match="at least one head and one channel"):
            hierarchical_attention(*no_heads_or_channels, h)
    for kernel in ("dense", "blocks", "edge"):  # (the block and edge kernels crashed)
        with pytest.raises(ValueError, match="v needs at least one channel"):
            hierarchical_attention(q, k, v[..., :0], h, kernel=kernel)
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got ndarray"):
        hierarchical_attention(q.numpy(), k, v, h)  # (before: an error of the autocast check)
    with pytest.raises(
        TypeError, match="hierarchy must be a SignalHierarchy.*CausalPlan, got NoneType"
    ):
        hierarchical_attention(q, k, v, None)
    with pytest.raises(ValueError, match=r"leaf_mask must be a \[6\] bool tensor.*got list"):
        hierarchical_attention(q, k, v, h, leaf_mask=[True] * 6)
    with pytest.raises(ValueError, match="pos_emb"):
        hierarchical_attention(q, k, v, h, pos_emb=torch.randn(6, 2, **F64))
    table = torch.randn(h.num_nodes, 2, **F64)
    for causal in (False, True):  # (a native-kernel error, or a cast dropping the imaginary part)
        options = dict(include_self=True, causal=causal)
        with pytest.raises(ValueError, match="pos_emb is on meta but q is on cpu"):
            hierarchical_attention(q, k, v, h, pos_emb=table.to("meta"), **options)
        with pytest.raises(TypeError, match="pos_emb must be a floating-point tensor, got torch.c"):
            hierarchical_attention(q, k, v, h, pos_emb=table.to(torch.complex128), **options)
    with pytest.raises(ValueError, match="leaf_mask is on meta but q is on cpu"):
        hierarchical_attention(q, k, v, h, leaf_mask=torch.ones(6, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="leaf_mask"):
        hierarchical_attention(q, k, v, h, leaf_mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="kernel"):
        hierarchical_attention(q, k, v, h, kernel="flash")
    learned = torch.tensor(0.7, requires_grad=True)  # (its gradient was silently dropped)
    for causal in (False, True):
        with pytest.raises(TypeError, match="scale must be a number, got Tensor"):
            hierarchical_attention(q, k, v, h, include_self=True, causal=causal, scale=learned)
        with pytest.raises(ValueError, match="scale must be finite, got nan"):
            hierarchical_attention(q, k, v, h, include_self=True, causal=causal, scale=float("nan"))
    two_d = hierarchical_attention(q[:, 0], k[:, 0], v[:, 0], h)
    assert torch.allclose(two_d, hierarchical_attention(q[:, :1], k[:, :1], v[:, :1], h)[:, 0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_half_precision_with_large_families_is_close_to_float32(dtype, kernel):
    """Two families of 600 leaves: child sums and leaf counts are accumulated in float32,
    so bf16/fp16 stay within their rounding of the float32 result (bf16 child sums used to
    stall at 256: a relative error of 0.25 instead of <= 0.03). The edge kernel sums over
    sibling pairs in float32 too (its bf16 k-gradient was 0.45 off, its fp16 q-gradient 0.28)."""
    h = SignalHierarchy.from_parent([-1, 0, 0] + [1] * 600 + [2] * 600)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1200, 2, 8, generator=gen) + 1 for _ in range(3))
    q, k, v = (t.to(dtype).float() for t in (q, k, v))  # the same inputs in both dtypes
    q32, k32, v32 = (t.clone().requires_grad_() for t in (q, k, v))
    ref = hierarchical_attention(q32, k32, v32, h, kernel=kernel)
    qh, kh, vh = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = hierarchical_attention(qh, kh, vh, h, kernel=kernel)
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max()
    ref.square().sum().backward()
    out.float().square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (qh, kh, vh))
    pairs = [(kh, k32), (vh, v32)]
    if kernel == "edge":  # the dense dq is a small difference of large half terms: noise
        pairs.append((qh, q32))
    for half, full in pairs:
        assert (half.grad.float() - full.grad).abs().max() < 0.05 * full.grad.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["blocks", "edge"])
def test_half_precision_general_path_computes_in_float32(dtype, kernel):
    """On ragged trees, half inputs with large logits stay within their output rounding of
    the float64 result on the same (rounded) inputs: the block kernel's half logits gave
    NaN in fp16 past 65504 and bf16 errors of 0.3-2 (v ~ N(0, 1))."""
    h = random_window_hierarchy(200, (4, 4, 2), generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(0)
    for scale in (10.0, 120.0):  # logits of about 300 and 40,000
        q, k, v = (torch.randn(200, 2, 8, generator=gen, **F64) * s for s in (scale, scale, 1))
        q, k, v = (t.to(dtype) for t in (q, k, v))
        ref = hierarchical_attention(*(t.double() for t in (q, k, v)), h, kernel="edge")
        out = hierarchical_attention(q, k, v, h, kernel=kernel)
        assert out.dtype == dtype and torch.isfinite(out).all()
        eps = torch.finfo(dtype).eps
        assert (out.double() - ref).abs().max() <= 2 * eps * ref.abs().max()


@pytest.mark.parametrize("causal", [False, True])
def test_autocast_runs_mixed_inputs_in_the_autocast_dtype(causal):
    """Under autocast, float32 q, k (as a layer norm hands them over) and bf16 v run as
    bf16 inputs would; outside autocast mixed dtypes stay an error."""
    h = window_hierarchy(24, (4, 3))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(24, 2, 8, generator=gen).bfloat16() for _ in range(3))
    flags = {"causal": causal, "include_self": causal}
    expected = hierarchical_attention(q, k, v, h, **flags)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hierarchical_attention(q.float(), k.float(), v, h, **flags)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    with pytest.raises(TypeError, match="floating dtype"):
        hierarchical_attention(q.float(), k.float(), v, h, **flags)


def test_meta_tensors_infer_the_output_shape():
    """Meta tensors (shape inference) have no autocast state: the op runs on them."""
    index = window_hierarchy(24, (4, 3)).tree_index().to("meta")
    q = torch.empty(24, 2, 8, device="meta")
    out = hierarchical_attention(q, q, q[..., :5], index)
    assert out.device.type == "meta" and out.shape == (24, 2, 5)


def test_float16_leaf_counts_above_65504_stay_finite():
    """A node over 65536 leaves: its count is kept in float32 (fp16 tops out at 65504) and
    only log n(B) is rounded to fp16; the result matches float32."""
    h = window_hierarchy(70000, (16, 16, 16, 16))  # top windows of 65536 and 4464 leaves
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(70000, 1, 4, generator=gen).half().float() for _ in range(3))
    ref = hierarchical_attention(q, k, v, h)
    out = hierarchical_attention(q.half(), k.half(), v.half(), h)
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() < 0.02 * ref.abs().max()


def test_the_dense_reference_takes_deep_trees_and_names_what_it_cannot_read():
    """Energies bottom-up, not by recursion (past Python's recursion limit, about 1,000
    levels, it raised RecursionError); a tree index has no node arrays to read."""
    parent = torch.cat([torch.arange(1, 1201), torch.tensor([5])])
    parent[1199] = -1  # a chain of 1,200 nodes over leaf 0, and a second leaf under node 5
    h = SignalHierarchy.from_parent(parent)
    q = torch.randn(2, 1, 3, dtype=torch.float64)
    theta = hierarchical_attention_matrix(q, q, h, include_self=True)
    out = hierarchical_attention(q, q, q, h, include_self=True)
    torch.testing.assert_close(torch.einsum("hij,jhc->ihc", theta, q), out, rtol=0, atol=1e-12)
    with pytest.raises(TypeError, match="hierarchy must be a SignalHierarchy.*got TreeIndex"):
        hierarchical_attention_matrix(q, q, h.tree_index())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_an_empty_forest_gives_an_empty_output(causal, kernel):
    """A forest of no node (a batch that filtered every tree out): an empty output on the
    inputs' graph (the plan's levels are none: a ValueError from torch.cat, an IndexError)."""
    empty = torch.zeros(0, dtype=torch.long)
    index = TreeIndex.from_parent(empty, empty, empty.bool())
    q = torch.randn(0, 2, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(0, 2, 3, dtype=torch.float64, requires_grad=True)
    out = hierarchical_attention(q, q, v, index, include_self=True, causal=causal, kernel=kernel)
    assert out.shape == (0, 2, 3) and out.dtype == torch.float64
    out.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape
    flat = hierarchical_attention(q[:, 0], q[:, 0], v[:, 0], index, include_self=True,
                                  causal=causal, kernel=kernel)  # fmt: skip
    assert flat.shape == (0, 3)
