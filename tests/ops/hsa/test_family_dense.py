"""Family attention in dense blocks (:mod:`hiergraph.ops.hsa.family_dense`): the block
kernel's wide blocks run in PyTorch's fused CPU attention kernel with the same outputs and
gradients as the batched products, where a forest with wide families runs, and the block
kernel is differentiable twice."""

import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import attention, family_dense
from tests.conftest import assert_same_nans, random_qkv, random_spec, spy_calls, with_nan

F64 = dict(dtype=torch.float64)
OPTIONS = {
    "plain": dict(),
    "self": dict(include_self=True),
    "leaky": dict(include_self=True, leaky_causal=True),
    "masked": dict(leaf_mask=True),
    "pos": dict(pos_emb=2),
    "pos-shared": dict(pos_emb=1, include_self=True),
}


def forest(seed: int) -> Batch:
    """Ragged trees with families of 1 to 12 members (gather blocks, padding slots) and a
    window tree (slice blocks)."""
    rng = random.Random(seed)
    trees = [from_nested(random_spec(rng, rng.randint(1, 40), max_branch=12)) for _ in range(6)]
    return Batch.from_data_list([*trees, window_hierarchy(40, (8, 5))])


def inputs(h, opts: dict, seed: int) -> tuple[list, dict]:
    """``[q, k, v, (pos_emb)]`` with gradients and the keyword options of ``opts``."""
    q, k, v = random_qkv(h.num_leaves, heads=2, dim=4, dv=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    kwargs = {key: value for key, value in opts.items() if key not in ("leaf_mask", "pos_emb")}
    tensors = [q, k, v]
    if opts.get("pos_emb"):
        tensors.append(torch.randn(h.num_nodes, opts["pos_emb"], 5, generator=gen, **F64))
    if opts.get("leaf_mask"):
        kwargs["leaf_mask"] = torch.rand(h.num_leaves, generator=gen) > 0.3
    return [t.requires_grad_() for t in tensors], kwargs


def run(tensors: list, h, kwargs: dict, upstream=None):
    """The block kernel's output and the gradients of ``tensors`` from ``upstream``."""
    q, k, v, *pos = tensors
    out = hierarchical_attention(q, k, v, h, kernel="blocks", pos_emb=pos[0] if pos else None,
                                 **kwargs)  # fmt: skip
    upstream = torch.randn_like(out) if upstream is None else upstream
    return out, torch.autograd.grad(out, tensors, upstream), upstream


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "row-chunks"])
@pytest.mark.parametrize("name", OPTIONS)
def test_wide_blocks_equal_the_batched_products(name, chunked, monkeypatch):
    """Every block of 3 or more members through the fused kernel (with ``chunked``, a few
    query rows at a time) against the batched products: float64, to 1e-12."""
    h = forest(seed=len(name))
    tensors, kwargs = inputs(h, OPTIONS[name], seed=3)
    ref, ref_grads, upstream = run(tensors, h, kwargs)
    monkeypatch.setattr(family_dense, "WIDE_BLOCK", 3)
    if chunked:
        monkeypatch.setattr(family_dense, "MAX_BLOCK_ELEMENTS", 40)
    blocks = spy_calls(monkeypatch, family_dense, "_wide_forward")
    kernel_calls = spy_calls(monkeypatch, family_dense, "fused_attention")
    out, grads, _ = run(tensors, h, kwargs, upstream)
    assert blocks and (len(kernel_calls) > len(blocks)) == chunked
    assert (out - ref).abs().max() <= 1e-12
    for g, g_ref in zip(grads, ref_grads, strict=True):
        assert (g - g_ref).abs().max() <= 1e-12


