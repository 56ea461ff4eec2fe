import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import window_hierarchy
from hiergraph.integrations import (
    SCORE_FLOPS,
    block_attention_flops,
    flat_attention_flops,
    hsa_attention_flops,
)


@pytest.mark.parametrize(
    "length, mflops",
    [(264, 214.94), (54, 8.99), (12, 0.4441), (26, 2.08), (55, 9.33), (70, 15.11), (38, 4.45)],
)
def test_flat_reproduces_paper_table3(length, mflops):
    # the paper's flat numbers (Amizadeh et al., Table 3) are N^2 (4 * 768 + 12)
    digits = 4 if mflops < 1 else 2
    assert round(flat_attention_flops(length, 768) / 1e6, digits) == mflops


def test_hsa_family_term_matches_note_reconstruction():
    # IMDB at 264 tokens, bottom-up (2, 4, 8, 16): sum_f b_f^2 = 1338 scores (note: 4.13 MFLOPs)
    flops = hsa_attention_flops(window_hierarchy(264, (2, 4, 8, 16)), 768)
    assert flops["family"] == 1338 * (4 * 768 + SCORE_FLOPS)
    assert flops["total"] == flops["family"] + flops["tree"] and flops["tree"] > 0
    # the bookkeeping, counted by hand on a tree of 6 leaves in windows of 2 under one root
    # (9 edges: per edge the pooled q, k, v sums (2 (2d + d_v)), a gate (SCORE_FLOPS) and
    # the accumulation (2 d_v); per leaf its own weighted value (2 d_v)), d = 4, d_v = 3
    small = hsa_attention_flops(window_hierarchy(6, (2,)), 4, heads=2, value_dim=3)
    per_edge = 2 * (2 * 4 + 3) + SCORE_FLOPS + 2 * 3
    assert small["tree"] == 2 * (9 * per_edge + 6 * 2 * 3)


def test_flat_family_costs_flat_attention_plus_bookkeeping():
    n, d, heads = 37, 8, 3
    flops = hsa_attention_flops(window_hierarchy(n, ()), d, heads)
    assert flops["family"] == flat_attention_flops(n, d, heads)


def test_block_flops():
    assert block_attention_flops(50, 50, 16, 2) == flat_attention_flops(50, 16, 2)
    per_score = 2 * 16 + 2 * 16 + SCORE_FLOPS
    assert block_attention_flops(10, 4, 16) == (2 * 16 + 4) * per_score
    with pytest.raises(ValueError, match="block"):
        block_attention_flops(10, 0, 16)


def test_batch_sums_over_trees_and_value_dim():
    trees = [window_hierarchy(n, (2, 3)) for n in (5, 17, 1)]
    total = hsa_attention_flops(Batch.from_data_list(trees), 4, 2, value_dim=6)
    parts = [hsa_attention_flops(t, 4, 2, value_dim=6) for t in trees]
    assert total == {k: sum(p[k] for p in parts) for k in total}
    no_self = hsa_attention_flops(trees[1], 4, 2, value_dim=6, include_self=False)
    assert parts[1]["total"] - no_self["total"] == 2 * 2 * 6 * 17
    assert isinstance(total["total"], int) and torch.is_tensor(trees[0].parent)


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: flat_attention_flops(-5, 64), ValueError, "num_tokens"),
        (lambda: flat_attention_flops(2.5, 64), TypeError, "num_tokens"),
        (lambda: block_attention_flops(-10, 3, 4), ValueError, "num_tokens"),
        (lambda: block_attention_flops(10, 0, 4), ValueError, "block_size"),
        (lambda: flat_attention_flops(8, -1), ValueError, "head_dim"),
        (lambda: flat_attention_flops(8, 4, heads=-2), ValueError, "heads"),
    ],
)
def test_sizes_are_checked(call, error, name):
    """(Negative sizes gave negative FLOPs, fractional ones fractional FLOPs.)"""
    with pytest.raises(error, match=f"^{name} must be"):
        call()


def test_hsa_flops_check_heads_flags_and_the_hierarchy():
    """(-2 heads counted negative FLOPs, 1.5 fractional ones; include_self="no" was true.)"""
    from hiergraph.data import window_hierarchy
    from hiergraph.integrations import hsa_attention_flops

    tree = window_hierarchy(8, (2,))
    for heads, error in ((-2, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="heads must be an int >= 0"):
            hsa_attention_flops(tree, 4, heads=heads)
    with pytest.raises(TypeError, match="include_self must be a bool"):
        hsa_attention_flops(tree, 4, include_self="no")
    with pytest.raises(TypeError, match="hierarchy must be a SignalHierarchy"):
        hsa_attention_flops([1, 2], 4)
