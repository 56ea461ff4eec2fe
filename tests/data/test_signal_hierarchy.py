import io
import pickle

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from hiergraph.data import (
    Domain,
    Family,
    SignalHierarchy,
    from_nested,
    lift_leaves,
    window_forest,
    window_hierarchy,
)
from hiergraph.data.signal_hierarchy import as_hierarchy
from hiergraph.nn import global_leaf_mean_pool
from hiergraph.plan import TreeIndex
from tests.saving import reloaded


def children_of(h, node):
    kids = (h.parent == node).nonzero().view(-1)
    kids = kids[kids != node]
    return kids[torch.argsort(h.slot[kids])].tolist()


def test_from_nested_structure():
    x = torch.randn(5, 3)
    h = from_nested([[2, 0], [1, Family([3, 4], "set")]], x=x)
    assert h.num_nodes == 9 and h.num_leaves == 5 and h.num_trees == 1
    assert h.is_leaf[:5].all() and not h.is_leaf[5:].any()  # leaves first
    assert torch.equal(h.x, x)
    root = int((h.parent == torch.arange(9)).nonzero())
    first, second = children_of(h, root)
    assert children_of(h, first) == [2, 0]  # child order kept, leaf i = x row i
    set_family = children_of(h, second)[1]
    assert children_of(h, set_family) == [3, 4]
    assert h.domain[3] == Domain.SET and h.domain[2] == Domain.GRID1D
    assert h.domain[root] == Domain.NONE
    assert h.depth[[2, 0, 1, 3]].tolist() == [2, 2, 2, 3]
    assert h.edge_index.shape == (2, 8)
    assert torch.equal(h.parent[h.edge_index[0]], h.edge_index[1])


def test_from_nested_annotations():
    grid = Family([0, 1, 2, 3], "2d", pos=[(0, 0), (0, 1), (1, 0), (1, 1)], node_type=2)
    h = from_nested(
        {"image": grid, "title": [4, 5]},
        keys={"image": 0, "title": 1},
        leaf_type=[1, 1, 1, 1, 0, 0],
    )
    assert h.pos[:4].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert (h.domain[:4] == Domain.GRID2D).all() and (h.domain[4:6] == Domain.GRID1D).all()
    assert h.node_type[:6].tolist() == [1, 1, 1, 1, 0, 0]
    image = int(h.parent[0])
    assert h.node_type[image] == 2 and h.domain[image] == Domain.KEY_VALUE
    assert h.pos[int(h.parent[4])].tolist() == [1, 0]  # key id of "title"


def test_single_leaf_tree():
    h = from_nested(0, x=torch.ones(1, 2))
    assert h.num_nodes == 1 and h.num_leaves == 1 and h.parent.tolist() == [0]
    assert h.edge_index.shape == (2, 0)


@pytest.mark.parametrize(
    "n, branching, level_sizes",
    [
        (10, (2, 4), [10, 5, 2, 1]),
        (16, (2, 4, 8), [16, 8, 2, 1]),
        (1, (2,), [1]),
        (2, (2, 4, 8), [2, 1]),
        (7, (8,), [7, 1]),
        (100, (2, 4), [100, 50, 13, 1]),
    ],
)
def test_window_hierarchy(n, branching, level_sizes):
    h = window_hierarchy(n, branching)
    depth_max = len(level_sizes) - 1
    assert h.num_leaves == n and h.num_nodes == sum(level_sizes)
    counts = torch.bincount(depth_max - h.depth, minlength=len(level_sizes))
    assert counts.tolist() == level_sizes
    for level, b in enumerate(branching[: len(level_sizes) - 2]):
        nodes = (h.depth == depth_max - level - 1).nonzero().view(-1)
        sizes = [len(children_of(h, int(a))) for a in nodes]
        assert max(sizes) == b and all(s == b for s in sizes[:-1])
    if n > 1:  # leaves in sequence order inside windows
        assert children_of(h, int(h.parent[0]))[:2] == [0, 1]


