import math

import pytest
import torch

from hiergraph.ops import log_gates, logaddexp, masked_softmax
from hiergraph.ops.logspace import scatter_softmax, softmax_, softmax_dropping, softmax_kernels
from tests.conftest import relative_error, rounding_error, unordered_backward_nodes

INF = float("inf")


def test_masked_softmax_matches_softmax_and_handles_empty_rows():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    lse, w = masked_softmax(x, mask)
    ref = torch.softmax(x[0, [0, 1, 3]], 0)
    assert torch.allclose(w[0, [0, 1, 3]], ref) and torch.all(w[0, [2, 4]] == 0)
    assert torch.allclose(lse[0], torch.logsumexp(x[0, [0, 1, 3]], 0))
    assert lse[1] == -INF and torch.all(w[1] == 0)
    (lse[[0, 2]].sum() + w.sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.all(x.grad[1] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_masked_softmax_takes_a_bool_mask(dtype):
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 3, dtype=dtype))


def test_masked_softmax_refuses_a_mask_wider_than_the_logits_and_integer_logits():
    """(A ``[3, 5]`` mask on ``[5]`` logits returned ``[3, 5]`` weights; int logits failed
    with an overflow message.)"""
    mask = torch.ones(3, 5, dtype=torch.bool)
    for logits in (torch.randn(5), torch.randn(4, 5)):
        with pytest.raises(ValueError, match=r"mask \(3, 5\) must broadcast to the logits"):
            masked_softmax(logits, mask)
    with pytest.raises(TypeError, match="logits must be floating-point, got dtype torch.int64"):
        masked_softmax(torch.ones(3, 5, dtype=torch.long), mask)
    assert masked_softmax(torch.randn(2, 3, 5), mask)[1].shape == (2, 3, 5)  # broadcast is fine


def test_masked_softmax_over_no_entries_gives_empty_rows():
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    lse, w = masked_softmax(x, torch.ones(3, 0, dtype=torch.bool))
    assert torch.equal(lse, torch.full((3,), -INF, dtype=torch.float64)) and w.shape == (3, 0)
    (w.sum() + lse.clamp(min=0).sum()).backward()
    assert x.grad.shape == (3, 0)


def _composite_masked_softmax(x, mask):
    """The textbook form (``logsumexp`` and ``softmax`` over the masked entries) that
    :func:`masked_softmax` fuses, for rows with at least one entry."""
    x = x.masked_fill(~mask, -INF)
    return torch.logsumexp(x, -1), torch.softmax(x, -1)


