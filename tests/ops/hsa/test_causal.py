"""Strictly causal HSA: dense reference, causality by perturbation, reductions, bad input."""

import itertools
import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import causal, native
from hiergraph.ops.hsa.causal import causal_hierarchical_attention, causal_statistics
from hiergraph.ops.hsa.causal_dense import causal_hierarchical_attention_matrix
from hiergraph.plan import CausalPlan, TreeIndex
from tests.conftest import hsa_kernel, kernel_or_torch_ops, random_qkv, random_spec, spy_calls

F64 = dict(dtype=torch.float64)


def ordered_spec(rng, num_leaves, max_depth=4, max_branch=5):
    """A random mixed-depth spec (tests/conftest.py) with leaves numbered left to right."""
    counter = itertools.count()

    def relabel(spec):
        return next(counter) if isinstance(spec, int) else [relabel(c) for c in spec]

    return relabel(random_spec(rng, num_leaves, max_depth, max_branch))


def prefix_spec(spec, i):
    """The spec restricted to leaves ``<= i`` (empty families dropped)."""
    if isinstance(spec, int):
        return spec if spec <= i else None
    kept = [c for c in (prefix_spec(c, i) for c in spec) if c is not None]
    return kept or None


def random_case(rng, seed, num_leaves=None, heads=2):
    num_leaves = num_leaves or rng.randint(1, 14)
    spec = ordered_spec(rng, num_leaves)
    h = from_nested(spec)
    q, k, v = random_qkv(num_leaves, heads=heads, seed=seed)
    pe = torch.randn(h.num_nodes, heads, 3, generator=torch.Generator().manual_seed(seed), **F64)
    return spec, h, q, k, v, pe


PATHS = ["causal-kernel", "edge-kernel", "torch-ops"]


def causal_path(request, monkeypatch, kernel: str) -> list[dict] | None:
    """For a fixture with ``params=PATHS``: the compiled causal kernel (the calls of
    ``native.kernel`` counted), the edge lists with their softmax in the compiled kernel (its
    calls counted), or the edge lists on PyTorch operations (gathers and scatters, as on
    accelerators; ``None``)."""
    if request.param == "torch-ops":
        monkeypatch.setattr(native, "_enabled", False)
        return None
    hsa_kernel()
    if request.param == "edge-kernel":
        monkeypatch.setattr(native, "applies_to_causal", lambda *args: False)
        return spy_calls(monkeypatch, native, "edge_softmax")
    return spy_calls(monkeypatch, native, kernel)


@pytest.fixture(params=PATHS)
def edges(request, monkeypatch):
    """What runs the strictly causal op on a ragged tree (:func:`causal_path`)."""
    return causal_path(request, monkeypatch, "causal_forest_attention")


@pytest.fixture(params=["kernel", "torch-ops"])
def edge_lists(request, monkeypatch):
    """The edge lists' softmax in the compiled kernel (its calls counted) or on PyTorch
    operations."""
    return kernel_or_torch_ops(request, monkeypatch, native, "edge_softmax")


def test_equals_dense_reference_on_random_trees(edges):
    rng = random.Random(0)
    for seed in range(10):
        _, h, q, k, v, pe = random_case(rng, seed)
        for emb in (None, pe):
            out = causal_hierarchical_attention(q, k, v, h, pos_emb=emb)
            theta = causal_hierarchical_attention_matrix(q, k, h, pos_emb=emb)
            ref = torch.einsum("hij,jhd->ihd", theta, v)
            assert torch.isfinite(out).all(), f"seed {seed}"
            torch.testing.assert_close(out, ref, atol=1e-12, rtol=0, msg=f"seed {seed}")
    assert edges is None or edges


@pytest.fixture(params=PATHS)
def statistics_path(request, monkeypatch):
    """What computes ``causal_statistics`` (:func:`causal_path`)."""
    return causal_path(request, monkeypatch, "causal_forest_statistics")