def test_from_parent_relabels_leaves_first():
    # 0 root, 1 internal, 2..4 leaves
    h = SignalHierarchy.from_parent([-1, 0, 1, 1, 0], x=torch.arange(3.0)[:, None])
    assert h.is_leaf.tolist() == [True, True, True, False, False]
    assert h.num_trees == 1 and h.depth.tolist() == [2, 2, 1, 0, 1]
    assert children_of(h, 3) == [4, 2]  # old (1, 4) in id order
    assert children_of(h, 4) == [0, 1]


def test_batching_shifts_structure():
    trees = [
        from_nested([[0, 1], 2], x=torch.randn(3, 4)),
        window_hierarchy(5, (2,), x=torch.randn(5, 4)),
    ]
    batch = Batch.from_data_list(trees)
    assert batch.num_trees == 2 and batch.num_leaves == 8
    offset = trees[0].num_nodes
    assert torch.equal(batch.parent[offset:], trees[1].parent + offset)
    assert torch.equal(batch.x, torch.cat([t.x for t in trees]))
    loader = DataLoader(trees * 3, batch_size=4)
    sizes = [b.num_trees for b in loader]
    assert sizes == [4, 2]
    assert isinstance(batch.to_data_list()[1], SignalHierarchy)
    assert torch.equal(batch.to_data_list()[1].parent, trees[1].parent)


@pytest.mark.parametrize("forest_first", [True, False])
def test_forests_and_single_trees_batch_together(forest_first):
    """A forest's ``batch`` is derived, not stored: PyG collates forests with single trees in
    any order, its batch numbers the elements, the trees are numbered in leaf order, and
    the elements come back whole."""
    forest = window_forest([5, 3, 7], (2, 4), x=torch.randn(15, 4))
    tree = from_nested([[0, 1], 2], x=torch.randn(3, 4))
    items = [forest, tree] if forest_first else [tree, forest]
    batch = Batch.from_data_list(items)
    assert batch.num_graphs == 2 and batch.num_trees == 4
    assert torch.equal(
        batch.batch, torch.repeat_interleave(torch.tensor([n.num_nodes for n in items]))
    )
    offset = 0 if forest_first else 1  # the forest's trees among the batch's, in leaf order
    pooled = global_leaf_mean_pool(batch.x, batch)
    for t, rows in enumerate(forest.x.split([5, 3, 7])):
        torch.testing.assert_close(pooled[offset + t], rows.mean(0))
    torch.testing.assert_close(pooled[3 - 3 * offset], tree.x.mean(0))
    again = batch.to_data_list()[offset]
    assert "batch" not in again and torch.equal(again.batch, forest.batch)
    assert forest.batch.tolist()[:15] == [0] * 5 + [1] * 3 + [2] * 7
    assert torch.equal(tree.batch, torch.zeros(tree.num_nodes, dtype=torch.long))


def test_a_batch_that_is_set_is_kept():
    tree = from_nested([[0, 1], 2])
    tree.batch = torch.full((tree.num_nodes,), 4)
    assert "batch" in tree and tree.batch.tolist() == [4] * tree.num_nodes


@pytest.mark.parametrize(
    "parent, match",
    [
        ([1, 0], "exactly one root"),
        ([-1, 0, 3, 2], "cycle"),
        ([-1, -1, 0], "exactly one root"),
        ([-1, 5], r"parent ids must lie"),
        ([-1, 1], "cycle"),
    ],
)
def test_from_parent_bad_structure(parent, match):
    with pytest.raises(ValueError, match=match):
        SignalHierarchy.from_parent(parent)


