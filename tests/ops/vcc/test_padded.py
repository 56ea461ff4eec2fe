"""Static-shape VCC (padded tensors) vs the ragged tree path and the explicit matrices."""

import math

import pytest
import torch

from hiergraph.ops.vcc.padded import (
    PaddedSegmentTree,
    partition_padded,
    select_padded,
    vcc_layer_padded,
    vip_score_fn_padded,
)
from tests.ops.vcc.test_layer import Layer, _batch, _run_dense, _run_tree

CASES = [
    ((3,), (None, 2)),
    ((2, 2), (None, 1, 2)),
    ((4,), (None, 0)),
    ((2, 3), (1, None, 2)),
    ((3,), (0, 1)),
    ((4,), (None, 100)),
    ((2, 2), (None, None, None)),
]


def _run_padded(layers, x, vip, mask, branching, budgets, slots=None):
    slots = int(vip.sum(1).max()) if slots is None else slots
    p, c, part = partition_padded(x, vip, mask, slots, branching)
    for layer in layers:
        score = vip_score_fn_padded(layer.query(p), part.slot_real, layer.key)
        p, c = vcc_layer_padded(layer, p, part.slot_real, c, part.tree, budgets, score)
    return part.restore(p, c)


@pytest.mark.parametrize("branching, budgets", CASES)
def test_padded_path_equals_tree_path_over_layers(branching, budgets):
    """Same partitions (stable top-k, ties to the earlier segment), same outputs and
    gradients; and both equal the explicit S^dagger gamma(S X) + X."""
    x, vip, mask = _batch()
    layers = [Layer(s) for s in range(3)]
    xs = [x.clone().requires_grad_() for _ in range(2)]
    weight = torch.randn_like(x)
    out = _run_padded(layers, xs[0], vip, mask, branching, budgets)
    ref, selections = _run_tree(layers, xs[1], vip, mask, branching, budgets)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    dense = _run_dense(layers, x, vip, mask, selections)
    torch.testing.assert_close(out.detach(), dense, rtol=0, atol=1e-12)
    assert (out[~mask] == 0).all()
    (grad,) = torch.autograd.grad((out * weight).sum(), xs[0])
    (ref_grad,) = torch.autograd.grad((ref * weight).sum(), xs[1])
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


def test_vip_tokens_past_the_slots_are_compressed_with_the_others():
    x, vip, mask = _batch(num_vip=(3, 0, 2))
    first_two = vip & (torch.cumsum(vip, 1) <= 2)
    layers = [Layer(0), Layer(1)]
    out = _run_padded(layers, x, vip, mask, (3,), (None, 1), slots=2)
    ref, _ = _run_tree(layers, x, first_two, mask, (3,), (None, 1))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_empty_sequences_and_no_slots_stay_finite():
    x, vip, mask = _batch(lengths=(13, 0, 6), num_vip=(2, 0, 0))
    x[~mask] = float("nan")  # padding never reaches a real token
    x.requires_grad_()
    out = _run_padded([Layer(0)], x, vip, mask, (4,), (None, 1), slots=2)
    ref, _ = _run_tree([Layer(0)], x.detach().nan_to_num(), vip, mask, (4,), (None, 1))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(grad).all() and (grad[~mask] == 0).all()
    none = _run_padded([Layer(0)], x.detach(), vip & False, mask, (4,), (None, 1), slots=0)
    assert torch.isfinite(none).all() and (none[~mask] == 0).all()


def test_tree_counts_and_means():
    lengths = torch.tensor([7, 0, 12])
    tree = PaddedSegmentTree.from_lengths(lengths, 12, (2, 3))
    assert tree.capacity == 12 and tree.num_levels == 3
    assert tree.count[1].tolist() == [[2, 2, 2, 1, 0, 0], [0] * 6, [2] * 6]
    assert tree.count[2].tolist() == [[6, 1], [0, 0], [6, 6]]
    assert tree.count[3].tolist() == [[7], [0], [12]]
    c = torch.randn(3, 12, 2, dtype=torch.float64)
    c = c * (torch.arange(12) < lengths[:, None]).unsqueeze(-1)
    means = tree.means(c)
    torch.testing.assert_close(means[2][0, 1], c[0, 6])
    torch.testing.assert_close(means[3][2, 0], c[2].mean(0))
    assert (means[3][1] == 0).all()
    assert tree.children(2, torch.tensor([[1]])).tolist() == [[3, 4, 5]]
    wide = PaddedSegmentTree.from_lengths(lengths, 13, (2, 3))
    assert wide.capacity == 18  # rounded up to a multiple of 2 * 3


def test_selection_rows_are_a_partition():
    """The finite-bias rows cover every real token exactly once, with log s as bias."""
    x, vip, mask = _batch()
    p, c, part = partition_padded(x, vip, mask, 3, (2, 2))
    layer = Layer(0)
    score = vip_score_fn_padded(layer.query(p), part.slot_real, layer.key)
    rows = select_padded(c, part.tree, (None, 2, 3), score)
    covered = torch.zeros(c.shape[:2], dtype=torch.long)
    for r in rows:
        size = part.tree.capacity // part.tree.count[r.level].size(1)
        node = r.node if r.node is not None else torch.arange(r.value.size(1)).expand(3, -1)
        for b, j in (~r.key_bias.isneginf()).nonzero().tolist():
            n = int(node[b, j])
            covered[b, n * size : (n + 1) * size] += 1
            count = int(part.tree.count[r.level][b, n])
            assert math.isclose(r.key_bias[b, j].item(), math.log(count))
    real = part.tree.count[0] > 0
    assert (covered[real] == 1).all() and real.sum() == mask.sum() - vip.sum()


