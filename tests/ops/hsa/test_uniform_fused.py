import math

import pytest
import torch

from hiergraph.ops.hsa import family_products, uniform_fused
from hiergraph.ops.hsa.uniform import uniform_hierarchical_attention
from tests.conftest import assert_same_gradients

# the PyTorch operations of the fused op, not the compiled kernel that takes its place
pytestmark = pytest.mark.usefixtures("torch_ops")

F64 = dict(dtype=torch.float64)

# (trees, fanout top-down): families of two (no softmax), of four (grouped logits when
# there are enough of them), mixed, one level, a deep tree
SHAPES = [(3, (2, 3)), (2, (3, 2)), (1, (2, 4, 8, 16)), (2, (4, 4, 4)), (4, (5,)), (2, (2, 2, 2))]
OPTIONS = [
    dict(include_self=True, size_bias=True),
    dict(include_self=False, size_bias=True),
    dict(include_self=True, size_bias=False),
    dict(include_self=False, size_bias=False),
]


def inputs(shape, heads=3, d=4, d_v=5, eps_heads=None, seed=0, node_major=False):
    """Heads-first ``q, k, v`` viewed ``[L, H, ·]`` (``node_major``: contiguous ``[L, H,
    ·]``, whose leaf level is read in place when its families have 3 or more members) and
    optional position embeddings per depth ``[eps_heads, n_d, 2]``, all requiring
    gradients."""
    gen = torch.Generator().manual_seed(seed)
    leaves = math.prod(shape)
    qkv = [torch.randn(heads, leaves, c, generator=gen, **F64).transpose(0, 1) for c in (d, d, d_v)]
    qkv = [(t.contiguous() if node_major else t).requires_grad_() for t in qkv]
    eps = None
    if eps_heads is not None:
        sizes = [math.prod(shape[: i + 1]) for i in range(1, len(shape))]
        eps = [torch.randn(eps_heads, n, 2, generator=gen, **F64).requires_grad_() for n in sizes]
    return qkv, eps


def graph_nodes(out, count=4):
    """The names of the first ``count`` autograd nodes on the path from ``out``'s first
    input."""
    names, node = [], out.grad_fn
    while node is not None and len(names) < count:
        names.append(type(node).__name__)
        node = node.next_functions[0][0] if node.next_functions else None
    return names


