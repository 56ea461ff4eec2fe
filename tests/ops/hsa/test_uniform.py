"""The reshaped-view path of HSA over equal-fanout forests against the dense reference
and the block kernel."""

import itertools

import pytest
import torch
from torch_geometric.data import Batch

import hiergraph.ops.hsa.family_dense as family_attention
import hiergraph.ops.hsa.family_products as family_products
import hiergraph.ops.hsa.uniform as hsa_uniform
from hiergraph.data import SignalHierarchy, from_nested, window_forest, window_hierarchy
from hiergraph.ops import (
    causal_hierarchical_attention,
    hierarchical_attention,
    hierarchical_attention_matrix,
)
from hiergraph.ops.hsa import token_layout
from hiergraph.ops.hsa.lifted import lifted_attention
from tests.conftest import DispatchedOps
from tests.operators import LargeWrites

F64 = dict(dtype=torch.float64)
SHAPES = [(3, 32, (4, 8)), (2, 48, (4, 3, 4)), (1, 8, (8,)), (2, 24, (3, 4, 2))]
OPTIONS = [
    dict(include_self=inc, leaky_causal=leaky, masked=masked, pos=pos, size_bias=sb)
    for inc, leaky, masked, pos, sb in itertools.product(*[(False, True)] * 5)
    if inc or not leaky
]


def _case(batch, length, branching, seed, heads=3, dim=5):
    gen = torch.Generator().manual_seed(seed)
    tree = Batch.from_data_list([window_hierarchy(length, branching) for _ in range(batch)])
    qkv = [torch.randn(batch * length, heads, dim, generator=gen, **F64) for _ in range(3)]
    mask = torch.rand(batch * length, generator=gen) > 0.3
    pos = torch.randn(tree.num_nodes, heads, 2, generator=gen, **F64)
    return tree, qkv, mask, pos


def _kwargs(opts, mask, pos):
    return dict(
        include_self=opts["include_self"],
        leaky_causal=opts["leaky_causal"],
        leaf_mask=mask if opts["masked"] else None,
        pos_emb=pos if opts["pos"] else None,
        size_bias=opts["size_bias"],
    )


