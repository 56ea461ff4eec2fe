import itertools
import random

import pytest
import torch
from torch_geometric.data import Batch, Data

from hiergraph.data import from_nested, window_forest, window_hierarchy
from hiergraph.plan import CausalPlan, TreeIndex, tree_index
from hiergraph.plan.costs import BLOCK_COST
from hiergraph.plan.tree_index import padded_widths
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


@pytest.mark.parametrize("slice_saving", [None, 30.0])  # default; runs of >= 4 slots slice
def test_blocks_cover_families(monkeypatch, slice_saving):
    if slice_saving is not None:
        monkeypatch.setattr(tree_index, "SLICE_SAVING", slice_saving)
    trees = [window_hierarchy(37, (3, 5)), from_nested([[0, 1, 2, 3, 4, 5, 6], 7, [8, 9]])]
    h = Batch.from_data_list(trees)
    idx = h.tree_index()
    assert idx.levels[0].blocks == []
    for level in idx.levels[1:]:
        positions = torch.arange(level.size)
        seen = []
        for block in level.blocks:
            rows = block.rows(positions)
            assert rows.shape == (block.count, block.width)
            valid = block.valid if block.valid is not None else torch.ones_like(rows, dtype=bool)
            seen.append(rows[valid])
            # every family's members share the parent the block names
            parent = level.parent_local[rows]
            assert torch.all(parent[valid] == block.parents[:, None].expand_as(rows)[valid])
            if block.start is None:
                # as wide as its largest family; padding repeats the first member
                assert block.width == int(block.valid.sum(1).max())
                assert torch.all(rows[~valid] == rows[:, :1].expand_as(rows)[~valid])
        assert torch.equal(torch.cat(seen).sort().values, positions)  # each node exactly once
    sliced = {b.width for b in idx.levels[-1].blocks if b.start is not None}
    assert (3 in sliced) == (slice_saving is not None)  # the leaves' 12 windows of 3 in a row
    full = window_hierarchy(64, (4, 4)).tree_index()
    assert all(b.start is not None for lv in full.levels for b in lv.blocks)
    assert [lv.fanout for lv in full.levels] == [4, 4, 4, 0]


@pytest.mark.parametrize("slice_saving", [None, 30.0])  # gather blocks only; mixed
def test_level_gather_and_results_round_trip(monkeypatch, slice_saving):
    """The one gather of a level's gather blocks gives every gather block its rows
    (``FamilyBlock.rows``), and results written block by block come back in level order."""
    if slice_saving is not None:
        monkeypatch.setattr(tree_index, "SLICE_SAVING", slice_saving)
    rng = random.Random(5)
    trees = [from_nested(random_spec(rng, rng.randint(2, 30), max_branch=7)) for _ in range(6)]
    trees.append(window_hierarchy(37, (3, 5)))
    idx = Batch.from_data_list(trees).tree_index()
    kinds, paths = set(), set()
    for level in idx.levels[1:]:
        paths.add(_results_path(level))
        x = torch.randn(level.size, 2, 3)
        gathered = level.gather(x)
        rows, slots = level.result_buffers(x, (2, 3))
        for block in level.blocks:
            assert torch.equal(block.slots(x, gathered), block.rows(x))
            block.slots(rows, slots).copy_(block.rows(x))
            kinds.add(block.start is None)
        assert torch.equal(level.results(rows, slots), x)
    assert kinds == {True, False}  # gather and slice blocks both seen
    assert ("mixed" if slice_saving else "gathers") in paths  # both ways results come back


def _results_path(level) -> str:
    """How a level's block results come back: one gather, or slices plus gathered rows."""
    if level.node_slot is not None:
        return "gathers"
    return "mixed" if level.gather_src is not None else "slices"