def run(qkv, eps, shape, fuse, **options):
    return uniform_hierarchical_attention(
        *qkv, shape, eps, left_only=False, leaf_mask=None, tau=0.7, fuse=fuse, **options
    )


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 1, 3], ids=["no-eps", "eps-1-head", "eps-per-head"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
def test_equals_the_recorded_op_with_gradients(trees, fanout, options, eps_heads, node_major):
    shape = (trees, *fanout)
    qkv, eps = inputs(shape, eps_heads=eps_heads, node_major=node_major)
    out = run(qkv, eps, shape, True, **options)
    ref = run(qkv, eps, shape, False, **options)
    assert "_FusedUniformBackward" in graph_nodes(out)  # not the recorded op twice
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert_same_gradients(out, ref, qkv + (eps or []), rtol=0, atol=1e-12)


def leaf_mask(shape, kind: str, seed: int = 0):
    """``[L]`` bool: ``"random"`` (60% valid), ``"sparse"`` (15%: lonely leaves, families
    and subtrees without any) or ``"tree-empty"`` (the first tree masked whole, 60% of
    the others)."""
    leaves = math.prod(shape)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(leaves, generator=gen) < (0.15 if kind == "sparse" else 0.6)
    if kind == "tree-empty":
        mask[: leaves // shape[0]] = False
    return mask


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 1], ids=["no-eps", "eps"])
@pytest.mark.parametrize("kind", ["random", "sparse", "tree-empty"])
@pytest.mark.parametrize("padding", [False, True], ids=["leaf-mask", "padding"])
def test_masked_equals_the_recorded_op_with_gradients(
    trees, fanout, options, eps_heads, kind, padding
):
    """Masked leaves (a leaf mask, or padding: zero rows whose outputs nobody reads): one
    autograd node too, whose output and gradients are the recorded op's (on the valid
    leaves' rows for padding)."""
    shape = (trees, *fanout)
    qkv, eps = inputs(shape, eps_heads=eps_heads)
    mask = leaf_mask(shape, kind, seed=len(fanout))
    if padding:  # the padding contract: zero rows
        qkv = [(t * mask[:, None, None]).detach().requires_grad_() for t in qkv]
    outs = [
        uniform_hierarchical_attention(
            *qkv, shape, eps, left_only=False, leaf_mask=mask, tau=0.7, fuse=fuse,
            padding=padding, **options,
        )
        for fuse in (True, False)
    ]  # fmt: skip
    assert "_FusedUniformBackward" in graph_nodes(outs[0], 6)
    rows = mask if padding else slice(None)
    out, ref = (o[rows] for o in outs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), **F64)
    leaves = qkv + (eps or [])
    got, want = (torch.autograd.grad((o * upstream).sum(), leaves) for o in (out, ref))
    for g, w in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(g[rows], w[rows], rtol=0, atol=1e-12)
    for g, w in zip(got[3:], want[3:], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def count_forward_only(monkeypatch) -> list:
    """Runs of the forward-only passes (:func:`uniform_fused.fused_uniform_attention`
    without ``recorded``: the passes keep no level)."""
    calls, forward = [], uniform_fused._forward

    def counted(*args, keep=True, **kwargs):
        calls.extend([] if keep else [1])
        return forward(*args, keep=keep, **kwargs)

    monkeypatch.setattr(uniform_fused, "_forward", counted)
    return calls


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 1, 3], ids=["no-eps", "eps-1-head", "eps-per-head"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
def test_equals_the_recorded_op_without_gradients(
    trees, fanout, options, eps_heads, node_major, monkeypatch
):
    """Without gradients the passes run alone (no autograd node, no level kept): the
    recorded op's output, in the inputs' memory layout."""
    shape = (trees, *fanout)
    qkv, eps = inputs(shape, eps_heads=eps_heads, node_major=node_major)
    calls = count_forward_only(monkeypatch)
    with torch.no_grad():
        out = run(qkv, eps, shape, True, **options)
        ref = run(qkv, eps, shape, False, **options)
    assert len(calls) == 1
    assert out.is_contiguous() == node_major and out.transpose(0, 1).is_contiguous() != node_major
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "case", ["no-grad", "inference-mode", "mask", "node-major-mask", "eps-grad", "float16"]
)
def test_forward_only_where_nothing_needs_a_gradient(case, monkeypatch):
    """The forward-only passes run when no input needs a gradient, position embeddings
    included (else the gradient of ``eps`` is the recorded op's), masked leaves too, and
    not where the fused op does not apply."""
    shape = (2, 3, 4)
    qkv, eps = inputs(shape, heads=2, eps_heads=1)
    options = dict(include_self=True, size_bias=True)
    if case == "float16":  # runs in float32
        qkv = [t.detach().half() for t in qkv]
        eps = [t.detach().half() for t in eps]
    calls = count_forward_only(monkeypatch)
    if case == "eps-grad":  # q, k, v need no gradient, the embeddings do
        qkv = [t.detach() for t in qkv]
        out = run(qkv, eps, shape, True, **options)
        ref = run(qkv, eps, shape, False, **options)
        got, want = (torch.autograd.grad(o.square().sum(), eps) for o in (out, ref))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    elif case.endswith("mask"):
        if case == "node-major-mask":  # families of 4: the leaf level reads them in place
            qkv = [t.detach().contiguous() for t in qkv]
        with torch.no_grad():
            uniform_hierarchical_attention(
                *qkv, shape, eps, left_only=False, leaf_mask=torch.arange(24) % 5 != 0,
                tau=0.7, **options,
            )  # fmt: skip
    else:
        with torch.inference_mode() if case == "inference-mode" else torch.no_grad():
            run(qkv, eps, shape, True, **options)
    assert len(calls) == (case != "eps-grad")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