def test_from_parent_large_slots_keep_parent_order():
    # slots may be any distinct non-negative ints; they only order the siblings
    for big in (5, 6, 100):
        h = SignalHierarchy.from_parent([-1, 0, 0, 1], slot=[0, 0, big, 0])
        # leaves first: old 2 -> 0, old 3 -> 1; internal old 0 -> 2 (root), old 1 -> 3
        assert h.edge_index.tolist() == [[3, 0, 1], [2, 2, 3]]
        assert children_of(h, 2) == [3, 0]
        parents = h.edge_index[1]
        assert bool((parents[1:] >= parents[:-1]).all())  # ordered by parent


def test_from_parent_bad_slots():
    with pytest.raises(ValueError, match=r"slot.* >= 0.*-1"):
        SignalHierarchy.from_parent([-1, 0, 0, 1, 1], slot=[0, 0, 1, -1, 0])
    with pytest.raises(ValueError, match="share a slot"):
        SignalHierarchy.from_parent([-1, 0, 0], slot=[0, 7, 7])


def test_from_parent_bad_domain():
    with pytest.raises(ValueError, match=r"Domain members .*GRAPH=5.*got \[9\]"):
        SignalHierarchy.from_parent([-1, 0, 0], domain=[0, 9, 2])
    with pytest.raises(ValueError, match=r"got \[-1\] at node\(s\) \[1\]"):
        SignalHierarchy.from_parent([-1, 0, 0], domain=[0, -1, 2])
    h = SignalHierarchy.from_parent([-1, 0, 0], domain=[0, int(Domain.GRAPH), 1])
    assert h.domain.tolist() == [5, 1, 0]


def test_from_parent_internal_without_leaves():
    with pytest.raises(ValueError, match="no children, so no leaves below"):
        SignalHierarchy.from_parent([-1, 0, 0], is_leaf=[False, True, False])


@pytest.mark.parametrize(
    "spec, x, match",
    [
        ([[0, 1], []], torch.randn(2, 2), "no children"),
        ([0, 5], torch.randn(2, 2), "out of range"),
        ([0, 0, 1], torch.randn(3, 2), "more than one leaf"),
        ([0, 1], torch.randn(3, 2), "rows .* not used"),
        ([0, -1], torch.randn(2, 2), "out of range"),
        ({"a": 0}, torch.randn(1, 2), "unknown key"),
    ],
)
def test_from_nested_bad_input(spec, x, match):
    with pytest.raises(ValueError, match=match):
        from_nested(spec, x=x)