def test_statistics_pass_gives_the_output_and_node_sums(statistics_path):
    """``causal_statistics`` (what a cache's prefill reads): the op's output, every node's
    sums of ``q, k, v`` over its leaves, and finite energies (a root's 0). That the energies
    are those of incremental decoding is checked through the cache
    (``tests/nn/test_hierarchical_kv_cache.py``)."""
    rng = random.Random(5)
    for seed in range(4):
        h = from_nested(ordered_spec(rng, rng.randint(2, 20)))
        q, k, v = random_qkv(h.num_leaves, seed=seed)
        pe = torch.randn(h.num_nodes, 3, dtype=torch.float64)
        out, sums, energy = causal_statistics(q, k, v, h, pos_emb=pe, scale=0.7)
        ref = causal_hierarchical_attention(q, k, v, h, pos_emb=pe, scale=0.7)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
        plan = CausalPlan.of(h)
        below = (plan.ancestors[None] == torch.arange(h.num_nodes)[:, None, None]).any(-1)
        rows = torch.cat([q, k, v], -1).flatten(1)  # [L, H * (d + d + d_v)]
        torch.testing.assert_close(sums.flatten(1), below.double() @ rows, atol=1e-12, rtol=0)
        root = plan.ancestors[0, 0]
        assert torch.isfinite(energy).all() and (energy[root] == 0).all()
    assert statistics_path is None or statistics_path


@pytest.mark.parametrize("pos", [False, True])
def test_statistics_kernel_equals_the_edge_lists(monkeypatch, pos):
    """The compiled kernel's statistics equal the edge lists' (float64): the outputs, every
    node's sums and its complete energy, on random trees (a single leaf among them), a
    window tree and a batch of trees, with embeddings per head."""
    hsa_kernel()
    rng = random.Random(9)
    trees = [from_nested(ordered_spec(rng, size)) for size in (1, 2, 7, 13, 20)]
    cases = [*trees, window_hierarchy(37, (4, 3)), Batch.from_data_list(trees)]
    calls = spy_calls(monkeypatch, native, "causal_forest_statistics")
    for seed, h in enumerate(cases):
        q, k, v = random_qkv(h.num_leaves, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        pe = torch.randn(h.num_nodes, 2, 3, generator=gen, **F64) if pos else None
        got = causal_statistics(q, k, v, h, pos_emb=pe, scale=0.7)
        with monkeypatch.context() as edges_only:
            edges_only.setattr(native, "applies_to_causal", lambda *args: False)
            ref = causal_statistics(q, k, v, h, pos_emb=pe, scale=0.7)
        for name, a, b in zip(("out", "sums", "energy"), got, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=f"{name}, case {seed}")
    assert len(calls) == len(cases)


def test_statistics_with_gradients_run_on_the_edge_lists(monkeypatch):
    """Inputs that record gradients take the differentiable edge lists, not the kernel."""
    hsa_kernel()
    calls = spy_calls(monkeypatch, native, "causal_forest_statistics")
    h = from_nested(ordered_spec(random.Random(3), 9))
    q, k, v = (t.requires_grad_() for t in random_qkv(h.num_leaves, seed=1))
    out, sums, energy = causal_statistics(q, k, v, h)
    (out.sum() + sums.sum() + energy.sum()).backward()
    assert not calls and all(t.grad is not None for t in (q, k, v))
    with torch.no_grad():
        causal_statistics(q, k, v, h)
    assert len(calls) == 1


def test_float32_inputs_with_a_float64_position_table():
    """The position table is cast to q's dtype, as in the non-causal op."""
    _, h, q, k, v, pe = random_case(random.Random(2), 2)
    out = causal_hierarchical_attention(q.float(), k.float(), v.float(), h, pos_emb=pe)
    ref = causal_hierarchical_attention(q, k, v, h, pos_emb=pe)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)


def test_reference_rows_are_causal_and_stochastic():
    rng = random.Random(1)
    for seed in range(5):
        _, h, q, k, _, pe = random_case(rng, seed, num_leaves=10)
        theta = causal_hierarchical_attention_matrix(q, k, h, pos_emb=pe)
        assert torch.equal(theta, theta.tril())
        assert torch.allclose(theta.sum(-1), torch.ones(2, 10, **F64), atol=1e-12)
        assert (theta >= 0).all()


