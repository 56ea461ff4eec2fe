"""HierarchyLoader: the tree index is built where batches are collated and reaches the loop."""

import pytest
import torch
from torch_geometric.data import Data

from hiergraph.data import window_hierarchy
from hiergraph.loader import HierarchyLoader
from hiergraph.ops import hierarchical_attention
from hiergraph.plan import level as level_module
from hiergraph.plan.padded_forest import PaddedForest
from hiergraph.plan.tree_index import TreeIndex


@pytest.mark.parametrize("num_workers", [0, 1])
def test_batches_arrive_with_their_tree_index(num_workers, monkeypatch):
    trees = [window_hierarchy(n, (2, 3), x=torch.randn(n, 4)) for n in (5, 8, 11, 3, 7)]
    loader = HierarchyLoader(trees, batch_size=2, num_workers=num_workers)
    batches = list(loader)
    assert [b.num_trees for b in batches] == [2, 2, 1]

    def no_rebuild(*args):
        raise AssertionError("the training loop rebuilt a tree index")

    monkeypatch.setattr(TreeIndex, "from_hierarchy", no_rebuild)
    # the parts built on first use came complete (whichever path reads them)
    monkeypatch.setattr(level_module, "make_blocks", no_rebuild)
    monkeypatch.setattr(PaddedForest, "from_tree_index", no_rebuild)
    for batch in batches:
        batch = batch.to("cpu")
        index = batch.tree_index()  # cached: built in the collate step
        assert index.num_leaves == batch.num_leaves
        q = batch.x.view(-1, 2, 2)
        for kernel in ("dense", "blocks"):
            assert hierarchical_attention(q, q, q, batch, kernel=kernel).shape == q.shape
        index.to("meta")  # off the CPU: nothing left to build first


def test_rejects_datasets_that_are_not_hierarchies():
    loader = HierarchyLoader([Data(x=torch.randn(3, 2))] * 2, batch_size=2)
    with pytest.raises(TypeError, match="SignalHierarchy"):
        next(iter(loader))
