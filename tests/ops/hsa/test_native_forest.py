"""The compiled kernel of HSA over any forest (:func:`hiergraph.ops.hsa.native.forest_attention`)
against the edge path on PyTorch operations, and where it runs."""

import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, random_window_hierarchy, window_hierarchy
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.attention import attention_path, general_attention
from tests.conftest import assert_same_nans, hsa_kernel, random_spec, spy_calls, with_nan

OPTIONS = [
    dict(include_self=True, size_bias=True),
    dict(include_self=False, size_bias=True),
    dict(include_self=True, size_bias=False),
    dict(include_self=False, size_bias=False),
]


@pytest.fixture(autouse=True)
def kernel():
    hsa_kernel()


def forest(seed: int):
    """Mixed-depth random trees (only children, leaves at every depth), a single leaf, a
    chain, ragged window trees and an equal-fanout tree, batched."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = [from_nested(random_spec(rng, n)) for n in (9, 1, 23, 4)]
    trees.append(from_nested([[[0]], [1, [[2]]]]))
    trees += [random_window_hierarchy(n, (4, 3), generator=gen) for n in (40, 7)]
    trees.append(window_hierarchy(8, (2, 2)))
    return Batch.from_data_list(trees).tree_index()


def leaves_and_embeddings(index, heads, eps_heads, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(index.num_leaves, heads, c, generator=gen, dtype=dtype).requires_grad_()
        for c in (4, 4, 5)
    )
    pos = None
    if eps_heads is not None:
        pos = torch.randn(index.num_nodes, eps_heads, 3, generator=gen, dtype=dtype)
        pos.requires_grad_()
    return q, k, v, pos


def both(index, q, k, v, pos, **options):
    """The kernel's output and the edge path's, on the same inputs."""
    flags = dict(tau=0.7, **options)
    out = native.forest_attention(q, k, v, pos, index, recorded=None, **flags)
    ref = general_attention(q, k, v, index, pos, left_only=False, leaf_mask=None, kernel="edge",
                            **flags)  # fmt: skip
    return out, ref


@pytest.fixture(params=["trees", "levels"])
def tasks(request):
    """One task per (tree, head), or (more threads than those) the families of each level in
    parallel."""
    threads = torch.get_num_threads()
    if request.param == "levels":
        torch.set_num_threads(64)  # more than the 8 trees x 3 heads below
    yield request.param
    torch.set_num_threads(threads)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("eps_heads", [None, 1, 3], ids=["no-eps", "eps-1-head", "eps-per-head"])
def test_equals_the_edge_path_with_gradients(seed, options, eps_heads, tasks):
    index = forest(seed)
    q, k, v, pos = leaves_and_embeddings(index, 3, eps_heads, seed=seed)
    out, ref = both(index, q, k, v, pos, **options)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    inputs = [t for t in (q, k, v, pos) if t is not None]
    grad = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, inputs, grad),
        torch.autograd.grad(ref, inputs, grad),
        strict=True,
    ):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("include_self", [True, False])
def test_a_nan_query_reaches_the_outputs_the_edge_path_gives_it(include_self):
    """A NaN in one leaf's query makes NaN the outputs it makes NaN on the edge path; the
    kernel once took a row of NaN logits for a row without keys (zero weights)."""
    index = forest(0)
    q, k, v, _ = leaves_and_embeddings(index, 2, None)
    out, ref = both(index, with_nan(q, 3), k, v, None, include_self=include_self, size_bias=True)
    assert_same_nans(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("include_self", [True, False])
def test_a_forest_of_single_leaves(include_self):
    """Every root a leaf: the output is the leaf's value with a self energy, else 0."""
    index = Batch.from_data_list([from_nested(0), from_nested(0)]).tree_index()
    q, k, v, _ = leaves_and_embeddings(index, 2, None)
    out = native.forest_attention(
        q, k, v, None, index, tau=0.7, include_self=include_self, size_bias=True, recorded=None
    )
    torch.testing.assert_close(out, v if include_self else torch.zeros_like(v), atol=0, rtol=0)
    out.backward(torch.ones_like(out))
    assert torch.equal(v.grad, torch.full_like(v, float(include_self)))
    assert torch.equal(q.grad, torch.zeros_like(q))