def test_non_finite_features():
    x = torch.randn(3, 2)
    x[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite .* row\(s\) \[1\]"):
        from_nested([0, 1, 2], x=x)
    with pytest.raises(ValueError, match="non-finite"):
        window_hierarchy(3, (2,), x=torch.tensor([[1.0], [float("inf")], [0.0]]))
    complex_nan = torch.tensor([[complex(float("nan"), 0)], [0j], [1j]])
    with pytest.raises(TypeError, match="x must be real .*, got torch.complex64"):
        from_nested([0, 1, 2], x=complex_nan)


def test_bad_types_and_windows():
    with pytest.raises(TypeError, match="nested spec"):
        from_nested([0, "a"])
    with pytest.raises(ValueError, match="branching"):
        window_hierarchy(8, (1, 2))
    with pytest.raises(ValueError, match="positive int"):
        window_hierarchy(0)
    with pytest.raises(ValueError, match="x has 3 rows but the tree has 4 leaves"):
        window_hierarchy(4, (2,), x=torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"one feature row per leaf, \[4, \.\.\.\], got a 0-d"):
        window_hierarchy(4, (2,), x=torch.tensor(1.0))  # (said "x has 0 rows")
    with pytest.raises(ValueError, match="unknown domain"):
        Family([0], "sphere")
    with pytest.raises(TypeError, match=r"got a tensor \(pass spec.tolist\(\)\)"):
        from_nested(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"x must be \[L, F\] leaf features, got shape \(\)"):
        from_nested([0], x=torch.tensor(1.0))
    for empty in ([], torch.tensor([])):  # (an empty list reads as float: not a dtype error)
        with pytest.raises(ValueError, match="parent must be a non-empty 1-D tensor"):
            SignalHierarchy.from_parent(empty)


def _count_index_builds(monkeypatch) -> list[int]:
    from hiergraph.plan.tree_index import TreeIndex

    builds, build = [], TreeIndex.from_hierarchy.__func__

    def counted(cls, h, **kwargs):
        builds.append(1)
        return build(cls, h, **kwargs)

    monkeypatch.setattr(TreeIndex, "from_hierarchy", classmethod(counted))
    return builds


def test_tree_index_travels_with_to_clone_and_pickle(monkeypatch):
    batch = Batch.from_data_list([window_hierarchy(9, (3,)), from_nested([[0, 1], [2]])])
    builds = _count_index_builds(monkeypatch)
    index = batch.tree_index()
    assert batch.tree_index() is index and len(builds) == 1  # cached
    moved = batch.to("cpu", non_blocking=True)  # what a training loop does with each batch
    assert moved.tree_index() is not None and len(builds) == 1
    assert moved.tree_index() is index  # already there: kept with the parts it built
    loaded = pickle.loads(pickle.dumps(batch))  # how a DataLoader worker hands batches over
    assert len(builds) == 1
    assert torch.equal(loaded.tree_index().order, index.order)
    assert len(builds) == 1
    clone = batch.clone()
    clone.tree_index()
    assert len(builds) == 1
    clone.parent[0] = clone.parent[0]  # an in-place write invalidates the cache
    clone.tree_index()
    assert len(builds) == 2
    batch.slot = batch.slot.clone()  # so does replacing the tensor
    batch.tree_index()
    assert len(builds) == 3


def test_a_saved_dataset_of_hierarchies_reads_back_weights_only(tmp_path):
    trees = [from_nested([[0, 1], [2, 3, 4]], x=torch.randn(5, 4)), window_hierarchy(9, (3,))]
    trees[1].x = torch.randn(9, 4)
    trees[0].tree_index()  # collation leaves the built plan behind
    dataset = reloaded(trees, str(tmp_path / "data.pt"), SignalHierarchy)
    for tree, loaded in zip(trees, dataset, strict=True):
        assert isinstance(loaded, SignalHierarchy)
        for key in ("x", "parent", "slot", "is_leaf", "depth"):
            assert torch.equal(loaded[key], tree[key])


def test_a_pickled_plan_is_not_read_weights_only():
    from hiergraph.datasets.processed import SAFE_CLASSES, allowing  # PyG's containers and storages

    def weights_only_round_trip(tree):
        saved = io.BytesIO()
        torch.save(tree, saved)
        saved.seek(0)
        with allowing(SAFE_CLASSES):
            return torch.load(saved, weights_only=True)

    tree = from_nested([[0, 1], [2, 3, 4]])
    assert torch.equal(weights_only_round_trip(tree).parent, tree.parent)
    tree.tree_index()  # trusted without checks once loaded: not from an untrusted file
    with pytest.raises(pickle.UnpicklingError, match="TreeIndex"):
        weights_only_round_trip(tree)


@pytest.mark.parametrize("cached", [("pickled", torch.zeros(3)), ("pickled",), "pickled"])
def test_unpickling_keeps_only_a_tree_index_as_the_plan(cached):
    tree = from_nested([[0, 1], [2, 3, 4]])
    state = {**tree.__dict__, "_tree_index_cache": cached}
    loaded = SignalHierarchy.__new__(SignalHierarchy)
    loaded.__setstate__(state)  # what a pickle's state may say
    assert isinstance(loaded.tree_index(), TreeIndex)


def test_a_hierarchy_of_inference_tensors_is_planned_and_checked_on_every_use(monkeypatch):
    """Inference tensors (a tree built under ``torch.inference_mode()``) have no version
    counter: no cache can follow their writes, so the plan is not kept and the structure
    is checked every time."""
    builds = _count_index_builds(monkeypatch)
    with torch.inference_mode():
        tree = window_hierarchy(16, (4, 4))
        index = tree.tree_index()
        assert torch.equal(tree.tree_index().order, index.order) and len(builds) == 2
        tree.parent[0] = 1  # a leaf under a leaf: checked, although a builder made it
        with pytest.raises(ValueError):
            tree.tree_index()


def test_a_stored_depth_that_no_longer_follows_parent_is_refused():
    """Editing ``parent`` in place is allowed (the plan is rebuilt and checked), but a
    ``depth`` left from the old tree made pooling and ``lift_leaves`` work on another tree
    (a lifted tree that crashed its own plan): the check names the stale node."""
    h = from_nested([0, [1], [2], [3]])  # root 4; nodes 5-7 over leaves 1-3
    h.parent[5] = 6  # a chain 4 <- 7 <- 6 <- 5 <- leaf 1
    h.parent[6] = 7
    h.slot[5] = h.slot[6] = 1
    lifted = torch.tensor([True, False, True, True])
    with pytest.raises(ValueError, match="depth does not follow parent: node 1 has depth 2"):
        h.tree_index()
    with pytest.raises(ValueError, match="depth does not follow parent"):
        lift_leaves(h, lifted)
    h.depth = torch.tensor([1, 4, 3, 2, 0, 3, 2, 1])
    out, node = lift_leaves(h, lifted)
    assert out.tree_index().num_leaves == 4
    assert node.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # the chain above leaf 1 stays


def test_from_parent_builds_on_the_parent_device():
    """Every tensor is made on ``parent``'s device, not the default one (meta here)."""
    parent = torch.tensor([4, 4, 5, 5, -1, 4])
    x = torch.randn(4, 2)
    ref = SignalHierarchy.from_parent(parent, x=x)
    with torch.device("meta"):
        h = SignalHierarchy.from_parent(parent, x=x)
    for key in ("parent", "slot", "depth", "domain", "pos", "node_type", "edge_index"):
        assert h[key].device.type == "cpu" and torch.equal(h[key], ref[key]), key
    if torch.cuda.is_available():
        on_cuda = SignalHierarchy.from_parent(parent.cuda(), x=x.cuda())
        assert torch.equal(on_cuda.parent.cpu(), ref.parent)


def test_as_hierarchy_passes_hierarchies_and_names_what_it_refuses():
    tree = window_hierarchy(6, (2, 3))
    batch = Batch.from_data_list([tree, tree])
    assert as_hierarchy(tree) is tree and as_hierarchy(batch) is batch
    edges = r"got a \[2, E\] tensor \(an edge_index\?\).*layer\(x, hierarchy\)"
    listed = r"got a list: batch the hierarchies first.*from_data_list"
    for wrong, match in ((torch.zeros(6, dtype=torch.long), "got a tensor"),
                         (Data(x=torch.ones(3, 1)), "got a Data without a community tree"),
                         (tree.edge_index, edges),
                         ([tree], listed)):  # fmt: skip
        with pytest.raises(TypeError, match=f"hierarchy must be a SignalHierarchy.*{match}"):
            as_hierarchy(wrong)


@pytest.mark.parametrize("edited", [False, True])
def test_a_plan_finds_the_depths_once(edited, monkeypatch):
    """The structure check finds every node's depth; the plan built after it reads them
    instead of following the parent links again (a builder's unchanged tree, not checked,
    is followed once, by the plan)."""
    from hiergraph.plan import depth, tree_index, validation

    calls = []

    def counted(parent):
        calls.append(parent.numel())
        return depth.node_depth(parent)

    for module in (tree_index, validation):
        monkeypatch.setattr(module, "node_depth", counted)
    tree = window_forest([9, 5, 12], (3, 2))
    if edited:
        tree.slot = tree.slot.clone()  # no longer the builder's: checked first
    TreeIndex.of(tree)
    assert calls == [tree.num_nodes]
