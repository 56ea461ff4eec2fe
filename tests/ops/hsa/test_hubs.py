import pytest
import torch

from hiergraph.ops.hsa.hubs import root_scores, top_per_tree


def test_root_scores_match_the_formula_per_tree():
    torch.manual_seed(0)
    q, k = torch.randn(7, 3, 4, dtype=torch.float64), torch.randn(7, 3, 4, dtype=torch.float64)
    tree = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    mask = torch.tensor([1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    s = root_scores(q, k, tree, mask)
    for t, leaves in ((0, [0, 1, 2]), (1, [3, 5, 6])):  # leaf 4 is padding
        q_mean = q[leaves].mean(0)  # [H, d]
        for j in (tree == t).nonzero().view(-1).tolist():
            expected = ((q_mean * k[j]).sum(-1) / 2).logsumexp(0)
            if mask[j]:
                assert torch.allclose(s[j], expected, atol=1e-14)
            else:
                assert s[j] == float("-inf")


def test_top_per_tree_takes_the_best_finite_scores_of_every_tree():
    s = torch.tensor([0.1, 3.0, 2.0, -1.0, 5.0, 4.0, float("-inf"), 1.0, 1.0])
    tree = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    assert top_per_tree(s, tree, 2).tolist() == [0, 1, 1, 0, 1, 1, 0, 1, 1]
    assert top_per_tree(s, tree, 1).tolist() == [0, 1, 0, 0, 1, 0, 0, 1, 0]  # tie: lower index
    assert top_per_tree(s, tree, 10).tolist() == [1, 1, 1, 1, 1, 1, 0, 1, 1]  # never padding
    assert not top_per_tree(s, tree, 0).any()
    with pytest.raises(ValueError, match=">= 0"):
        top_per_tree(s, tree, -1)


def test_root_scores_in_bfloat16_pick_the_float32_hubs():
    # 512 leaves: a bf16 leaf count stops at 256, which doubled the mean query and, with two
    # heads, made leaf 2 outrank leaf 1 (logsumexp is not scale invariant)
    q, k = torch.zeros(512, 2, 1), torch.full((512, 2, 1), -10.0)
    q[0] = 512.0  # mean query (1, 1); the total is exact in bf16
    k[1], k[2] = torch.tensor([[0.5], [0.5]]), torch.tensor([[1.0], [-20.0]])
    tree = torch.zeros(512, dtype=torch.long)
    ref = root_scores(q, k, tree, scale=1.0)
    half = root_scores(q.bfloat16(), k.bfloat16(), tree, scale=1.0)
    assert top_per_tree(half, tree, 1).nonzero().view(-1).tolist() == [1]
    assert torch.equal(top_per_tree(half, tree, 5), top_per_tree(ref, tree, 5))
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, ref)


def test_root_scores_in_float16_stay_finite_on_long_trees():
    torch.manual_seed(0)
    q = torch.full((8192, 2, 4), 20.0, dtype=torch.float16)  # the sum overflows fp16
    k = torch.randn(8192, 2, 4).half()
    tree, mask = torch.zeros(8192, dtype=torch.long), torch.ones(8192, dtype=torch.bool)
    mask[-1] = False
    s = root_scores(q, k, tree, mask)
    assert torch.isfinite(s[:-1]).all() and s[-1] == float("-inf") and s.dtype == torch.float32
    torch.testing.assert_close(s, root_scores(q.float(), k.float(), tree, mask))
    assert root_scores(q.double(), k.double(), tree).dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_equal_trees_given_by_their_count(dtype):
    """Trees of equal size one after another: the count gives the scores and the choice
    of their ids (ties included)."""
    torch.manual_seed(0)
    q, k = (torch.randn(24, 3, 4, dtype=torch.float64).to(dtype) for _ in range(2))
    tree = torch.arange(4).repeat_interleave(6)
    mask = torch.rand(24) > 0.3
    for leaf_mask in (None, mask):
        want = root_scores(q, k, tree, leaf_mask, scale=0.7)
        got = root_scores(q, k, 4, leaf_mask, scale=0.7)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.bfloat16 else 0)
    ties = torch.tensor([0.1, 3.0, 2.0, 3.0, 5.0, float("-inf"), 1.0, 1.0, 1.0])
    for g in range(5):
        assert torch.equal(
            top_per_tree(ties, 3, g), top_per_tree(ties, torch.arange(3).repeat_interleave(3), g)
        )


@pytest.mark.parametrize(
    "tree, error, match",
    [
        (3, ValueError, "tree=3 equal trees cannot share 10 leaves"),
        (0, ValueError, "must be a positive int, got 0"),
        (2.0, TypeError, "must be a positive int, got 2.0"),
        (torch.zeros(9, dtype=torch.long), ValueError, r"tree must be a \[10\] integer tensor"),
        (torch.zeros(10), ValueError, r"tree must be a \[10\] integer tensor"),
    ],
    ids=str,
)
def test_trees_that_do_not_number_the_leaves_are_refused(tree, error, match):
    """(A view of a wrong shape or an index_add of floats failed deep inside before.)"""
    q = torch.randn(10, 2, 4)
    with pytest.raises(error, match=match):
        root_scores(q, q, tree)
    with pytest.raises(error, match=match):
        top_per_tree(torch.randn(10), tree, 1)


def test_hub_counts_and_key_shapes_are_checked():
    """(2.5 hubs picked 3 per tree; keys of one head were broadcast over two.)"""
    with pytest.raises(TypeError, match="hubs must be an int >= 0, got 2.5"):
        top_per_tree(torch.randn(10), 2, 2.5)
    with pytest.raises(ValueError, match="hubs must be an int >= 0, got -1"):
        top_per_tree(torch.randn(10), 2, -1)
    with pytest.raises(ValueError, match=r"q and k must be \[L, H, d\] with the same shape"):
        root_scores(torch.randn(10, 2, 4), torch.randn(10, 1, 4), 2)


def test_a_numpy_count_of_trees_is_a_count():
    """(It passed the check and then was taken for a tensor of tree ids.)"""
    np = pytest.importorskip("numpy")
    q = torch.randn(10, 2, 4)
    torch.testing.assert_close(root_scores(q, q, np.int64(2)), root_scores(q, q, 2))
    scores = torch.randn(10)
    assert torch.equal(top_per_tree(scores, np.int64(2), 1), top_per_tree(scores, 2, 1))