def test_a_wide_row_without_keys_gets_no_mass(monkeypatch):
    """A member whose siblings are all masked has no key: lse -inf and theta 0 (the fused
    kernel reports lse 0 there), as on the batched products; its gradients stay finite."""
    h = from_nested([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    leaf_mask = torch.tensor([1, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    q, k, v = random_qkv(10, seed=1)
    results = []
    for wide in (1 << 30, 3):
        monkeypatch.setattr(family_dense, "WIDE_BLOCK", wide)
        tensors = [t.clone().requires_grad_() for t in (q, k, v)]
        out = hierarchical_attention(*tensors, h, kernel="blocks", leaf_mask=leaf_mask)
        out.square().sum().backward()
        results.append([out, *(t.grad for t in tensors)])
    for a, b in zip(*results, strict=True):
        assert torch.isfinite(a).all() and (a - b).abs().max() <= 1e-12
    assert results[1][0][1:5].abs().max() == 0  # masked leaves output 0


def test_a_nan_in_a_wide_block_reaches_what_it_reaches_on_the_batched_products(monkeypatch):
    h = from_nested([list(range(6)), [6, 7, [8, 9, 10]]])
    q, k, v = random_qkv(11, seed=2)
    outs = []
    for wide in (1 << 30, 3):
        monkeypatch.setattr(family_dense, "WIDE_BLOCK", wide)
        outs.append(hierarchical_attention(with_nan(q, 2), k, v, h, kernel="blocks"))
    assert outs[0].isnan().any() and not outs[0].isnan().all()
    assert_same_nans(outs[1], outs[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "trees,heads,kernel,path",
    [
        ("equal stars that fit", 2, "dense", "uniform"),
        ("equal stars that do not fit", 4, "dense", "blocks"),
        ("a star and a small tree", 2, "dense", "padded"),
        ("a star and a small tree", 2, "edge", "edge"),
    ],
)
def test_where_a_forest_with_a_wide_family_runs(trees, heads, kernel, path):
    """Equal stars on the reshaped views where their logits fit, else on blocks (the wide
    ones in the fused kernel); a ragged forest whose wide families dominate not in the
    compiled forest kernel."""
    stars = {
        "equal stars that fit": [from_nested(list(range(512)))] * 2,
        "equal stars that do not fit": [from_nested(list(range(2048)))] * 2,
        "a star and a small tree": [from_nested(list(range(600))), from_nested([[0, 1], [2]])],
    }
    index = Batch.from_data_list(stars[trees]).tree_index()
    q, k, v = (torch.zeros(index.num_leaves, heads, 8, requires_grad=True) for _ in range(3))
    assert family_dense.wide_dominates(index)
    assert attention.attention_path(q, k, v, index, None, kernel) == path


def test_off_the_cpu_a_wide_family_runs_on_the_batched_blocks(monkeypatch):
    """Off the CPU (the ``meta`` device: shapes only) a star of 600 leaves on the block
    kernel runs without the fused CPU attention kernel, forward and backward in the CPU's
    shapes."""
    index = Batch.from_data_list([from_nested(list(range(600))), from_nested([[0, 1], [2]])])
    index = index.tree_index().to("meta")
    calls = spy_calls(monkeypatch, family_dense, "_wide_forward")
    q, k, v = (torch.empty(603, 2, c, device="meta", requires_grad=True) for c in (8, 8, 4))
    out = hierarchical_attention(q, k, v, index, kernel="blocks")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert out.shape == (603, 2, 4) and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert calls == []


def test_traced_a_wide_family_runs_on_the_batched_blocks(monkeypatch):
    """Traced by ``torch.compile``, a star of 600 leaves on the block kernel runs on the
    batched products (the fused CPU attention kernel is eager only): the output and
    gradients of the eager fused kernel (dynamo only, the eager backend; float64)."""
    index = Batch.from_data_list([from_nested(list(range(600))), from_nested([[0, 1], [2]])])
    index = index.tree_index()
    q, k, v = (t.requires_grad_() for t in random_qkv(603, heads=2, dim=8, dv=4))

    def attend(q, k, v):
        return hierarchical_attention(q, k, v, index, kernel="blocks")

    def with_grads(fn):
        out = fn(q, k, v)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))

    calls = spy_calls(monkeypatch, family_dense, "_wide_forward")
    want, want_grads = with_grads(attend)
    assert len(calls) == 1
    torch._dynamo.reset()
    got, got_grads = with_grads(torch.compile(attend, backend="eager", fullgraph=True))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_grads, want_grads, atol=1e-12, rtol=0)


@pytest.mark.parametrize("windows,blocks", [(4, True), (16, False)])
def test_a_wide_family_among_narrow_ones_leaves_the_forest_kernel_where_it_dominates(
    windows, blocks
):
    """A star of 512 leaves beside ``windows`` window trees of 512 leaves: on blocks with
    4 (102 pairs of the star per leaf), in the compiled forest kernel with 16 (30 per
    leaf)."""
    trees = [window_hierarchy(512, (16, 8, 4))] * windows + [from_nested(list(range(512)))]
    index = Batch.from_data_list(trees).tree_index()
    assert index.family_pairs(family_dense.WIDE_BLOCK) == 512**2
    assert family_dense.wide_dominates(index) == blocks
    q, k, v = (torch.zeros(index.num_leaves, 2, 8) for _ in range(3))
    assert attention.attention_path(q, k, v, index, None) == ("blocks" if blocks else "forest")


def test_the_fused_kernel_runs_a_wide_star_by_default(monkeypatch):
    """One family of 600 leaves (float32) whose logits do not fit the reshaped views: the
    default path calls the fused kernel, whose output and gradients equal the edge
    path's."""
    monkeypatch.setattr(attention, "fits", lambda *args, **kwargs: False)
    h = window_hierarchy(600, (600,))
    q, k, v = (t.float().requires_grad_() for t in random_qkv(600, heads=2, dim=8, dv=8))
    calls = spy_calls(monkeypatch, family_dense, "_wide_forward")
    out = hierarchical_attention(q, k, v, h)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert len(calls) == 1
    inputs_64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = hierarchical_attention(*inputs_64, h, kernel="edge")
    ref_grads = torch.autograd.grad(ref.square().sum(), inputs_64)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    for g, g_ref in zip(grads, ref_grads, strict=True):
        assert torch.allclose(g.double(), g_ref, atol=1e-4)


@pytest.mark.parametrize("wide", [False, True], ids=["batched", "wide"])
@pytest.mark.parametrize("name", ["plain", "leaky", "masked", "pos"])
def test_the_block_kernel_is_differentiable_twice(name, wide, monkeypatch):
    """Second derivatives (``create_graph=True``) of the block kernel equal the edge path's
    (differentiable twice on tensor operations, checked by ``gradgradcheck``): its
    first-order backward is written out, the second differentiates the recorded blocks."""
    if wide:
        monkeypatch.setattr(family_dense, "WIDE_BLOCK", 3)
    h = forest(seed=6)
    tensors, kwargs = inputs(h, OPTIONS[name], seed=4)
    q, k, v, *pos = tensors
    results = []
    for kernel in ("edge", "blocks"):
        out = hierarchical_attention(q, k, v, h, kernel=kernel, pos_emb=pos[0] if pos else None,
                                     **kwargs)  # fmt: skip
        grads = torch.autograd.grad(out.square().sum(), tensors, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in grads), tensors)
        results.append([*grads, *second])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
