import pytest
import torch

from hiergraph.data import window_hierarchy
from hiergraph.integrations import (
    hub_scores,
    hub_selection_flops,
    hub_window_hierarchies,
    hub_window_hierarchy,
    padded_hsa,
    select_hubs,
    window_hierarchies,
)


def children(tree, node):
    return (tree.parent == node).nonzero().flatten().tolist()


def root_of(tree):
    return int((tree.parent == torch.arange(tree.parent.numel())).nonzero())


def test_hubs_hang_under_the_root_and_the_rest_keeps_its_windows():
    n, hubs = 11, [0, 4, 10]
    tree = hub_window_hierarchy(n, (2, 2), hubs)
    assert tree.num_leaves == n and bool(tree.is_leaf[:n].all())
    root = root_of(tree)
    assert set(hubs) <= set(children(tree, root))
    # the other tokens, in order, form exactly window_hierarchy(8, (2, 2)) below the root
    rest = [i for i in range(n) if i not in hubs]
    ref = window_hierarchy(len(rest), (2, 2))
    for i, token in enumerate(rest):
        siblings = [rest[j] for j in children(ref, int(ref.parent[i]))]
        assert children(tree, int(tree.parent[token])) == siblings
    assert tree.depth[hubs].tolist() == [1, 1, 1]


def test_no_hubs_is_the_window_hierarchy():
    tree, ref = hub_window_hierarchy(9, (2, 4), []), window_hierarchy(9, (2, 4))
    assert torch.equal(tree.parent, ref.parent)


def test_one_other_token_gives_a_flat_family():
    tree = hub_window_hierarchy(3, (2,), [0, 2])
    assert tree.parent.tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize(
    "hubs, match", [([5], r"in \[0, 5\)"), ([1, 1], "distinct"), ([0, 1, 2, 3, 4], "at most 4")]
)
def test_bad_hubs(hubs, match):
    with pytest.raises(ValueError, match=match):
        hub_window_hierarchy(5, (2,), hubs)


def test_hub_scores_and_the_hub_count_are_checked():
    """(A 0/1 mask failed in masked_fill, a short one in a product; 1.5 hubs in topk.)"""
    from hiergraph.integrations.hubs import lifted_tokens

    q = torch.randn(2, 3, 6, 4)
    mask = torch.ones(2, 6, dtype=torch.bool)
    for wrong in (mask.long(), mask[:, :3]):
        with pytest.raises(ValueError, match="token_mask must be a"):
            hub_scores(q, q, wrong)
    with pytest.raises(ValueError, match="q and k must be"):
        hub_scores(q, q[:, :, :5], mask)
    with pytest.raises(TypeError, match="hubs must be an int"):
        lifted_tokens(hub_scores(q, q, mask), mask, 1.5)


def test_fractional_hubs_and_lengths_are_refused_not_truncated():
    with pytest.raises(TypeError, match="hubs must hold integers"):
        hub_window_hierarchy(5, (2,), [1.7])  # was hub 1
    with pytest.raises(TypeError, match="lengths must be an int, got 2.5"):
        hub_window_hierarchies([2.5, 2], (2,), torch.zeros(4, dtype=torch.bool))  # was 2


def test_negative_lengths_and_flop_arguments_are_refused():
    """A negative token count was dropped like an empty example; negative or fractional
    FLOP arguments gave a count of their own."""
    with pytest.raises(ValueError, match=r"lengths must be token counts >= 0, got \[3, -1\]"):
        window_hierarchies([3, -1], (2,))
    with pytest.raises(ValueError, match="lengths must be token counts >= 0"):
        hub_window_hierarchies([3, -1], (2,), torch.zeros(3, dtype=torch.bool))
    assert window_hierarchies([3, 0], (2,)).num_nodes == window_hierarchies([3], (2,)).num_nodes
    for args, error, name in (((-4, 8), ValueError, "num_tokens"), ((4, 0), ValueError,
                              "head_dim"), ((4, 8, 1.5), TypeError, "heads")):  # fmt: skip
        with pytest.raises(error, match=f"^{name} must be"):
            hub_selection_flops(*args)
    assert hub_selection_flops(4, 8, 2) == 2 * 3 * 4 * 8