def test_bad_arguments():
    x, vip, mask = _batch()
    p, c, part = partition_padded(x, vip, mask, 3, (3,))
    with pytest.raises(ValueError, match="budgets needs 2 entries"):
        select_padded(c, part.tree, (None,))
    with pytest.raises(ValueError, match="score_fn is required"):
        select_padded(c, part.tree, (None, 2))
    with pytest.raises(ValueError, match="layer_fn must return its input's shape"):
        vcc_layer_padded(lambda z, b: z[:, 1:], p, part.slot_real, c, part.tree, (None, 0))
    with pytest.raises(ValueError, match="layer_fn must return its input's shape .*, got list"):
        vcc_layer_padded(lambda z, b: z.tolist(), p, part.slot_real, c, part.tree, (None, 0))


def test_scores_of_another_shape_are_refused():
    """(A scalar score broadcast against the candidates: every candidate tied, and the first
    ones were refined whatever the VIP tokens attend to.)"""
    x, vip, mask = _batch()
    p, c, part = partition_padded(x, vip, mask, 3, (3,))
    for score_fn in (lambda m, b: m.sum(), lambda m, b: m.sum(-1, keepdim=True)):
        with pytest.raises(ValueError, match=r"score_fn must return one score per candidate "):
            select_padded(c, part.tree, (None, 2), score_fn)


def test_sequences_without_token_positions_are_refused():
    x, vip, mask = _batch()
    with pytest.raises(ValueError, match=r"at least one token position, got \(3, 0, 8\)"):
        partition_padded(x[:, :0], vip[:, :0], mask[:, :0], 2, (3,))  # (a size error)


def test_shapes_that_do_not_match_the_tree_are_refused():
    """(A ``c`` of one sequence broadcast against two: the second sequence's output was
    built from the first one's tokens; lengths past the capacity made counts of no tree.)"""
    x, vip, mask = _batch()
    p, c, part = partition_padded(x, vip, mask, 3, (3,))
    layer = lambda z, b: z  # noqa: E731
    for wrong in (c[:1], c[:, :-3], c[0]):
        with pytest.raises(ValueError, match=r"c must be \[3, \d+, d\] \(the tree's \[B, n_c\]\)"):
            vcc_layer_padded(layer, p, part.slot_real, wrong, part.tree, (None, 0))
        with pytest.raises(ValueError, match="c must be"):
            select_padded(wrong, part.tree, (None, 0))
    with pytest.raises(ValueError, match="p must be \\[B, S, d\\] with c's B and d"):
        vcc_layer_padded(layer, p[:1], part.slot_real, c, part.tree, (None, 0))
    with pytest.raises(ValueError, match="slot_real must have p's"):
        vcc_layer_padded(layer, p, part.slot_real[:, :1], c, part.tree, (None, 0))
    with pytest.raises(TypeError, match="slot_real must be a bool tensor"):
        vcc_layer_padded(layer, p, part.slot_real.long(), c, part.tree, (None, 0))
    for lengths in (torch.tensor([3, 5]), torch.tensor([-1, 2])):
        with pytest.raises(ValueError, match=r"lengths must lie in \[0, capacity = 4\]"):
            PaddedSegmentTree.from_lengths(lengths, 4, (2,))
    with pytest.raises(TypeError, match="lengths must be a 1-D integer tensor"):
        PaddedSegmentTree.from_lengths(torch.tensor([1.0, 2.0]), 4, (2,))
    with pytest.raises(ValueError, match="num_slots"):
        partition_padded(x, vip, mask, -1, (3,))
    with pytest.raises(TypeError, match="token_mask must be a bool tensor"):
        partition_padded(x, vip, mask.long(), 3, (3,))


def test_a_layer_that_returns_another_dtype_runs_as_in_the_ragged_form():
    """Under autocast a layer returns bfloat16 rows while the tree's values stay float32
    (the token rows' scatter into them failed on the dtypes; the ragged form ran)."""
    from hiergraph.ops import partition_padded
    from hiergraph.ops.vcc.padded import vcc_layer_padded, vip_score_fn_padded

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def layer(z, key_bias):
        return lin((z @ z.transpose(1, 2) + key_bias[:, None]).softmax(-1) @ z)

    x, vip = torch.randn(2, 9, 4), torch.zeros(2, 9, dtype=torch.bool)
    vip[:, 0] = True
    p, c, part = partition_padded(x, vip, None, 1, (2,))
    score = vip_score_fn_padded(p[:, :, None], part.slot_real, lambda m: m[:, :, None])
    full = vcc_layer_padded(layer, p, part.slot_real, c, part.tree, (None, 1), score)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = vcc_layer_padded(layer, p, part.slot_real, c, part.tree, (None, 1), score)
    assert half[0].dtype == torch.bfloat16 and half[1].dtype == c.dtype
    for a, b in zip(half, full, strict=True):
        torch.testing.assert_close(a.float(), b, atol=0.05, rtol=0.05)
