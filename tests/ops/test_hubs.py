import pytest
import torch

from hiergraph.ops.hubs import root_scores, top_per_tree


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