@pytest.mark.parametrize(
    "layout", ["heads-first", "token-major", "mixed"], ids=str
)  # [B, H, T, d] memory, a view of [B, T, H, d] (a Hugging Face layer's), one of each
def test_hub_scores_are_the_root_level_logits(layout):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 6, 3, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    if layout != "token-major":
        k = k.contiguous()
    if layout == "heads-first":
        q = q.contiguous()
    valid = torch.tensor([[True] * 6, [False, True, True, True, True, False]])
    scores = hub_scores(q, k, valid, scale=0.5)
    for b in range(2):
        q_mean = q[b][:, valid[b]].mean(1)  # [H, d]
        ref = torch.logsumexp(0.5 * torch.einsum("hd,htd->ht", q_mean, k[b]), dim=0)
        torch.testing.assert_close(scores[b][valid[b]], ref[valid[b]])
    assert torch.isinf(scores[~valid]).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_hub_scores_match_the_packed_root_scores(dtype):
    """The padded-batch scores are :func:`root_scores` of the packed valid tokens, in
    float32 for half precision."""
    from hiergraph.ops.hsa.hubs import root_scores

    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(3, 2, 7, 4, generator=gen).to(dtype) for _ in range(2))
    valid = torch.arange(7)[None] < torch.tensor([[7], [3], [5]])
    scores = hub_scores(q, k, valid)
    assert scores.dtype == torch.promote_types(dtype, torch.float32)
    packed = [x.transpose(1, 2)[valid] for x in (q, k)]  # [L, H, d] valid tokens in order
    tree = torch.arange(3).repeat_interleave(valid.sum(1))
    torch.testing.assert_close(scores[valid], root_scores(*packed, tree))


def test_select_hubs_marks_hubs_among_valid_tokens():
    valid = torch.tensor(
        [[False, False, True, True, True], [True, True, False, False, False], [False] * 5]
    )
    scores = torch.tensor([[0.0, 0.0, 3.0, 1.0, 2.0], [5.0, 4.0, 0.0, 0.0, 0.0], [0.0] * 5])
    scores = scores.masked_fill(~valid, float("-inf"))
    lifted = select_hubs(scores, valid, 2)
    # valid tokens in example order; at most n - 1 hubs; the empty example has none
    assert lifted.tolist() == [True, False, True, True, False]
    assert not select_hubs(scores, valid, 0).any()
    with pytest.raises(ValueError, match=">= 0"):
        select_hubs(scores, valid, -1)
    forest = hub_window_hierarchies([3, 2, 0], (2,), lifted)
    assert forest.num_leaves == 5 and forest.num_trees == 2
    for tree, n, hubs in ((0, 3, [0, 2]), (1, 2, [0])):
        ref = hub_window_hierarchy(n, (2,), hubs)
        assert int((forest.batch == tree).sum()) == ref.num_nodes
    with pytest.raises(ValueError, match="one entry per valid token"):
        hub_window_hierarchies([3, 2], (2,), lifted[:4])


def test_a_hub_every_query_attends_to_gets_its_mass_back():
    """With windows a distant hub is seen through its window's mean value; lifted to the
    root it keeps (almost) its softmax weight."""
    torch.manual_seed(0)
    n, d, hub = 32, 8, 27
    common = torch.randn(d, dtype=torch.float64)  # shared by every query
    q = common + 0.3 * torch.randn(1, 1, n, d, dtype=torch.float64)
    k = 0.3 * torch.randn(1, 1, n, d, dtype=torch.float64)
    k[0, 0, hub] = 4.0 * common / common.norm() ** 2  # q_i . k_hub ~ 4 for every query
    valid = torch.ones(1, n, dtype=torch.bool)
    eye = torch.eye(n, dtype=torch.float64).view(1, 1, n, n)
    softmax = torch.softmax(q @ k.transpose(-1, -2), -1)[0, 0, :, hub]
    picked = select_hubs(hub_scores(q, k, valid, scale=1.0), valid, 1)
    assert picked.nonzero().flatten().tolist() == [hub]
    windows = window_hierarchy(n, (4, 4))
    lifted = hub_window_hierarchies([n], (4, 4), picked)
    far = torch.arange(n) // 16 != hub // 16  # queries in the other top-level block
    weight = {
        name: padded_hsa(q, k, eye, valid, tree, scale=1.0)[0, :, 0, hub]
        for name, tree in (("windows", windows), ("hubs", lifted))
    }
    err = {name: (w - softmax)[far].abs().mean() for name, w in weight.items()}
    assert float(softmax[far].mean()) > 0.5  # the hub takes half of every query's mass
    assert float(weight["windows"][far].mean()) < 0.1  # lost in its window's mean
    assert err["hubs"] < 0.4 * err["windows"]