def test_masked_softmax_gradients_match_the_composite_form_for_either_output():
    """The hand-written backward against autograd's, with the gradient of ``lse`` only, of
    the weights only, and of both."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(4, 3, 6, generator=gen) < 0.7
    mask[..., 0] = True  # every row has an entry
    g_lse, g_w = torch.randn(4, 3, generator=gen), torch.randn(4, 3, 6, generator=gen)
    for use in ("lse", "weights", "both"):
        grads = []
        for fn in (masked_softmax, _composite_masked_softmax):
            lse, w = fn(x, mask)
            loss = (lse * g_lse).sum() * (use != "weights") + (w * g_w).sum() * (use != "lse")
            grads.append(torch.autograd.grad(loss, x)[0])
        torch.testing.assert_close(grads[0], grads[1], atol=1e-14, rtol=0)
        assert torch.all(grads[0][~mask] == 0)


def test_softmax_dropping_without_empty_row_guards_equals_masked_softmax():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    drop = torch.rand(5, 7, generator=gen) < 0.5
    drop[:, 3] = False  # every row keeps an entry
    fast = softmax_dropping(x, drop, rows_nonempty=True)
    ref = masked_softmax(x, ~drop)
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    g_fast = torch.autograd.grad(fast[0].sum() + fast[1].pow(2).sum(), x)[0]
    g_ref = torch.autograd.grad(ref[0].sum() + ref[1].pow(2).sum(), x)[0]
    torch.testing.assert_close(g_fast, g_ref, atol=0, rtol=0)


def test_masked_softmax_is_differentiable_twice_with_empty_rows():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)

    def both(x):  # lse of the empty row is -inf: left out of the checked outputs
        lse, w = masked_softmax(x, mask)
        return lse[[0, 2]], w

    assert torch.autograd.gradcheck(both, (x,))
    assert torch.autograd.gradgradcheck(both, (x,))


def test_scatter_softmax_matches_masked_softmax_on_padded_rows():
    # rows 0..3 hold entries (row 2 none, row 3 only masked ones), entries out of row order
    index = torch.tensor([1, 0, 3, 1, 0, 1, 3, 0])
    mask = torch.tensor([1, 1, 0, 1, 0, 1, 0, 1], dtype=torch.bool)[:, None].expand(-1, 2)
    x = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    lse, w = scatter_softmax(x.masked_fill(~mask, -INF), index, 4)
    # dense reference: row r's entries in slots, padded with masked-out slots
    slots = torch.zeros(4, 8, dtype=torch.bool)
    slots[index, torch.arange(8)] = True
    dense = torch.where(slots[:, :, None], x[None], 0.0)  # [R, E, H]
    ref_lse, ref_w = masked_softmax(dense, slots[:, :, None] & mask[None], dim=1)
    assert torch.allclose(lse, ref_lse) and lse[2:].eq(-INF).all()
    assert torch.allclose(w, ref_w[index, torch.arange(8)]) and torch.all(w[~mask] == 0)
    (lse[:2].sum() + (w * torch.randn(8, 2, dtype=torch.float64)).sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.all(x.grad[~mask[:, 0]] == 0)


def test_scatter_softmax_backward_adds_rows_in_index_order():
    """No ``x[index]`` gather in the graph (its CPU backward adds with unordered atomics)."""
    logits = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    lse, weights = scatter_softmax(logits, torch.tensor([0, 0, 1, 2, 2, 2, 1]), 3)
    assert unordered_backward_nodes(lse.sum() + weights.sum()) == []


def test_logaddexp_both_neg_inf_has_zero_grad():
    a = torch.tensor([-INF, -INF, 0.5], requires_grad=True)
    b = torch.tensor([-INF, 1.0, 2.0], requires_grad=True)
    out = logaddexp(a, b)
    assert out[0] == -INF and out[1] == 1.0
    assert math.isclose(out[2].item(), math.log(math.exp(0.5) + math.exp(2.0)), rel_tol=1e-6)
    out.backward(torch.ones(3))  # an incoming gradient on the (-inf, -inf) entry too
    w = 1 / (1 + math.exp(1.5))  # d out / d a at (0.5, 2.0)
    assert torch.allclose(a.grad, torch.tensor([0.0, 0.0, w]))
    assert torch.allclose(b.grad, torch.tensor([0.0, 1.0, 1 - w]))


def test_log_gates_conventions():
    a = torch.tensor([-INF, 0.3, -INF, 1.0], requires_grad=True)
    b = torch.tensor([0.2, -INF, -INF, 1.0], requires_grad=True)
    log_mu, log_not = log_gates(a, b)
    assert log_mu.tolist()[:3] == [-INF, 0.0, -INF] and log_not.tolist()[:3] == [0.0, -INF, -INF]
    assert math.isclose(log_mu[3].exp().item(), 0.5) and math.isclose(log_not[3].exp().item(), 0.5)
    first = torch.autograd.grad(log_mu.exp().sum() + log_not.exp().sum(), (a, b), create_graph=True)
    second = torch.autograd.grad(sum(g.sum() for g in first), (a, b))
    assert all(torch.isfinite(g).all() for g in (*first, *second))


def test_logaddexp_second_derivative_is_finite_at_neg_inf():
    """``torch.logaddexp``'s backward at ``b = -inf`` is ``1 / (1 + e^inf)``, whose own
    derivative is NaN; the wrapper bypasses it, so double backward stays finite."""
    a = torch.tensor([0.5, -INF, -INF, 0.3], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([-INF, 0.7, -INF, 1.1], dtype=torch.float64, requires_grad=True)
    out = logaddexp(a, b)
    ga, gb = torch.autograd.grad(out.exp().sum(), (a, b), create_graph=True)
    second = torch.autograd.grad((ga + gb).sum(), (a, b))
    assert all(torch.isfinite(g).all() for g in (ga, gb, *second))
    assert out[0] == 0.5 and out[1] == 0.7 and out[2] == -INF


def test_softmaxes_are_exact_for_logits_far_beyond_exp_range():
    """Row shifts must be the row maximum: with any other shift (say the row mean) ``exp``
    overflows to inf (NaN weights) or underflows to 0 (a -inf lse) at these spreads."""
    logits = torch.tensor(
        [[800.0, -800.0], [-750.0, -760.0], [1e4, 1e4 - 1.0], [3.0, 2.0]], dtype=torch.float64
    )  # [rows, entries]: a wide row, a row below exp's range, a huge row, a plain row
    ref_lse, ref_w = torch.logsumexp(logits, 1), torch.softmax(logits, 1)
    lse, w = masked_softmax(logits, torch.ones_like(logits, dtype=torch.bool))
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=1e-15)
    torch.testing.assert_close(w, ref_w, atol=1e-15, rtol=0)
    # the same rows as an entry list, entries interleaved across rows, two heads
    index = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    flat = logits.T.reshape(-1, 1).expand(-1, 2)
    lse, w = scatter_softmax(flat, index, 4)
    torch.testing.assert_close(lse, ref_lse[:, None].expand(-1, 2), atol=1e-12, rtol=1e-15)
    torch.testing.assert_close(w, ref_w.T.reshape(-1, 1).expand(-1, 2), atol=1e-15, rtol=0)


def test_finite_shortcuts_equal_the_guarded_forms_on_finite_inputs():
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(50, generator=gen, dtype=torch.float64).mul(30).requires_grad_()
            for _ in range(2))  # fmt: skip
    for fn in (logaddexp, log_gates):
        fast, safe = fn(a, b, finite=True), fn(a, b)
        fast, safe = (torch.stack(x) if isinstance(x, tuple) else x for x in (fast, safe))
        torch.testing.assert_close(fast, safe, atol=1e-14, rtol=0)
        grads = [torch.autograd.grad(x.sum(), (a, b)) for x in (fast, safe)]
        for g_fast, g_safe in zip(*grads, strict=True):
            torch.testing.assert_close(g_fast, g_safe, atol=1e-14, rtol=0)


def test_one_sided_shortcuts_equal_the_guarded_forms_with_neg_inf_differentiable_twice():
    """``logaddexp(finite_a=True)`` and ``log_gates(finite=True)`` take ``b = -inf`` (and
    ``log_gates`` an infinite ``a`` with a finite ``b``) with the guarded forms' values and
    first and second derivatives, NaN-free."""
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(6, generator=gen, dtype=torch.float64).mul(5)
    b = torch.randn(6, generator=gen, dtype=torch.float64).mul(5)
    b[[1, 4]] = -INF
    cases = [
        (lambda a, b, **kw: logaddexp(a, b, finite_a=bool(kw)), a, b),
        (lambda a, b, **kw: torch.stack(log_gates(a, b, finite=bool(kw))).exp(), a, b),
        (lambda a, b, **kw: torch.stack(log_gates(a, b, finite=bool(kw))).exp(), b, a),
    ]
    for fn, x, y in cases:
        results = []
        for kw in ({"shortcut": True}, {}):
            xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
            out = fn(xs, ys, **kw)
            first = torch.autograd.grad(out.exp().sum(), (xs, ys), create_graph=True)
            second = torch.autograd.grad(sum(g.sum() for g in first), (xs, ys))
            results.append((out, *first, *second))
        for fast, safe in zip(*results, strict=True):
            assert not fast.isnan().any()
            torch.testing.assert_close(fast, safe, atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize("b", [2, 3, 16])
def test_the_fused_kernels_off_the_cpu_give_the_same_softmax(b):
    """Off the CPU, rows that all keep an entry take PyTorch's fused ``logsumexp`` and
    ``softmax`` (:func:`softmax_kernels`): the CPU passes' values, with -inf entries left
    out (the diagonal of a family's logits)."""
    gen = torch.Generator().manual_seed(b)
    x = torch.randn(5, b, b, generator=gen, dtype=torch.float64) * 30
    x.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))
    lse, p = softmax_kernels(x.clone())
    want_lse, want_p = softmax_(x.clone(), rows_nonempty=True)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-13)
    torch.testing.assert_close(p, want_p, rtol=0, atol=1e-15)
    assert not p.diagonal(dim1=-2, dim2=-1).any()
    lse, p = softmax_(x.to("meta"), rows_nonempty=True)  # the branch off the CPU
    assert p.shape == x.shape and lse.shape == x.shape[:-1]