def test_plan_detects_equal_fanout():
    assert window_forest([128] * 4, (16, 8)).tree_index().uniform == (4, 8, 16)
    assert window_hierarchy(48, (4, 3, 4)).tree_index().uniform == (1, 4, 3, 4)
    assert window_hierarchy(50, (4, 3)).tree_index().uniform is None  # partial windows
    assert window_forest([32, 64], (4, 8)).tree_index().uniform is None  # unequal trees
    assert from_nested([[0, 1], 2]).tree_index().uniform is None  # leaves on two levels
    assert from_nested([[0], [1]]).tree_index().uniform is None  # unary nodes


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_equals_block_kernel_with_gradients(shape, opts):
    tree, (q, k, v), mask, pos = _case(*shape, seed=len(str(opts)))
    index = tree.tree_index()
    assert index.uniform is not None
    kw = _kwargs(opts, mask, pos)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    fast = hierarchical_attention(q, k, v, index, **kw)
    blocks = hierarchical_attention(q, k, v, index, kernel="blocks", **kw)
    torch.testing.assert_close(fast, blocks, atol=1e-12, rtol=0)
    g_fast = torch.autograd.grad(fast.pow(2).sum(), inputs)
    g_blocks = torch.autograd.grad(blocks.pow(2).sum(), inputs)
    for a, b in zip(g_fast, g_blocks, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def _dense_reference(q, k, v, tree, kw):
    r"""The output of the dense matrix :math:`\hat\Theta` for the op's keyword arguments."""
    kw = dict(kw)
    leaf_mask = kw.pop("leaf_mask")
    theta = hierarchical_attention_matrix(q, k, tree, leaf_mask=leaf_mask, **kw)
    ref = torch.einsum("hij,jhd->ihd", theta, v)
    return ref if leaf_mask is None else ref * leaf_mask[:, None, None]


@pytest.mark.parametrize("opts", OPTIONS[:6], ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_equals_dense_reference(opts):
    tree, (q, k, v), mask, pos = _case(2, 24, (2, 3, 4), seed=1)
    kw = _kwargs(opts, mask, pos)
    out = hierarchical_attention(q, k, v, tree, **kw)
    torch.testing.assert_close(out, _dense_reference(q, k, v, tree, kw), atol=1e-12, rtol=0)


@pytest.mark.parametrize("kernel", ["dense", "blocks"])
@pytest.mark.parametrize("opts", OPTIONS[::3], ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_families_of_four_taken_in_groups_equal_dense_reference(opts, kernel, monkeypatch):
    """Logits and weight gradients of families of four taken four at a time
    (:func:`~hiergraph.ops.hsa.family_products.family_gram`, here from any count on), in the
    reshaped-view path and the block kernel: output and gradients of the dense reference."""
    monkeypatch.setattr(family_products, "GRAM_MIN_FAMILIES", 1)
    tree, (q, k, v), mask, pos = _case(2, 48, (4, 3, 4), seed=3)
    kw = _kwargs(opts, mask, pos)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    out = hierarchical_attention(q, k, v, tree, kernel=kernel, **kw)
    ref = _dense_reference(q, k, v, tree, kw)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    got = torch.autograd.grad(out.pow(2).sum(), inputs)
    for a, b in zip(got, torch.autograd.grad(ref.pow(2).sum(), inputs), strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_small_masked_families_are_close_to_float32(dtype, monkeypatch):
    """The windows of pretrained encoders (families of two and four, here grouped) with
    right padding, in half precision: counts, logs and the carried sums of masked levels are
    float32, so output and gradients stay within half rounding of the float32 result."""
    monkeypatch.setattr(family_products, "GRAM_MIN_FAMILIES", 1)
    index = window_forest([64] * 4, (2, 4, 8)).tree_index()
    gen = torch.Generator().manual_seed(4)
    inputs = [torch.randn(256, 3, 16, generator=gen).to(dtype).float() for _ in "qkv"]
    mask = torch.arange(256) % 64 < torch.tensor([64, 50, 37, 9]).repeat_interleave(64)
    outs, grads = [], []
    for run_dtype in (torch.float32, dtype):
        leaves = [t.to(run_dtype, copy=True).requires_grad_() for t in inputs]
        out = hierarchical_attention(*leaves, index, include_self=True, leaf_mask=mask)
        assert out.dtype == run_dtype
        out.float().square().sum().backward()
        outs.append(out.float())
        grads.append([t.grad.float() for t in leaves])
    scale = outs[0].abs().max()
    assert (outs[1] - outs[0]).abs().max() < 0.05 * scale
    for half, full in zip(grads[1][1:], grads[0][1:], strict=True):  # dq: see test_attention
        assert (half - full).abs().max() < 0.05 * full.abs().max()


@pytest.mark.parametrize("opts", [o for o in OPTIONS if o["masked"]][:8],
                         ids=lambda o: "-".join(k for k, v in o.items() if v))  # fmt: skip
def test_padding_leaves_values_are_never_read(opts):
    """Padding leaves are dropped by their zero counts, not by zeroing their rows: huge
    (finite) values there leave the output and the gradients of the valid leaves as they
    are with zeros there, and the padding rows get zero output and zero gradient."""
    tree, (q, k, v), mask, pos = _case(2, 24, (2, 3, 4), seed=2)
    kw = _kwargs(opts, mask, pos)
    garbage = [torch.where(mask[:, None, None], t, 1e6 * t.sign()) for t in (q, k, v)]
    zeros = [torch.where(mask[:, None, None], t, 0.0) for t in (q, k, v)]
    outs, grads = [], []
    for inputs in (garbage, zeros):
        inputs = [t.requires_grad_() for t in inputs]
        out = hierarchical_attention(*inputs, tree, **kw)
        outs.append(out)
        grads.append(torch.autograd.grad(out.sin().sum(), inputs))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=0)
    assert (outs[0][~mask] == 0).all()
    for got, want in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        assert (got[~mask] == 0).all()


@pytest.mark.parametrize("b", [2, 3])
@pytest.mark.parametrize("used", ["all", "logits", "sums"])
def test_scores_with_sums_differentiable_twice(b, used):
    """The logits and the family sums of ``q`` and ``k`` from one function, whose backward
    adds the sums' gradients onto the products: equal to the plain expressions, with
    first and second derivatives, whichever outputs are used."""
    gen = torch.Generator().manual_seed(b)
    q, k = (torch.randn(2, 3, b, 4, generator=gen, **F64).requires_grad_() for _ in range(2))
    logits, sum_q, sum_k = hsa_uniform.scores(q, k, 0.7, torch.float64)
    torch.testing.assert_close(logits, 0.7 * q @ k.mT, atol=1e-15, rtol=0)
    torch.testing.assert_close(sum_q, q.sum(-2), atol=1e-15, rtol=0)
    torch.testing.assert_close(sum_k, k.sum(-2), atol=1e-15, rtol=0)
    weights = [torch.randn(t.shape, generator=gen, **F64) for t in (logits, sum_q, sum_k)]

    def fn(q, k):
        outs = hsa_uniform.scores(q, k, 0.7, torch.float64)
        pick = {"all": (0, 1, 2), "logits": (0,), "sums": (1, 2)}[used]
        return sum((outs[i] * weights[i]).sum() for i in pick)

    assert torch.autograd.gradcheck(fn, (q, k))
    assert torch.autograd.gradgradcheck(fn, (q, k))


def test_runs_without_the_block_kernel(monkeypatch):
    """The equal-fanout plan never reaches the family kernels."""

    def refuse(*args, **kwargs):
        raise AssertionError("the block kernel ran")

    monkeypatch.setattr("hiergraph.ops.hsa.attention.family_attention_dense", refuse)
    tree, (q, k, v), _, _ = _case(2, 32, (4, 8), seed=0)
    assert torch.isfinite(hierarchical_attention(q, k, v, tree)).all()


def test_giant_families_go_to_the_chunked_block_kernel(monkeypatch):
    monkeypatch.setattr(family_attention, "MAX_BLOCK_ELEMENTS", 16)
    calls = []
    original = hsa_uniform.uniform_hierarchical_attention
    monkeypatch.setattr(
        "hiergraph.ops.hsa.attention.uniform_hierarchical_attention",
        lambda *a, **kw: calls.append(1) or original(*a, **kw),
    )
    tree = window_hierarchy(64, (64,))  # one family of 64 leaves: logits > q.numel()
    q, k, v = (torch.randn(64, 1, 2, **F64) for _ in range(3))
    out = hierarchical_attention(q, k, v, tree)
    assert not calls
    torch.testing.assert_close(out, hierarchical_attention(q, k, v, tree, kernel="edge"))


@pytest.mark.parametrize(
    "opts", [dict(include_self=True, leaky_causal=True), dict(include_self=False)]
)
@pytest.mark.parametrize("branching", [(2, 3), (3, 2)], ids=["pairs", "node-major-leaves"])
def test_second_derivatives(opts, branching):
    """Families of two (element-wise passes) and of three (without a mask, leaves read
    node-major: :mod:`hiergraph.ops.hsa.token_layout`)."""
    tree = window_hierarchy(12, branching)
    q, k, v = (torch.randn(12, 2, 3, **F64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    for leaf_mask in (None, mask):
        assert torch.autograd.gradgradcheck(
            lambda q, k, v, m=leaf_mask: hierarchical_attention(q, k, v, tree, leaf_mask=m, **opts),
            (q, k, v),
            fast_mode=True,
        )


@pytest.mark.parametrize("opts", [dict(), dict(include_self=True, leaky_causal=True)])
def test_edge_kernel_second_derivatives(opts):
    tree = from_nested([[0, 1, 2], [3, [4, 5]], 6])
    q, k, v = (torch.randn(7, 2, 3, **F64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: hierarchical_attention(q, k, v, tree, kernel="edge", **opts),
        (q, k, v),
        fast_mode=True,
    )


def test_compiles_without_graph_breaks():
    """A fixed plan traces into one graph (dynamo only: the eager backend)."""
    index = window_forest([16] * 3, (4, 4)).tree_index()
    q, k, v = (torch.randn(48, 2, 8, requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        return hierarchical_attention(q, k, v, index, include_self=True)

    compiled = torch.compile(attend, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v))
    compiled(q, k, v).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_compiled_with_a_leaf_mask_equals_eager():
    """Traced with a leaf mask over leaves that are neither heads first nor contiguous
    (channels sliced from wider rows), the copy heads first that zeroes the masked rows is
    the plain scaled product (``heads_first.transposed``): output and gradients equal
    eager ones (float64; dynamo only, the eager backend)."""
    index = window_forest([16] * 3, (4, 4)).tree_index()
    q, k, v = (torch.randn(48, 2, 12, **F64)[..., :8].requires_grad_() for _ in range(3))
    mask = torch.arange(48) % 5 != 2

    def attend(q, k, v):
        return hierarchical_attention(q, k, v, index, include_self=True, leaf_mask=mask)

    def with_grads(fn):
        out = fn(q, k, v)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))

    torch._dynamo.reset()
    got, got_grads = with_grads(torch.compile(attend, fullgraph=True, backend="eager"))
    want, want_grads = with_grads(attend)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_grads, want_grads, atol=1e-12, rtol=0)
    assert (got[~mask] == 0).all()


def test_large_int64_slots_order_like_their_ranks():
    """Slots near 2**62 (e.g. nanosecond timestamps) give the output of their ranks."""
    parent = torch.tensor([4, 4, 5, 5, 6, 6, -1])
    ranks = torch.tensor([1, 0, 0, 1, 1, 0, 0])
    big = torch.tensor([1_700_000_000_000_000_123, 1_700_000_000_000_000_000,
                        5, 2**62, 2**62 - 1, 2**61, 0])  # fmt: skip
    trees = [SignalHierarchy.from_parent(parent, slot=slot) for slot in (ranks, big)]
    q, k, v = (torch.randn(4, 2, 3, **F64) for _ in range(3))
    small, large = (hierarchical_attention(q, k, v, t, include_self=True) for t in trees)
    torch.testing.assert_close(small, large, atol=0, rtol=0)


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True)])
def test_output_keeps_the_memory_layout_of_the_inputs(causal, masked):
    """Contiguous and heads-first inputs give the same output and gradients (the masked
    op zeroes padding rows in its layout copies of contiguous inputs, and multiplies
    heads-first ones; without a mask, contiguous leaves are read in place and heads-first
    ones take the fused op: the same values up to rounding)."""
    tree, (q, k, v), mask, pos = _case(2, 24, (4, 3, 2), seed=9)
    kw = dict(include_self=True, causal=causal, pos_emb=pos, leaf_mask=mask if masked else None)
    node_major = [t.clone().requires_grad_() for t in (q, k, v)]
    # [H, L, d] storage viewed as [L, H, d]: read without a copy, output in the same layout
    heads_first = [
        t.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_() for t in (q, k, v)
    ]
    out = hierarchical_attention(*node_major, tree, **kw)
    out_hf = hierarchical_attention(*heads_first, tree, **kw)
    assert out.is_contiguous() and out_hf.transpose(0, 1).is_contiguous()
    torch.testing.assert_close(out, out_hf, atol=1e-13, rtol=0)
    grads = torch.autograd.grad(out.pow(2).sum(), node_major)
    grads_hf = torch.autograd.grad(out_hf.pow(2).sum(), heads_first)
    for a, b in zip(grads, grads_hf, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.usefixtures("torch_ops")
def test_many_heads_without_gradients_are_read_node_major(monkeypatch, masked):
    """Without gradients, up to ``MAX_HEADS_INFERENCE`` heads are read in their node-major
    memory (no copies heads first; more than with gradients): the output of the
    heads-first inputs, zero at masked leaves."""
    heads = token_layout.MAX_HEADS + 4
    tree, (q, k, v), mask, pos = _case(2, 24, (4, 3, 2), seed=4, heads=heads)
    kw = dict(include_self=True, pos_emb=pos, leaf_mask=mask if masked else None)
    calls = []  # the leaf level's logits, read node-major (recorded or forward-only op)
    gram = token_layout.head_gram
    monkeypatch.setattr(token_layout, "head_gram", lambda *a: calls.append(1) or gram(*a))
    heads_first = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v)]
    with torch.no_grad():
        out = hierarchical_attention(q, k, v, tree, **kw)
        assert len(calls) == 1 and out.is_contiguous()
        expected = hierarchical_attention(*heads_first, tree, **kw)
    assert len(calls) == 1  # heads-first memory is read as it is
    torch.testing.assert_close(out, expected, atol=1e-13, rtol=0)
    if masked:
        assert (out[~mask] == 0).all()
    hierarchical_attention(*(t.requires_grad_() for t in (q, k, v)), tree, **kw)
    assert len(calls) == 1  # with gradients, this many heads are copied heads first


