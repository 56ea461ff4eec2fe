"""``window_forest``: many window (and hub) hierarchies at once, against a per-tree
reference built from nested Python lists."""

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import SignalHierarchy
from hiergraph.data.windows import hmatrix_layout, window_forest, window_hierarchy
from hiergraph.ops.hsa.attention import hierarchical_attention


def reference_tree(n: int, branching, lifted=()) -> SignalHierarchy:
    """Windows over the tokens not in ``lifted`` cut level by level with list slices; lifted
    tokens under the root. Node ids: tokens, then internal nodes in creation order; siblings
    ordered by id (``from_parent``'s default), so lifted tokens come before the top windows,
    and a root over tokens only orders them as in the text."""
    parent, nodes, next_id, level = {}, [t for t in range(n) if t not in lifted], n, 0
    while len(nodes) > 1:
        width = branching[level] if level < len(branching) else len(nodes)
        groups = [nodes[i : i + width] for i in range(0, len(nodes), width)]
        for offset, group in enumerate(groups):
            parent.update({child: next_id + offset for child in group})
        nodes, next_id, level = (
            list(range(next_id, next_id + len(groups))),
            next_id + len(groups),
            level + 1,
        )
    root = nodes[0]
    if lifted and root < n:  # the only other token: one flat root family
        root, next_id = next_id, next_id + 1
        parent.update({t: root for t in range(n)})
    parent.update({t: root for t in lifted})
    parent[root] = -1
    return SignalHierarchy.from_parent([parent[i] for i in range(next_id)])


def paths(parent, slot, nodes) -> list[tuple[int, ...]]:
    """The slot path from the root of every node in ``nodes`` (an ordered tree, leaf by
    leaf, independent of how internal nodes are numbered)."""
    out = []
    for node in nodes.tolist():
        path = []
        while int(parent[node]) not in (node, -1):
            path.append(int(slot[node]))
            node = int(parent[node])
        out.append(tuple(reversed(path)))
    return out


def random_case(gen, with_lifted: bool):
    num = int(torch.randint(1, 5, (1,), generator=gen))
    lengths = torch.randint(1, 40, (num,), generator=gen).tolist()
    depth = int(torch.randint(0, 4, (1,), generator=gen))
    branching = tuple(torch.randint(2, 6, (depth,), generator=gen).tolist())
    lifted = []
    for n in lengths:
        k = int(torch.randint(0, n, (1,), generator=gen)) if with_lifted else 0
        lifted.append(sorted(torch.randperm(n, generator=gen)[:k].tolist()))
    return lengths, branching, lifted


@pytest.mark.parametrize("with_lifted", [False, True])
def test_window_forest_equals_the_reference_trees(with_lifted):
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        lengths, branching, lifted = random_case(gen, with_lifted)
        mask = torch.cat([torch.isin(torch.arange(n), torch.tensor(s, dtype=torch.long))
                          for n, s in zip(lengths, lifted, strict=True)])  # fmt: skip
        forest = window_forest(lengths, branching, lifted=mask)
        trees = [reference_tree(n, branching, s) for n, s in zip(lengths, lifted, strict=True)]
        assert forest.num_trees == len(lengths) and forest.num_leaves == sum(lengths)
        assert bool(forest.is_leaf[: sum(lengths)].all())
        for b, tree in enumerate(trees):
            nodes = (forest.batch == b).nonzero().view(-1)
            got = paths(forest.parent, forest.slot, nodes)
            want = paths(tree.parent, tree.slot, torch.arange(tree.num_nodes))
            leaves = forest.is_leaf[nodes]
            assert [p for p, leaf in zip(got, leaves, strict=True) if leaf] == want[
                : tree.num_leaves
            ]
            assert sorted(got) == sorted(want)
            assert sorted(forest.depth[nodes].tolist()) == sorted(tree.depth.tolist())
        # the same attention as PyG's batch of the reference trees, causal included
        q, k, v = (torch.randn(sum(lengths), 2, 3, generator=gen, dtype=torch.float64)
                   for _ in range(3))  # fmt: skip
        batch = Batch.from_data_list(trees)
        for causal in (False, True):
            out = hierarchical_attention(q, k, v, forest, include_self=True, leaky_causal=causal)
            ref = hierarchical_attention(q, k, v, batch, include_self=True, leaky_causal=causal)
            assert (out - ref).abs().max() <= 1e-12


def test_window_hierarchy_is_a_one_tree_forest():
    tree = window_hierarchy(10, (2, 4), x=torch.arange(10.0)[:, None])
    assert "batch" not in tree and tree.x.shape == (10, 1)
    ref = reference_tree(10, (2, 4))  # the same numbering; only the root's parent differs
    assert torch.equal(tree.parent[:-1], ref.parent[:-1]) and torch.equal(tree.slot, ref.slot)


def test_lifted_tokens_sit_left_of_the_top_windows():
    # 6 tokens, token 4 lifted: windows of 2 over 0 1 2 3 5 -> root family [4, w01, w23, w5]
    forest = window_forest([6], (2,), lifted=torch.tensor([False] * 4 + [True, False]))
    nodes = torch.arange(forest.num_nodes)
    root = int(nodes[forest.parent == nodes])
    family = nodes[(forest.parent == root) & (nodes != root)]
    family = family[forest.slot[family].argsort()]
    assert int(family[0]) == 4 and int(forest.depth[4]) == 1
    windows = [sorted(nodes[forest.parent == w].tolist()) for w in family[1:].tolist()]
    assert windows == [[0, 1], [2, 3], [5]]