@pytest.mark.parametrize("b", [2, 3, 16])
def test_the_fused_kernels_give_empty_rows_no_weight(b):
    """Rows that may keep no entry (a first child has no left sibling; a family member
    without leaves is no key) take the fused kernels too off the CPU: such a row gets
    ``lse = -inf`` and weights 0 where ``softmax`` alone gives NaN, and the other rows the
    CPU passes' values."""
    gen = torch.Generator().manual_seed(b)
    x = torch.randn(5, b, b, generator=gen, dtype=torch.float64) * 30
    x.masked_fill_(torch.rand(5, b, b, generator=gen) < 0.5, float("-inf"))
    x[1, 0] = x[3] = float("-inf")  # an empty row, and a family without any entry
    lse, p = softmax_kernels(x.clone(), rows_nonempty=False)
    want_lse, want_p = softmax_(x.clone())
    assert want_lse[1, 0] == want_lse[3, 0] == float("-inf")
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-13)
    torch.testing.assert_close(p, want_p, rtol=0, atol=1e-15)
    assert not p.isnan().any() and not p[3].any()
    lse, p = softmax_(x.to("meta"))  # the branch off the CPU
    assert p.shape == x.shape and lse.shape == x.shape[:-1]


NAN = float("nan")


def test_a_nan_logit_makes_its_row_nan_and_no_other():
    """A row with a NaN logit (among finite ones, or with every other entry left out) has a
    NaN log-partition and NaN weights in every softmax here, and is never taken for an empty
    row; the other rows, an empty one included, are unchanged."""
    x = torch.tensor([[0.5, NAN, -1.0], [NAN, -INF, -INF], [0.2, 0.3, -INF], [-INF] * 3])
    nan_rows = torch.tensor([True, True, False, False])
    clean = x.masked_fill(nan_rows[:, None], 0.0)
    drop = x == -INF
    fused = softmax_kernels(x.clone(), -1, rows_nonempty=False)
    masked = masked_softmax(x, ~drop)
    index = torch.arange(4).repeat_interleave(3)
    scattered = scatter_softmax(x.flatten(), index, 4)
    expected_lse, expected_w = softmax_(clean, -1)
    for lse, w in (softmax_(x.clone(), -1), fused, masked, scattered):
        w = w.view(4, 3)
        assert lse[nan_rows].isnan().all() and w[nan_rows].isnan().any(-1).all()
        torch.testing.assert_close(lse[~nan_rows], expected_lse[~nan_rows])
        torch.testing.assert_close(w[~nan_rows], expected_w[~nan_rows])
    assert logaddexp(torch.tensor(NAN), torch.tensor(-INF)).isnan()
    assert all(g.isnan() for g in log_gates(torch.tensor(0.5), torch.tensor(NAN)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_masked_softmax_rounds_once(dtype):
    """Half-precision logits are computed in float32: both outputs err against float64 (on
    the same logits) as much as the float64 outputs rounded once. Computed in bf16, the
    weights erred 2.5 times that."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 4096, generator=gen).to(dtype)
    mask = torch.rand(8, 4096, generator=gen) < 0.9
    got = masked_softmax(logits, mask)
    want = masked_softmax(logits.double(), mask)
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) <= 1.25 * rounding_error(w, dtype)
        assert g.dtype == dtype