def test_a_run_of_equal_families_is_a_slice_block_when_it_saves_a_block():
    """Runs of equal windows become slice blocks when their slots save more than a block
    costs (long trees); short runs join the gather blocks, one per level here."""
    long = window_forest([1000, 990], (16, 4)).tree_index()
    assert [(b.width, b.start is not None) for b in long.levels[-1].blocks] == [
        (16, True),
        (16, True),
        (14, False),
    ]  # 62 and 61 windows of 16; the partial last windows (8 and 14 leaves) gathered
    short = window_forest([100, 90, 80], (16, 4)).tree_index()
    assert [(b.width, b.start is None) for b in short.levels[-1].blocks] == [(16, True)]


def test_padded_widths_least_cost():
    """The cut of the sizes into gather blocks is the cheapest (BLOCK_COST per block, one per
    slot), against every cut, and a single size keeps its width."""
    rng = random.Random(0)
    for _ in range(50):
        sizes = sorted(rng.sample(range(1, 40), rng.randint(1, 6)))
        counts = [rng.choice([1, 3, 10, 100]) for _ in sizes]

        cuts = itertools.product([False, True], repeat=len(sizes) - 1)
        best = min(_cost(_widths_of_cut(sizes, cut), counts) for cut in cuts)
        widths = padded_widths(sizes, counts)
        assert _cost(widths, counts) == best
        assert all(w >= s for w, s in zip(widths, sizes, strict=True)) and widths[-1] == sizes[-1]
    assert padded_widths([3], [1]) == [3]
    assert padded_widths([2, 3, 16], [1, 1, 1000]) == [16, 16, 16]  # a few pad to the wide
    assert padded_widths([2, 16], [1000, 1000]) == [2, 16]  # many keep their width


def _cost(widths: list[int], counts: list[int]) -> int:
    return BLOCK_COST * len(set(widths)) + sum(w * c for w, c in zip(widths, counts, strict=True))


def _widths_of_cut(sizes: list[int], cut) -> list[int]:
    """The widths when a block ends after every size where ``cut`` is true (and the last)."""
    widths, first = [], 0
    for i, end in enumerate([*cut, True]):
        if end:
            widths += [sizes[i]] * (i + 1 - first)
            first = i + 1
    return widths


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


def tensors_in(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor a plan holds, in its fields and the parts it built on first use."""
    seen = set() if seen is None else seen
    if id(obj) in seen:  # a causal plan and its tree index refer to each other
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors_in(item, seen)]
    if hasattr(obj, "__dict__"):
        return [t for value in vars(obj).values() for t in tensors_in(value, seen)]
    return []


def test_plans_built_under_inference_mode_serve_autograd():
    """A plan first asked for by an evaluation under ``torch.inference_mode()`` (and the
    parts built on first use) holds ordinary tensors, which autograd may save."""
    tree = Batch.from_data_list([window_hierarchy(12, (4, 3)), window_hierarchy(6, (3, 2))])
    with torch.inference_mode():
        index = tree.tree_index()
        lazy = [index.causal_plan, index.sibling_pairs, index.node_tree]  # built on first use
        lazy += [level.sibling_pairs for level in index.levels]
        moved = index.to("cpu")
    tensors = tensors_in(index) + tensors_in(moved) + tensors_in(lazy)
    assert len(tensors) > 50 and not any(t.is_inference() for t in tensors)


def _tensors(value, path="index"):
    """Every ``(path, tensor)`` reachable through dataclass fields and lists."""
    import dataclasses

    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name), f"{path}.{f.name}")


def test_to_moves_every_tensor_of_the_plan():
    """Every tensor of the index, its levels and blocks, its padded embedding and its causal
    plan moves: a field left behind would fail (or copy) on the device at every call."""
    forest = window_forest([37, 5, 64, 20, 2], (4, 4))
    index = forest.tree_index()
    assert index.padded is not None and index.causal_plan is not None
    assert any(block.start is None for level in index.levels for block in level.blocks)
    moved = index.to("meta")
    found = list(_tensors(moved)) + list(_tensors(moved.causal_plan, "causal_plan"))
    assert len(found) > 40
    assert [path for path, t in found if t.device.type != "meta"] == []
    assert [path for path, t in _tensors(index) if t.device.type != "cpu"] == []
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