@pytest.mark.parametrize(
    "lengths, lifted, match",
    [
        ([], None, "non-empty"),
        ([3, 0], None, ">= 1"),
        ([2], torch.tensor([True, True]), "n - 1"),
        ([2], torch.tensor([True]), r"\[2\] bool"),
        ([2], torch.tensor([1, 0]), r"\[2\] bool"),
    ],
)
def test_bad_input(lengths, lifted, match):
    with pytest.raises(ValueError, match=match):
        window_forest(lengths, (2,), lifted=lifted)
    with pytest.raises(ValueError, match="branching"):
        window_forest([3], (1,))


@pytest.mark.parametrize(
    "lengths", [[3.7, 2], torch.tensor([2.9, 3.1]), torch.tensor([True, True])], ids=str
)
def test_lengths_that_are_not_ints(lengths):
    """Fractions and bools are not token counts (they would be truncated or read as 1)."""
    with pytest.raises(TypeError, match="lengths must hold integers"):
        window_forest(lengths, (2,))


def test_a_single_window_size_is_refused():
    """(``'int' object is not iterable``.)"""
    for branching in (2, "24"):
        with pytest.raises(TypeError, match="branching must be a sequence of window sizes"):
            window_hierarchy(5, branching)


def test_tensors_are_made_on_the_inputs_device():
    """With the default device set elsewhere (``meta``), CPU inputs still give the CPU
    result: every tensor is made on the device of ``lengths``/``lifted``/``x``."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 12, 30])
    lifted = torch.rand(48, generator=gen) < 0.2
    lifted[[0, 6, 18]] = False  # at most n - 1 lifted per sequence
    x = torch.randn(48, 3, generator=gen)
    for build in (
        lambda: window_forest(lengths, (2, 3), lifted=lifted, x=x),
        lambda: window_forest(lengths.tolist(), (4,), lifted=lifted),
        lambda: window_forest(lengths, (3, 2)),
        lambda: window_hierarchy(30, (2, 4), x=x[:30], lifted=lifted[:30]),
    ):
        ref = build()
        with torch.device("meta"):
            out = build()
        for key in ("parent", "slot", "depth", "x", "batch"):
            if key in ref:
                assert out[key].device.type == "cpu", key
                assert torch.equal(out[key], ref[key]), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inputs_give_a_cuda_forest_equal_to_cpu():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 12, 30])
    lifted = torch.rand(48, generator=gen) < 0.2
    lifted[[0, 6, 18]] = False
    x = torch.randn(48, 3, generator=gen)
    ref = window_forest(lengths, (2, 3), lifted=lifted, x=x)
    for args in (
        (lengths.cuda(), lifted.cuda(), x.cuda()),
        (lengths.tolist(), lifted.cuda(), None),
    ):
        out = window_forest(args[0], (2, 3), lifted=args[1], x=args[2])
        for key in ("parent", "slot", "depth", "batch"):
            assert out[key].device.type == "cuda", key
            assert torch.equal(out[key].cpu(), ref[key]), key
    h = window_hierarchy(30, (2, 4), x=x[:30].cuda())
    assert h.parent.device.type == "cuda"
    assert torch.equal(h.parent.cpu(), window_hierarchy(30, (2, 4)).parent)


@pytest.mark.parametrize(
    "length, block_size, error, match",
    [
        (16, 0, ValueError, "block_size must be an even int >= 2"),  # (looped forever)
        (16, -2, ValueError, "block_size must be an even int >= 2"),  # (looped forever)
        (16, 3, ValueError, "block_size must be an even int >= 2"),
        (0, 4, ValueError, "length must be a positive int, got 0"),
        (16.0, 4, TypeError, "length must be a positive int"),
    ],
)
def test_hmatrix_layout_refuses_bad_sizes(length, block_size, error, match):
    with pytest.raises(error, match=match):
        hmatrix_layout(length, block_size)


def test_lengths_as_numpy_or_tensor_integers():
    expected = window_hierarchy(5, (2,))
    for n in (np.int64(5), torch.tensor(5)):
        assert torch.equal(window_hierarchy(n, (2,)).parent, expected.parent)
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        window_hierarchy(0, (2,))
    for n in (2.0, True, torch.tensor(2.0)):
        with pytest.raises(TypeError, match="n must be an int"):
            window_hierarchy(n, (2,))


def test_branching_factors_as_numpy_integers_and_lifted_as_a_tensor():
    """``(np.int64(2),)`` was refused as "branching factors must be ints >= 2"; a list as
    ``lifted`` raised an ``AttributeError``."""
    expected = window_hierarchy(5, (2, 3))
    assert torch.equal(window_hierarchy(5, (np.int64(2), np.int32(3))).parent, expected.parent)
    with pytest.raises(TypeError, match="each branching factor must be an int, got 2.5"):
        window_hierarchy(5, (2.5,))
    with pytest.raises(TypeError, match=r"lifted must be a \[5\] bool tensor or None, got list"):
        window_hierarchy(5, (2,), lifted=[True, False, False, False, False])


def test_hmatrix_layout_takes_a_numpy_block_size():
    """A NumPy block size was refused ("block_size must be an int, got int64")."""
    layout = hmatrix_layout(100, np.int64(4))
    assert layout == hmatrix_layout(100, 4) and all(type(v) is int for v in layout)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        hmatrix_layout(100, 4.0)