def test_a_broadcast_output_gradient_gives_the_dense_gradients():
    tree, (q, k, v), _, _ = _case(2, 16, (4, 4), seed=11)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    out = hierarchical_attention(*inputs, tree)
    from_sum = torch.autograd.grad(out.sum(), inputs)  # one value, stride 0, made dense
    from_ones = torch.autograd.grad(hierarchical_attention(*inputs, tree), inputs,
                                    torch.ones_like(out))  # fmt: skip
    for a, b in zip(from_sum, from_ones, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.usefixtures("torch_ops")
def test_families_of_two_take_no_softmax(masked):
    """A node of a family of two has one key, its sibling: the families of two (leaves and
    the level above the roots' children here) take no softmax, those of four do."""
    index = window_forest([32] * 4, (2, 4, 2, 2)).tree_index()
    q, k, v = (torch.randn(128, 2, 8) for _ in "qkv")
    mask = torch.arange(128) % 5 != 0 if masked else None
    with DispatchedOps() as ops:  # one row maximum per softmax
        hierarchical_attention(q, k, v, index, include_self=True, leaf_mask=mask)
    assert [shape[-1] for shape in ops.shapes("amax")] == [4]


@pytest.mark.parametrize("heads_first", [False, True])
def test_levels_are_never_copied(heads_first):
    """Levels are views of one another, and the leaves are read in the inputs' memory
    (heads first as they are; node-major ``[L, H, d]`` by one product per head,
    :mod:`hiergraph.ops.hsa.token_layout`): the forward and the backward (of a gradient in
    the output's layout) copy nothing of level size, and the output keeps ``q``'s layout."""
    index = window_forest([32] * 4, (4, 8)).tree_index()
    L, H, d = 128, 2, 8
    shape = (H, L, d) if heads_first else (L, H, d)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    if heads_first:
        q, k, v = (t.detach().transpose(0, 1).requires_grad_() for t in (q, k, v))
    with LargeWrites(L * H * d, only=LargeWrites.COPIES) as copies:
        out = hierarchical_attention(q, k, v, index)
    assert not copies.names
    assert out.transpose(0, 1).is_contiguous() == heads_first
    grad = torch.randn_like(out)  # in the output's layout
    with LargeWrites(L * H * d, only=LargeWrites.COPIES) as copies:
        out.backward(grad)
    assert not copies.names


def test_a_leaf_mask_costs_no_pass_over_contiguous_inputs(monkeypatch):
    """With contiguous ``[L, H, d]`` inputs copied to heads first (families of two: the
    node-major leaf level needs ``b >= 3``) the layout copies, in and out, forward and
    backward, also zero the padding rows: a leaf mask adds no pass over the leaves of the
    recorded op (without a mask the fused op would run: :mod:`hiergraph.ops.hsa.uniform_fused`)."""
    monkeypatch.setattr(hsa_uniform, "fused", lambda *args: False)
    index = window_forest([32] * 4, (2, 4, 4)).tree_index()
    L, H, d = 128, 2, 8
    mask = torch.rand(L, generator=torch.Generator().manual_seed(0)) > 0.3
    passes = []
    for leaf_mask in (None, mask):
        q, k, v = (torch.randn(L, H, d, requires_grad=True) for _ in range(3))
        with LargeWrites(L * H * d) as forward:
            out = hierarchical_attention(q, k, v, index, leaf_mask=leaf_mask, include_self=True)
        grad = torch.randn_like(out)
        with LargeWrites(L * H * d) as backward:
            out.backward(grad)
        passes.append((len(forward.names), len(backward.names)))
    assert passes[0] == passes[1], passes


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 3, 2), (3, 2, 3, 4)])  # the second: node-major leaves
def test_a_family_above_the_roots(masked, shape):
    """``above`` (a family above the roots, :mod:`hiergraph.ops.hsa.lifted`, whose tests
    check the whole) gets the roots' energies and masked means of the leaves' rows, and
    the pass starts from what it returns: the output is its rows plus its mass times the
    plain output, at every leaf below each root (zero at masked leaves)."""
    _, (q, k, v), mask, _ = _case(3, 24, (2, 3, 4), seed=4)
    options = dict(
        include_self=True, left_only=False, leaf_mask=mask if masked else None, tau=0.4,
        size_bias=True,
    )  # fmt: skip
    plain = hsa_uniform.uniform_hierarchical_attention(q, k, v, shape, None, **options)
    seen = {}
    log_mass = torch.randn(3, 3, dtype=q.dtype)  # [H, B]
    base = torch.randn(3, 3, v.size(-1), dtype=q.dtype)  # [H, B, d_v]

    def above(energy, pooled):
        seen.update(energy=energy, pooled=pooled)
        return log_mass, base

    out = hsa_uniform.uniform_hierarchical_attention(q, k, v, shape, None, above=above, **options)
    want = base.transpose(0, 1)[:, None] + log_mass.exp().T[:, None, :, None] * plain.view(
        3, 24, 3, -1
    )
    if masked:
        want = want * mask.view(3, 24, 1, 1)
    torch.testing.assert_close(out, want.view_as(out), rtol=0, atol=1e-12)
    weight = (mask if masked else torch.ones_like(mask)).to(q.dtype).view(3, 24, 1, 1)
    for rows, got in zip((q, k, v), seen["pooled"], strict=True):
        want = (rows.view(3, 24, 3, -1) * weight).sum(1) / weight.sum(1)
        torch.testing.assert_close(got, want.transpose(0, 1), rtol=0, atol=1e-12)
    assert seen["energy"].shape == (3, 3) and torch.isfinite(seen["energy"]).all()


