import random

import pytest
import torch
from torch_geometric.data import Batch, Data

from hiergraph.data import from_nested, window_forest, window_hierarchy
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import native
from hiergraph.plan import CausalPlan, TreeIndex
from tests.conftest import random_spec


def random_batch(seed: int, max_leaves: int) -> tuple[list, Batch]:
    """Four random mixed-depth trees of 1 to ``max_leaves`` leaves and their batch."""
    rng = random.Random(seed)
    trees = [from_nested(random_spec(rng, rng.randint(1, max_leaves))) for _ in range(4)]
    return trees, Batch.from_data_list(trees)


@pytest.mark.parametrize("seed", range(5))
def test_bfs_layout_invariants(seed):
    trees, h = random_batch(seed, 30)
    idx = h.tree_index()
    order, rank = idx.order, idx.rank
    assert torch.equal(rank[order], torch.arange(h.num_nodes))
    depth = h.depth[order]
    assert torch.all(depth[1:] >= depth[:-1])  # levels are contiguous
    for d in range(idx.num_levels):
        lo, hi = idx.level_ptr[d], idx.level_ptr[d + 1]
        assert torch.all(depth[lo:hi] == d)
        if d:
            parents = rank[h.parent[order[lo:hi]]] - idx.level_ptr[d - 1]
            assert torch.equal(parents, idx.parent_local[d])
            assert torch.all(parents[1:] >= parents[:-1])  # families contiguous
    # families: contiguous, sorted by slot, cover all non-roots exactly once
    covered = torch.zeros(h.num_nodes, dtype=torch.long)
    for start, size in zip(idx.family_start.tolist(), idx.family_size.tolist(), strict=True):
        members = order[start : start + size]
        assert torch.all(h.parent[members] == h.parent[members[0]])
        assert torch.all(h.slot[members][1:] > h.slot[members][:-1])
        covered[start : start + size] += 1
    assert torch.all(covered[idx.level_ptr[1] :] == 1)
    # every level's leaf plan names the leaves of that level, at their places in leaf order
    leaf_order = h.is_leaf.nonzero().view(-1)
    for d, level in enumerate(idx.levels):
        at = order[idx.level_ptr[d] + level.leaf_local]
        assert torch.equal(at, leaf_order[level.leaf_id])
        assert torch.equal(at, idx.leaf_node[level.leaf_id])
    assert sum(level.leaf_local.numel() for level in idx.levels) == leaf_order.numel()


def test_leaf_permutations_list_the_leaves_level_by_level():
    """``leaves_by_level`` lists the leaves level by level (in-level order) and ``leaf_perm``
    is its inverse; both are ``None`` when that is the leaf order."""
    rng = random.Random(3)
    h = Batch.from_data_list([from_nested(random_spec(rng, 12)) for _ in range(3)])
    idx = h.tree_index()
    leaf_bfs = idx.rank[idx.leaf_node]  # BFS position of every leaf, in leaf order
    by_level = idx.leaves_by_level
    assert torch.all(torch.diff(leaf_bfs[by_level]) > 0)  # BFS order: level by level
    assert torch.equal(by_level[idx.leaf_perm], torch.arange(idx.num_leaves))
    windows = window_hierarchy(40, (4, 5)).tree_index()  # all leaves last, in order
    assert windows.leaf_perm is None and windows.leaves_by_level is None


def test_sibling_pairs():
    h = from_nested([[0, 1, 2], [3, 4], 5])
    idx = h.tree_index()
    query, key = idx.sibling_pairs
    pairs = set(zip(query.tolist(), key.tolist(), strict=True))
    expected = set()
    for start, size in zip(idx.family_start.tolist(), idx.family_size.tolist(), strict=True):
        expected |= {(start + a, start + b) for a in range(size) for b in range(size) if a != b}
    assert pairs == expected and query.numel() == len(expected)


@pytest.mark.parametrize("seed", range(4))
def test_children_leaf_rows_trees_and_pairs_of_every_position(seed):
    """The arrays the compiled forest kernel reads, against a walk of ``parent``."""
    trees, h = random_batch(seed, 25)
    idx = h.tree_index()
    order, parent = idx.order.tolist(), h.parent.tolist()
    leaves = h.is_leaf.nonzero().view(-1).tolist()  # leaf order: increasing node id
    ptr, rows = idx.child_ptr.tolist(), idx.leaf_row.tolist()
    sizes = []
    for x, node in enumerate(order):
        children = [order[y] for y in range(ptr[x], ptr[x + 1])]
        want = [c for c in range(h.num_nodes) if c != node and parent[c] == node]
        assert sorted(children) == want  # (in child order: the layout test checks slots)
        assert rows[x] == (leaves.index(node) if node in leaves else -1)
        sizes.append(len(children))
    assert idx.pair_ptr.tolist() == [sum(b * b for b in sizes[:x]) for x in range(len(sizes) + 1)]
    tree = h.batch.tolist()  # every level lists its nodes tree by tree
    for d in range(idx.num_levels):
        for t in range(len(trees)):
            lo, hi = idx.tree_ptr[d, t].item(), idx.tree_ptr[d, t + 1].item()
            level = range(idx.level_ptr[d], idx.level_ptr[d + 1])
            assert [x for x in level if tree[order[x]] == t] == list(range(lo, hi))