def test_float32_and_any_layout():
    index = forest(0)
    q, k, v, pos = leaves_and_embeddings(index, 3, 1)
    ref = hierarchical_attention(q, k, v, index, pos_emb=pos, include_self=True)
    # heads-first float32 inputs (the wrapper hands the kernel contiguous rows)
    q32, k32, v32 = (t.detach().float().transpose(0, 1).contiguous().transpose(0, 1)
                     for t in (q, k, v))  # fmt: skip
    out = hierarchical_attention(q32, k32, v32, index, pos_emb=pos.detach().float(),
                                 include_self=True)  # fmt: skip
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def test_second_derivatives_through_the_recorded_op():
    tree = from_nested([[0, 1, 2], [3, [4, 5]], 6])
    q, k, v, pos = leaves_and_embeddings(tree.tree_index(), 2, 2)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v, e: hierarchical_attention(q, k, v, tree, pos_emb=e),
        (q, k, v, pos),
        fast_mode=True,
    )


def test_backward_twice_with_a_retained_graph():
    index = forest(1)
    q, k, v, _ = leaves_and_embeddings(index, 2, None)
    out = hierarchical_attention(q, k, v, index)
    first = torch.autograd.grad(out.sum(), q, retain_graph=True)[0]
    assert torch.equal(torch.autograd.grad(out.sum(), q)[0], first)


@pytest.mark.parametrize(
    "case",
    ["kernel", "position", "off", "blocks", "edge", "bfloat16", "leaf-mask", "leaky", "weights"],
)
def test_where_the_kernel_runs(case, monkeypatch):
    """Ragged forests on the CPU take the kernel unless masked, leaky-causal, asked for
    another kernel, in half precision, with too many weights or with the kernel off."""
    calls = spy_calls(monkeypatch, native, "forest_attention")
    index = forest(2)
    assert index.uniform is None and index.padded is None
    q, k, v, pos = leaves_and_embeddings(index, 2, 2 if case == "position" else None)
    options = dict(include_self=True, pos_emb=pos)
    if case == "off":
        monkeypatch.setattr(native, "_enabled", False)
    if case in ("blocks", "edge"):
        options["kernel"] = case
    if case == "bfloat16":
        q, k, v = (t.detach().bfloat16() for t in (q, k, v))
    if case == "leaf-mask":
        options["leaf_mask"] = torch.arange(index.num_leaves) % 4 != 0
    if case == "leaky":
        options["leaky_causal"] = True
    if case == "weights":
        monkeypatch.setattr(native, "MAX_FOREST_WEIGHTS", 8)
    hierarchical_attention(q, k, v, index, **options)
    assert len(calls) == (case in ("kernel", "position"))
    # the path the op reports is the one it took (this forest has no padded embedding)
    flags = {"kernel": options.get("kernel", "dense"), "leaf_mask": options.get("leaf_mask")}
    flags["leaky_causal"] = options.get("leaky_causal", False)
    expected = "forest" if calls else "edge" if case == "edge" else "blocks"
    assert attention_path(q, k, v, index, pos, **flags) == expected


def test_the_kernel_checks_its_forest():
    index = forest(0)
    q, k, v, _ = leaves_and_embeddings(index, 2, None)
    q, k, v = (t.detach() for t in (q, k, v))
    count = torch.cat([level.count for level in index.levels]).double()
    arrays = [index.child_ptr, index.leaf_row, index.order, count, index.pair_ptr, index.tree_ptr]
    options = (list(index.level_ptr), 0.5, True, True)
    ext = native.extension()
    ext.ragged_forward(q, k, v, None, *arrays, *options)  # consistent: runs
    broken = {
        "child_ptr": index.child_ptr.flip(0),
        "leaf_row": torch.where(index.leaf_row == 3, 10**6, index.leaf_row),
        "leaf_row twice": torch.where(index.leaf_row == 3, 2, index.leaf_row),
        "node": index.order - 1,
        "p_off": index.pair_ptr + 1,
        "tree_ptr": index.tree_ptr.flip(1),
    }
    position = {"child_ptr": 0, "leaf_row": 1, "leaf_row twice": 1, "node": 2, "p_off": 4}
    position["tree_ptr"] = 5
    for name, bad in broken.items():
        i = position[name]
        args = [*arrays[:i], bad, *arrays[i + 1 :]]
        with pytest.raises(RuntimeError, match="inconsistent|must"):
            ext.ragged_forward(q, k, v, None, *args, *options)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ext.ragged_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, *arrays, *options)
    with pytest.raises(RuntimeError, match="level_ptr"):
        ext.ragged_forward(q, k, v, None, *arrays, [0, 5], 0.5, True, True)