def _symbolic_sizes_on_a_new_batch_shape(op: str) -> set[str]:
    """The symbolic sizes in the graph ``torch.compile`` traces (default ``dynamic``) when
    the strictly causal, the bidirectional or the hub op (``op``) meets a second batch
    shape: 3, then 4 window trees."""
    sizes = set()

    def capture(graph_module, example_inputs):
        sizes.clear()
        for node in graph_module.graph.nodes:
            value = node.meta.get("example_value")
            if isinstance(value, torch.Tensor):
                sizes.update(str(n) for n in value.shape if not isinstance(n, int))
        return graph_module

    def run(q, k, v, forest):
        if op == "causal":
            return causal_hierarchical_attention(q, k, v, forest.causal_plan())
        if op == "bidirectional":
            return hierarchical_attention(q, k, v, forest.tree_index(), include_self=True)
        lifted = (torch.arange(q.size(0)) % 64) < 2  # hub leaves: the first two of every tree
        return lifted_attention(q, k, v, forest.tree_index(), lifted, 2, pos_emb=None,
                                include_self=True, leaf_mask=None)  # fmt: skip

    compiled = torch.compile(run, backend=capture, fullgraph=True)
    torch._dynamo.reset()
    for trees in (3, 4):
        forest = window_forest([64] * trees, (4, 4, 4))
        forest.tree_index(), forest.causal_plan()  # plans built before tracing, as in training
        compiled(*(torch.randn(64 * trees, 2, 8, requires_grad=True) for _ in range(3)), forest)
    return sizes


@pytest.mark.parametrize("op", ["causal", "bidirectional", "lifted"])
def test_a_new_batch_shape_keeps_family_sizes_literal(op):
    """Recompiled with dynamic shapes, the leaf count is tied to the number of trees
    (``tie_leaves``), so every size is a multiple of a symbol: no floor division. Untied,
    the family views' sizes nest floor divisions level after level (the strictly causal op
    then took minutes to recompile)."""
    sizes = _symbolic_sizes_on_a_new_batch_shape(op)
    assert sizes, "no symbolic size: the second shape did not recompile dynamically"
    assert not [size for size in sizes if "//" in size]