def test_cached_and_movable():
    h = window_hierarchy(20, (4,))
    assert h.tree_index() is h.tree_index()
    cached = h.tree_index()
    moved = cached.to("cpu")
    assert isinstance(moved, TreeIndex) and torch.equal(moved.order, cached.order)
    h.slot = h.slot.flip(0)  # replacing the structure invalidates the cache
    assert h.tree_index() is not cached
    assert torch.equal(h.tree_index().order, TreeIndex.from_hierarchy(h).order)
    h.slot.copy_(h.slot.flip(0))  # so does writing it in place
    assert torch.equal(h.tree_index().order, cached.order) and h.tree_index() is not cached
    # and writing is_leaf: the structure is checked again (the cached plan served a tree
    # with an internal node without children)
    h.tree_index()
    h.is_leaf[0] = False
    with pytest.raises(ValueError, match="node 0 is marked as internal"):
        h.tree_index()


def tensors_in(value, path="index", seen=None):
    """Every ``(path, tensor)`` a plan holds: through its attributes (its fields and the
    parts it built on first use), lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(value) in seen:  # a causal plan and its tree index refer to each other
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from tensors_in(v, f"{path}[{i}]", seen)
    elif isinstance(value, dict):
        for key, v in value.items():
            yield from tensors_in(v, f"{path}[{key!r}]", seen)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for name, v in vars(value).items():
            yield from tensors_in(v, f"{path}.{name}", seen)


def test_plans_built_under_inference_mode_serve_autograd():
    """A plan first asked for by an evaluation under ``torch.inference_mode()`` (and the
    parts built on first use) holds ordinary tensors, which autograd may save."""
    tree = Batch.from_data_list([window_hierarchy(12, (4, 3)), window_hierarchy(6, (3, 2))])
    with torch.inference_mode():
        index = tree.tree_index()
        lazy = [index.causal_plan, index.sibling_pairs, index.node_tree]  # built on first use
        lazy += [level.sibling_pairs for level in index.levels]
        moved = index.to("cpu")
    tensors = [t for part in (index, moved, lazy) for _, t in tensors_in(part)]
    assert len(tensors) > 50 and not any(t.is_inference() for t in tensors)


def test_to_moves_every_tensor_of_the_plan():
    """Every tensor of the index, its levels and blocks, its padded embedding and its causal
    plan moves: a field left behind would fail (or copy) on the device at every call."""
    forest = window_forest([37, 5, 64, 20, 2], (4, 4))
    index = forest.tree_index()
    assert index.padded is not None and index.causal_plan is not None
    assert any(block.start is None for level in index.levels for block in level.blocks)
    moved = index.to("meta")
    found = list(tensors_in(moved))
    paths = " ".join(path for path, _ in found)
    assert all(part in paths for part in (".padded.", ".blocks[", ".gathers[", ".causal_plan."))
    assert len(found) > 40
    assert [path for path, t in found if t.device.type != "meta"] == []
    assert [path for path, t in tensors_in(index) if t.device.type != "cpu"] == []
    # each tensor is moved once: the parents within levels are the levels' own (a second
    # copy of every level's parent_local was moved with the index)
    assert all(p is lv.parent_local for p, lv in zip(moved.parent_local, moved.levels, strict=True))


@pytest.mark.parametrize(
    "parent, is_leaf, error, match",
    [
        ([2, 2, 2], [True, True, True], ValueError, "node 2 is marked as a leaf"),  # planned
        ([5, 2, 2], [True, True, False], ValueError, "parent ids must lie in"),  # IndexError
        ([2, 2, 2], [1, 1, 0], TypeError, "is_leaf must be a bool tensor"),  # garbage ids
        ([1, 0, 2], [True, False, False], ValueError, "cycle"),
    ],
)
def test_from_parent_checks_the_structure(parent, is_leaf, error, match):
    """The plan builders check what they are given, as ``SignalHierarchy.tree_index`` does
    (an unchecked root marked as a leaf was planned, an integer mask read memory it did not
    own); ``validate=False`` is for structures already checked."""
    parent, slot = torch.tensor(parent), torch.zeros(len(parent), dtype=torch.long)
    is_leaf = torch.tensor(is_leaf)
    with pytest.raises(error, match=match):
        TreeIndex.from_parent(parent, slot, is_leaf)
    with pytest.raises(error, match=match):
        CausalPlan.from_hierarchy(Data(parent=parent, slot=slot, is_leaf=is_leaf))


def test_what_is_not_a_hierarchy_is_refused_with_what_to_pass_instead():
    """A plain PyG graph, a graph with its community tree, an ``edge_index`` and a list of
    trees are the values mistaken for a hierarchy: each error says what to pass."""
    from hiergraph.transforms import GraphHierarchy

    graph = Data(x=torch.randn(6, 2), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
    tree = window_hierarchy(4, (2,))
    cases = [
        (
            graph,
            r"got a Data without a community tree or another tree.*from_nested.*GraphHierarchy\(\)",
        ),
        (GraphHierarchy()(graph), r"got HierarchicalGraph.*pass graph.hierarchy\(\)"),
        (graph.edge_index, "got a .2, E. tensor .an edge_index..: the trees cannot be read"),
        ([tree, tree], r"got a list: batch the hierarchies first.*Batch.from_data_list"),
        (None, "CausalPlan, got NoneType$"),
    ]
    for value, match in cases:
        with pytest.raises(TypeError, match=match):
            TreeIndex.of(value)
    assert TreeIndex.of(GraphHierarchy()(graph).hierarchy()).num_leaves == 6


def parts_built(index: TreeIndex) -> set[str]:
    """The parts built on first use that ``index`` holds: ``padded`` and, per level ``d``,
    ``blocks{d}`` and ``gathers{d}``."""
    built = {"padded"} & vars(index).keys()
    for d, level in enumerate(index.levels):
        built |= {f"{name}{d}" for name in ("blocks", "gathers") if name in vars(level)}
    return built


def blocks_of(levels: range) -> set[str]:
    """:func:`parts_built` names of the family blocks of ``levels``."""
    return {f"{name}{d}" for name in ("blocks", "gathers") for d in levels}


def every_part(index: TreeIndex) -> set[str]:
    """:func:`parts_built` of ``index`` complete."""
    return {"padded"} | blocks_of(range(len(index.levels)))


def test_the_ops_build_the_parts_only_their_path_reads():
    """The plan an op builds leaves the padded embedding and the family blocks for first
    use: the compiled CPU kernel reads neither; the block kernel builds the blocks it
    reads, and the public ``tree_index()`` returns the plan complete."""
    if native.extension() is None:
        pytest.skip("the compiled CPU kernel is not built here")
    forest = window_forest([37, 5, 64, 20, 2], (4, 4))
    q = k = v = torch.randn(forest.num_leaves, 2, 8)
    out = hierarchical_attention(q, k, v, forest)  # the compiled forest kernel
    index = TreeIndex.of(forest)
    assert parts_built(index) == set()
    torch.testing.assert_close(hierarchical_attention(q, k, v, forest, kernel="blocks"), out)
    assert parts_built(index) == blocks_of(range(1, len(index.levels)))
    assert forest.tree_index() is index and parts_built(index) == every_part(index)


def test_a_move_off_the_cpu_completes_the_plan_first():
    """Off the CPU the parts are built before the move (there they would read the device's
    tensors on the host in the first forward); a move to the CPU keeps what is built."""
    forest = window_forest([37, 5, 64, 20, 2], (4, 4))
    lazy = TreeIndex.from_hierarchy(forest)
    assert parts_built(lazy.to("cpu")) == set() == parts_built(lazy)
    moved = lazy.to("meta")
    assert parts_built(lazy) == every_part(lazy) == parts_built(moved)
    assert moved.padded.leaf_slot.is_meta and moved.levels[1].blocks[0].parents.is_meta
    assert parts_built(lazy.to("cpu")) == every_part(lazy)


def test_compiling_over_parts_not_built_says_what_to_do():
    """A compiled forward cannot build the parts on the host: it says so, and once
    ``complete()`` has built them it traces as one graph."""
    forest = window_forest([37, 5, 64, 20, 2], (4, 4))
    index = TreeIndex.from_hierarchy(forest)
    q = k = v = torch.randn(forest.num_leaves, 2, 8)

    def attend(q, k, v):
        return hierarchical_attention(q, k, v, index)

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"padded is built on the host.*tree_index\(\)"):
        torch.compile(attend, backend="eager", fullgraph=True)(q, k, v)
    index.complete()
    torch._dynamo.reset()
    out = torch.compile(attend, backend="eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v))