def test_perturbing_the_future_leaves_rows_bit_identical():
    """Change q, k, v of every leaf after i and the embeddings of the nodes that start after
    i: rows 0..i do not change by a single bit. Cut the tree after leaf i: they do not change
    beyond rounding."""
    rng = random.Random(2)
    for seed in range(25):
        spec, h, q, k, v, pe = random_case(rng, seed, num_leaves=rng.randint(2, 24))
        out = causal_hierarchical_attention(q, k, v, h, pos_emb=pe)
        i = rng.randrange(h.num_leaves - 1)
        future = torch.arange(h.num_leaves) > i
        gen = torch.Generator().manual_seed(seed + 1000)
        q2, k2, v2 = (t.clone() for t in (q, k, v))
        for t in (q2, k2, v2):
            t[future] = torch.randn(t[future].shape, generator=gen, **F64)
        pe2 = pe.clone()
        starts_later = CausalPlan.from_hierarchy(h).first_leaf > i
        pe2[starts_later] = torch.randn(pe2[starts_later].shape, generator=gen, **F64)
        out2 = causal_hierarchical_attention(q2, k2, v2, h, pos_emb=pe2)
        assert torch.equal(out[: i + 1], out2[: i + 1])
        assert torch.isfinite(out2).all() and not torch.equal(out[i + 1 :], out2[i + 1 :])
        # the tree truncated after leaf i (a different structure for the future)
        hp = from_nested(prefix_spec(spec, i))
        plan_p = CausalPlan.from_hierarchy(hp)
        # node ids differ between the trees: map embeddings through (first leaf, depth)
        plan = CausalPlan.from_hierarchy(h)
        key = {
            (int(f), int(d)): n
            for n, (f, d) in enumerate(zip(plan.first_leaf, h.depth, strict=True))
        }
        pick = [key[(int(f), int(d))] for f, d in zip(plan_p.first_leaf, hp.depth, strict=True)]
        out3 = causal_hierarchical_attention(
            q[: i + 1], k[: i + 1], v[: i + 1], hp, pos_emb=pe[pick]
        )
        # other tensor shapes in the batched kernels: equal up to one rounding step
        assert (out[: i + 1] - out3).abs().max() <= 1e-15


def test_paper_causal_masking_leaks_and_prefix_statistics_do_not():
    """The paper's causal masking (sib_L alone) leaks: a future key changes earlier rows."""
    h = window_hierarchy(12, (2, 3))
    q, k, v = random_qkv(12, heads=1, seed=3)
    k2 = k.clone()
    k2[-1] += 1.0
    paper = hierarchical_attention(q, k, v, h, include_self=True, leaky_causal=True)
    paper2 = hierarchical_attention(q, k2, v, h, include_self=True, leaky_causal=True)
    assert (paper[:-1] - paper2[:-1]).abs().max() > 1e-3  # the leak
    ours = causal_hierarchical_attention(q, k, v, h)
    ours2 = causal_hierarchical_attention(q, k2, v, h)
    assert torch.equal(ours[:-1], ours2[:-1])
    # the last row sees the whole tree: both definitions agree there
    assert torch.allclose(ours[-1], paper[-1], atol=1e-13)


def test_last_row_of_every_tree_equals_paper_causal_hsa():
    rng = random.Random(4)
    for seed in range(30):
        _, h, q, k, v, pe = random_case(rng, seed)
        ours = causal_hierarchical_attention(q, k, v, h, pos_emb=pe)
        paper = hierarchical_attention(q, k, v, h, pos_emb=pe, include_self=True, leaky_causal=True)
        assert torch.allclose(ours[-1], paper[-1], atol=1e-12)


def test_flat_tree_is_standard_causal_softmax():
    h = window_hierarchy(9, ())  # a root over 9 leaves
    q, k, v = random_qkv(9, heads=2, seed=5)
    out = causal_hierarchical_attention(q, k, v, h)
    logits = torch.einsum("ihd,jhd->hij", q, k) / 2.0
    logits = logits.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.einsum("hij,jhd->ihd", logits.softmax(-1), v)
    assert torch.allclose(out, ref, atol=1e-13)


def test_batch_equals_per_tree_results():
    rng = random.Random(6)
    cases = [random_case(rng, seed) for seed in range(8)]
    batch = Batch.from_data_list([c[1] for c in cases])
    q, k, v, pe = (torch.cat([c[j] for c in cases]) for j in (2, 3, 4, 5))
    out = causal_hierarchical_attention(q, k, v, batch, pos_emb=pe)
    ref = torch.cat([causal_hierarchical_attention(*c[2:5], c[1], pos_emb=c[5]) for c in cases])
    assert torch.allclose(out, ref, atol=1e-13)