def test_half_precision_runs_in_float32(dtype, grad, node_major, monkeypatch):
    """bf16/fp16 leaves run the fused passes in float32 (their copy heads first casts
    them): the output, in the inputs' dtype and memory layout, is the float32 op's on the
    same values, rounded once, and so are the gradients (node-major float32 leaves are read
    in place, a different order of float32 sums: within a rounding of ``dtype``)."""
    shape = (2, 3, 4)
    qkv, eps = inputs(shape, eps_heads=1, node_major=node_major)
    half = [t.detach().to(dtype).requires_grad_(grad) for t in qkv + eps]
    wide = [t.detach().float().requires_grad_(grad) for t in half]
    options = dict(include_self=True, size_bias=True)
    ref = run(wide[:3], wide[3:], shape, True, **options)
    calls = count_forward_only(monkeypatch)
    out = run(half[:3], half[3:], shape, True, **options)
    assert out.dtype == dtype and out.is_contiguous() == node_major
    assert len(calls) == (not grad)
    tol = dict(rtol=torch.finfo(dtype).eps, atol=1e-6) if node_major else dict(rtol=0, atol=0)
    torch.testing.assert_close(out, ref.to(dtype), **tol)
    if grad:
        assert "_FusedUniformBackward" in graph_nodes(out, 6)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        got = torch.autograd.grad((out * upstream.to(dtype)).sum(), half)
        want = torch.autograd.grad((ref * upstream.to(dtype).float()).sum(), wide)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g, w.to(dtype), **tol)