def test_gradients_are_causal_and_finite(edges):
    h = from_nested([[0, 1, [2, 3]], [4], [[5, 6], 7]])
    q, k, v = (t.requires_grad_() for t in random_qkv(8, heads=2, seed=7))
    out = causal_hierarchical_attention(q, k, v, h)
    out[3].sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
        assert t.grad[4:].abs().max() == 0
        assert t.grad[:4].abs().max() > 0
    small = from_nested([[0, 1], [2, 3]])
    inputs = [t.requires_grad_() for t in random_qkv(4, heads=1, dim=2, dv=1, seed=7)]
    assert torch.autograd.gradcheck(
        lambda q, k, v: causal_hierarchical_attention(q, k, v, small), inputs
    )
    ragged = from_nested([[0, [1, 2, 3]], [4], [5, 6]])  # first children, a unary node
    gen = torch.Generator().manual_seed(4)
    inputs = [torch.randn(*shape, generator=gen, **F64).requires_grad_()
              for shape in ((7, 2, 3), (7, 2, 3), (7, 2, 2), (ragged.num_nodes, 2, 2))]  # fmt: skip
    assert torch.autograd.gradcheck(
        lambda q, k, v, pe: causal_hierarchical_attention(q, k, v, ragged, pos_emb=pe), inputs
    )
    assert edges is None or edges


def test_float32_matches_float64():
    h = window_hierarchy(200, (4, 4))
    q, k, v = random_qkv(200, heads=2, dim=8, dv=8, seed=8)
    out64 = causal_hierarchical_attention(q, k, v, h)
    out32 = causal_hierarchical_attention(q.float(), k.float(), v.float(), h)
    assert (out32.double() - out64).abs().max() < 1e-5


def test_bad_inputs():
    h = from_nested([[0, 1], [2]])
    q, k, v = random_qkv(3, seed=9)
    with pytest.raises(ValueError, match="depth-first order"):
        causal_hierarchical_attention(q, k, v, from_nested([[0, 2], [1]]))
    with pytest.raises(ValueError, match="3 leaves"):
        causal_hierarchical_attention(q[:2], k[:2], v[:2], h)
    with pytest.raises(ValueError, match="same shape"):
        causal_hierarchical_attention(q, k[..., :2], v, h)
    with pytest.raises(TypeError, match="floating"):
        causal_hierarchical_attention(q.long(), k.long(), v.long(), h)
    with pytest.raises(ValueError, match="pos_emb"):
        causal_hierarchical_attention(q, k, v, h, pos_emb=torch.zeros(2, 3, **F64))
    with pytest.raises(TypeError, match="SignalHierarchy"):
        causal_hierarchical_attention(q, k, v, object())


def test_plan_ranks_count_left_siblings():
    # slots with gaps: the rank is the place among the siblings, not the slot
    tree = from_nested([[0, 1], 2, [3, [4, 5, 6]]])
    tree.slot = tree.slot * 3 + 1
    plan = CausalPlan.from_hierarchy(tree)
    ref = torch.zeros(tree.num_nodes, dtype=torch.long)
    for v in range(tree.num_nodes):
        p = int(tree.parent[v])
        if p != v:
            siblings = ((tree.parent == p) & (torch.arange(tree.num_nodes) != p)).nonzero()
            ref[v] = int((tree.slot[siblings] < tree.slot[v]).sum())
    assert torch.equal(plan.sibling_rank, ref)
    assert torch.equal(plan.sibling_rank, torch.bincount(plan.sib_query, minlength=tree.num_nodes))


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 6e-3), (torch.float16, 1e-3)])
def test_half_precision_with_large_families_is_close_to_float32(dtype, tol):
    # two families of 600 leaves: in bf16 the leaf counts stopped at 256 and the prefix
    # sums stalled (max error 0.012 bf16 / 0.0015 fp16 of max |ref|); everything now
    # accumulates in float32 and only the output is rounded (0.0036 / 0.0005)
    tree = from_nested([list(range(600)), list(range(600, 1200))])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1200, 2, 8, generator=gen) + 1 for _ in range(3))
    ref = causal_hierarchical_attention(q, k, v, tree)
    out = causal_hierarchical_attention(q.to(dtype), k.to(dtype), v.to(dtype), tree)
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max() < tol * ref.abs().max()


def test_edge_path_second_derivatives_on_a_ragged_tree(edge_lists):
    """First children (no left sibling: ``lse = -inf``), a unary node and leaves at several
    depths: first and second derivatives stay exact and NaN-free."""
    tree = from_nested([[0, [1, 2, 3]], [4], [5, 6]])
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(7, 2, 3, generator=gen, **F64).requires_grad_() for _ in range(3))
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: causal_hierarchical_attention(q, k, v, tree, kernel="edge"),
        (q, k, v),
        fast_mode=True,
    )
    assert edge_lists is None or edge_lists