def leaf_masks(shape, seed=0):
    """Leaf masks ``[L]`` of a forest ``(B, b_1, ..., b_D)`` that cover every case of the
    counts: random leaves, whole families and subtrees masked, a tree with one valid leaf
    (and, from three trees, trees with none), and right padding (the valid leaves of every
    tree first)."""
    trees, leaves = shape[0], math.prod(shape)
    per_tree, family = leaves // trees, shape[-1]
    gen = torch.Generator().manual_seed(seed)
    masks = {"random": torch.rand(leaves, generator=gen) > 0.4}
    blocks = torch.rand(leaves // family, generator=gen) > 0.5
    masks["families"] = blocks.repeat_interleave(family) & masks["random"]
    lonely = torch.zeros(leaves, dtype=torch.bool)
    lonely[per_tree + 1] = True  # the second tree keeps one leaf; the first keeps all
    lonely[:per_tree] = True
    masks["lonely-and-empty"] = lonely
    lengths = torch.randint(1, per_tree + 1, (trees,), generator=gen)
    masks["right-padded"] = (torch.arange(per_tree)[None] < lengths[:, None]).flatten()
    return masks


MASKED_SHAPES = [
    (3, (2, 3)),
    (2, (3, 2)),
    (2, (2, 2, 2)),
    (2, (4, 4, 4)),
    (3, (4,)),
    (2, (3, 2, 4)),
]


@pytest.mark.parametrize("trees, fanout", MASKED_SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 3], ids=["no-eps", "eps-per-head"])
@pytest.mark.parametrize("mask", ["random", "families", "lonely-and-empty", "right-padded"])
@pytest.mark.parametrize("padding", [False, True], ids=["any-rows", "zero-rows"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
def test_masked_leaves_without_gradients(trees, fanout, options, eps_heads, mask, padding,
                                         node_major, monkeypatch):  # fmt: skip
    """Masked leaves in the forward-only passes (the counts scale the products, drop the
    keys without leaves and weigh the energies): the recorded op's output, zero at the
    masked leaves, with their rows holding any values or zeros (``padding``), heads first
    or node-major (whose leaf level, families of two included, is read in place)."""
    shape = (trees, *fanout)
    if trees < 2 and mask == "lonely-and-empty":
        pytest.skip("needs two trees")
    qkv, eps = inputs(shape, eps_heads=eps_heads, node_major=node_major)
    leaf_mask = leaf_masks(shape)[mask]
    if padding:  # zero rows at the masked leaves, as the padded ops hand them over
        qkv = [(t * leaf_mask[:, None, None]).detach() for t in qkv]
        if not node_major:
            qkv = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in qkv]
    calls = count_forward_only(monkeypatch)
    kw = dict(left_only=False, leaf_mask=leaf_mask, tau=0.7, padding=padding, **options)
    with torch.no_grad():
        out = uniform_hierarchical_attention(*qkv, shape, eps, **kw)
        ref = uniform_hierarchical_attention(*qkv, shape, eps, fuse=False, **kw)
    assert len(calls) == 1 and out.is_contiguous() == node_major
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    if not padding:
        assert (out[~leaf_mask] == 0).all()


def family_above(energy, pooled):
    """A stand-in for a family above the roots (``above``): a log mass and an output of every
    root that depend on its energy and on each of its mean rows."""
    q, k, v = pooled
    log_mass = torch.nn.functional.logsigmoid(energy + (q * k).sum(-1))
    return log_mass, v * torch.sigmoid(energy).unsqueeze(-1) + q.sum(-1, keepdim=True)


@pytest.mark.parametrize("trees, fanout", MASKED_SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 3], ids=["no-eps", "eps-per-head"])
@pytest.mark.parametrize("mask", [None, "random", "lonely-and-empty", "right-padded"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
def test_a_family_above_the_roots_without_gradients(trees, fanout, options, eps_heads, mask,
                                                    node_major, monkeypatch):  # fmt: skip
    """A family above the roots (what hub leaves run, :mod:`hiergraph.ops.hsa.lifted`) in the
    forward-only passes: called with the roots' energies and mean rows between the passes,
    its log mass and output start the top-down pass, as in the recorded op."""
    shape = (trees, *fanout)
    if trees < 2 and mask == "lonely-and-empty":
        pytest.skip("needs two trees")
    qkv, eps = inputs(shape, eps_heads=eps_heads, node_major=node_major)
    leaf_mask = None if mask is None else leaf_masks(shape)[mask]
    calls = count_forward_only(monkeypatch)
    kw = dict(left_only=False, leaf_mask=leaf_mask, tau=0.7, above=family_above, **options)
    with torch.no_grad():
        out = uniform_hierarchical_attention(*qkv, shape, eps, **kw)
        ref = uniform_hierarchical_attention(*qkv, shape, eps, fuse=False, **kw)
    assert len(calls) == 1
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_families_of_four_taken_in_groups(monkeypatch):
    """The grouped ``[16, c] @ [c, 16]`` logits of families of four (here from 8 families)."""
    monkeypatch.setattr(family_products, "GRAM_MIN_FAMILIES", 8)
    shape = (2, 4, 4)
    qkv, eps = inputs(shape, heads=2, eps_heads=1)
    out = run(qkv, eps, shape, True, include_self=True, size_bias=True)
    ref = run(qkv, eps, shape, False, include_self=True, size_bias=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    got = torch.autograd.grad(out.square().sum(), qkv + eps)
    want = torch.autograd.grad(ref.square().sum(), qkv + eps)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_one_autograd_node():
    """The fused op is one node of the graph, where the recorded op is a chain of them."""
    shape = (2, 3, 4)
    qkv, _ = inputs(shape)
    out = run(qkv, None, shape, True, include_self=True, size_bias=True)
    node = out.grad_fn.next_functions[0][0]  # through the transpose back to [L, H, ·]
    assert type(node).__name__ == "_FusedUniformBackward"
    recorded = run(qkv, None, shape, False, include_self=True, size_bias=True)
    assert type(recorded.grad_fn.next_functions[0][0]).__name__ != "_FusedUniformBackward"


def test_backward_twice_with_a_retained_graph():
    """The backward leaves what the forward kept as it found it (retain_graph=True)."""
    shape = (2, 3, 4)
    qkv, eps = inputs(shape, eps_heads=1)
    out = run(qkv, eps, shape, True, include_self=True, size_bias=True)
    first = torch.autograd.grad(out.square().sum(), qkv + eps, retain_graph=True)
    second = torch.autograd.grad(out.square().sum(), qkv + eps)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "case",
    [
        "fused", "node-major-leaves", "bfloat16", "large-off-the-cpu", "leaf-mask",
        "no-grad", "leaky-causal", "large", "larger-off-the-cpu",
    ],
)  # fmt: skip
def test_recorded_where_the_fused_op_does_not_apply(case, monkeypatch):
    """Which inputs take the fused op (a gradient, heads first or node-major, any floating
    dtype, masked leaves too, up to a size that is larger off the CPU)."""
    shape = (2, 3, 4)
    qkv, _ = inputs(shape, heads=2)
    if case.endswith("off-the-cpu"):  # the meta device: shapes only, as on an accelerator
        qkv = [t.detach().to("meta").requires_grad_() for t in qkv]
        monkeypatch.setattr(uniform_fused, "MAX_ELEMENTS", 1)
        limit = qkv[0].numel() - (case == "larger-off-the-cpu")
        monkeypatch.setattr(uniform_fused, "MAX_ELEMENTS_ACCELERATOR", limit)
    options = dict(left_only=False, leaf_mask=None, tau=0.7, include_self=True, size_bias=True)
    if case == "bfloat16":
        qkv = [t.detach().bfloat16().requires_grad_() for t in qkv]
    if case == "leaf-mask":
        options["leaf_mask"] = torch.arange(24) % 5 != 0
    if case == "leaky-causal":
        options["left_only"] = True
    if case == "large":
        monkeypatch.setattr(uniform_fused, "MAX_ELEMENTS", qkv[0].numel() - 1)
    if case == "node-major-leaves":  # contiguous [L, H, d]: read in place (token_layout)
        qkv = [t.detach().contiguous().requires_grad_() for t in qkv]
    with torch.set_grad_enabled(case != "no-grad"):
        out = uniform_hierarchical_attention(*qkv, shape, None, **options)
    fused = ("fused", "node-major-leaves", "bfloat16", "large-off-the-cpu", "leaf-mask")
    assert ("_FusedUniformBackward" in graph_nodes(out)) == (case in fused)


@pytest.mark.parametrize("fanout", [(2, 3), (3, 2)], ids=["triples", "pairs"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heads-first", "node-major"])
@pytest.mark.parametrize("masked", [False, True], ids=["all-leaves", "leaf-mask"])
def test_second_derivatives(fanout, node_major, masked):
    """create_graph=True differentiates the recorded op: second derivatives through the
    fused node, position embeddings and masked leaves included."""
    shape = (2, *fanout)
    qkv, eps = inputs(shape, heads=2, d=2, d_v=2, eps_heads=1, node_major=node_major)
    mask = leaf_mask(shape, "random") if masked else None

    def op(q, k, v, *eps):
        return uniform_hierarchical_attention(
            q, k, v, shape, list(eps), left_only=False, leaf_mask=mask, tau=0.7,
            include_self=True, size_bias=True,
        )  # fmt: skip

    assert "_FusedUniformBackward" in graph_nodes(op(*qkv, *eps), 6)

    assert torch.autograd.gradgradcheck(op, (*qkv, *eps), fast_mode=True)


def test_second_derivatives_where_q_and_k_are_unused():
    """One family of two leaves without self energies: each leaf's output is its sibling's
    value, so q and k do not reach it; their second-order gradients are zeros (as the
    recorded op's), not an error."""
    qkv, _ = inputs((1, 2), heads=2, d=3, d_v=3)
    out = run(qkv, None, (1, 2), True, include_self=False, size_bias=True)
    assert "_FusedUniformBackward" in graph_nodes(out)
    torch.testing.assert_close(out, qkv[2].flip(0))  # the sibling's value
    grads = torch.autograd.grad(out.square().sum(), qkv, create_graph=True)
    assert torch.equal(grads[0], torch.zeros_like(grads[0]))  # 2 v_j, and none for q, k
    (second,) = torch.autograd.grad(grads[2].square().sum(), qkv[2])  # of 4 sum v^2
    torch.testing.assert_close(second, 8 * qkv[2])