@pytest.mark.parametrize(
    "kernels,wide_fanout,view_limit,path",
    [
        ("off", None, None, "views"),  # the alternative: edge lists
        ("on", 8, None, "views"),  # the alternative: the kernel over a wide family
        ("on", None, None, "kernel"),  # a narrow family: the kernel
        ("off", None, 100, "edges"),  # past MAX_VIEW_ELEMENTS
    ],
)
def test_an_equal_forest_past_the_logit_limit_runs_where_it_is_cheapest(
    kernels, wide_fanout, view_limit, path, monkeypatch
):
    """Stars of 24 leaves whose logits exceed the limit of ``fits`` (lowered here) run as
    reshaped views where the alternative is the edge lists or the kernel over a wide
    family, up to ``MAX_VIEW_ELEMENTS``; the result is the edge lists' either way."""
    monkeypatch.setattr("hiergraph.ops.hsa.family_dense.MAX_BLOCK_ELEMENTS", 64)
    if kernels == "off":
        monkeypatch.setattr(native, "_enabled", False)
    else:
        hsa_kernel()
    if wide_fanout:
        monkeypatch.setattr(native, "WIDE_FANOUT", wide_fanout)
    if view_limit:
        monkeypatch.setattr(causal, "MAX_VIEW_ELEMENTS", view_limit)
    h = Batch.from_data_list([from_nested(list(range(24)))] * 3)
    q, k, v = random_qkv(72, seed=3)
    ref = causal_hierarchical_attention(q, k, v, h, kernel="edge")
    views = spy_calls(monkeypatch, causal, "uniform_causal_attention")
    kernel_calls = spy_calls(monkeypatch, native, "causal_forest_attention")
    out = causal_hierarchical_attention(q, k, v, h)
    ran = "views" if views else "kernel" if kernel_calls else "edges"
    assert ran == path
    assert (out - ref).abs().max() <= 1e-12


def test_the_views_build_no_causal_plan():
    """Equal-fanout forests run as reshaped views, which read the tree index alone: the
    causal plan (left-sibling edges, root paths) is not built for them (a flat family of
    8,192 leaves took 1.6 s to plan); other forests build it, and it checks their order."""
    flat = window_hierarchy(64, (64,))
    q = torch.randn(64, 2, 4)
    causal_hierarchical_attention(q, q, q, flat)
    assert "causal_plan" not in flat.tree_index().__dict__
    ragged = from_nested([[0, 1], [2, 3, 4]])
    causal_hierarchical_attention(q[:5], q[:5], q[:5], ragged, kernel="edge")
    assert "causal_plan" in ragged.tree_index().__dict__
    # padded views too check the leaf order first: two trees whose leaves alternate
    alternating = TreeIndex.from_parent(
        torch.tensor([5, 6, 5, 6, 6, 5, 6]), torch.tensor([0, 0, 1, 1, 2, 0, 0]),
        torch.tensor([True] * 5 + [False] * 2),
    )  # fmt: skip
    assert alternating.padded is not None
    for kernel in ("dense", "edge"):
        with pytest.raises(ValueError, match="depth-first order"):
            causal_hierarchical_attention(q[:5], q[:5], q[:5], alternating, kernel=kernel)


def test_compiled_by_inductor_on_a_ragged_forest_equals_eager():
    """Inductor (PyTorch 2.13) fused reads of the edge lists' scatters ahead of their writes:
    on a forest of ragged trees the compiled op's outputs were wrong (by 1.8 in float64, no
    error) or its generated code failed. The edge lists now run eagerly inside a compiled
    function; outputs and gradients equal eager ones."""
    rng = random.Random(3)
    forest = Batch.from_data_list([from_nested(ordered_spec(rng, n)) for n in (20, 12, 9)])
    plan = forest.causal_plan()
    q, k, v = (t.requires_grad_() for t in random_qkv(41, heads=2, seed=3))
    pe = torch.randn(forest.num_nodes, 2, 3, generator=torch.Generator().manual_seed(3), **F64)
    torch._dynamo.reset()
    compiled = torch.compile(causal_hierarchical_attention)
    results = []
    for fn in (compiled, causal_hierarchical_attention):
        out = fn(q, k, v, plan, pos_emb=pe)
        results.append([out, *torch.autograd.grad(out.sin().sum(), (q, k, v))])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
