import pytest
import torch

from hiergraph.integrations import (
    hub_scores,
    hub_window_hierarchies,
    padded_hsa,
    padded_hub_window_hsa,
    padded_window_hsa,
    select_hubs,
)
from hiergraph.integrations.hub_windows import hub_window_attention
from hiergraph.ops.hsa import native
from tests.conftest import hsa_kernel, kernel_or_torch_ops


def tree_based(q, k, v, mask, branching, hubs, **options):
    """The reference: the hub trees built per batch and run by :func:`padded_hsa`."""
    scale = options.get("scale") or q.size(-1) ** -0.5
    lifted = select_hubs(hub_scores(q, k, mask, scale), mask, hubs)
    trees = hub_window_hierarchies(mask.sum(1).tolist(), branching, lifted)
    return padded_hsa(q, k, v, mask, trees, **options)


def batch(lengths, length, dtype=torch.float64, seed=0, grad=False, d_v=4, d=4):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    # the layout transformers project into: [B, T, H, d] memory viewed as [B, H, T, d]
    q, k, v = (
        torch.randn(len(lengths), length, 3, c, generator=gen, dtype=dtype)
        .transpose(1, 2)
        .requires_grad_(grad)
        for c in (d, d, d_v)
    )
    return q, k, v, mask


CASES = [
    # lengths, padded length, branching, hubs: equal heights, mixed heights (one forest
    # per height), single tokens, two tokens (flat root), empty examples, more hubs than
    # an example may lift, no hubs, a remainder root over many windows
    ([16, 16], 16, (2, 4), 3),
    ([13, 7, 1, 2, 0, 16], 16, (2, 4), 3),
    ([20, 5, 3], 24, (2, 2, 2), 2),
    ([30, 29, 12], 32, (4,), 4),
    ([40, 33], 40, (2, 4, 8, 16), 5),
    ([64, 50, 3], 64, (2, 4), 30),
    ([9, 9], 9, (3,), 0),
    ([50, 47], 50, (2, 2), 6),
]


@pytest.fixture(params=["kernel", "torch-ops"])
def kernel_calls(request, monkeypatch):
    """The compiled kernel on (its calls, which the hub trees of windows of more than one
    token make) or off (``None``)."""
    return kernel_or_torch_ops(request, monkeypatch, native, "hub_tree_attention")


@pytest.mark.parametrize("lengths, length, branching, hubs", CASES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("size_bias", [True, False])
def test_equals_the_tree_built_per_batch(lengths, length, branching, hubs, include_self,
                                         size_bias, kernel_calls):  # fmt: skip
    q, k, v, mask = batch(lengths, length, d_v=5)
    options = dict(include_self=include_self, size_bias=size_bias)
    ref = tree_based(q, k, v, mask, branching, hubs, **options)
    out = padded_hub_window_hsa(q, k, v, mask, branching, hubs, **options)
    assert out.shape == (len(lengths), length, 3, 5)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert (out[~mask] == 0).all()
    if kernel_calls is not None:  # every case has windows of several tokens
        assert kernel_calls


def test_heads_first_inputs_in_float32(kernel_calls):
    """Inputs whose memory is ``[B, H, T, d]``, in float32, against float64; 32 channels
    and root families of up to 2 windows and 21 hubs (logits in blocks of vector width)."""
    q, k, v, mask = batch([64, 40, 3, 0, 17], 64, seed=3, d=32, d_v=32)
    want = padded_hub_window_hsa(q, k, v, mask, (2, 4, 8), 21)
    inputs = [t.float().contiguous() for t in (q, k, v)]
    out = padded_hub_window_hsa(*inputs, mask, (2, 4, 8), 21)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=1e-5)
    assert kernel_calls is None or kernel_calls


def test_the_kernel_checks_its_rows():
    ext = hsa_kernel()
    q = torch.randn(10, 2, 4, dtype=torch.float64)
    out = torch.zeros(10, 2, 4, dtype=torch.float64)
    rows, hubs = torch.arange(8).view(1, 8), torch.tensor([[8, -1]])
    ext.hub_forward(q, q, q, rows, hubs, [2, 2, 2], 0.5, True, True, out)
    assert out[:9].abs().sum(-1).gt(0).all() and not out[9].any()
    with pytest.raises(RuntimeError, match="index rows"):
        ext.hub_forward(q, q, q, rows, hubs + 2, [2, 2, 2], 0.5, True, True, out)
    with pytest.raises(RuntimeError, match="windows' leaves"):
        ext.hub_forward(q, q, q, rows, hubs, [2, 2], 0.5, True, True, out)
    with pytest.raises(RuntimeError, match="int64"):
        ext.hub_forward(q, q, q, rows.int(), hubs, [2, 2, 2], 0.5, True, True, out)
    with pytest.raises(RuntimeError, match="below the root"):
        ext.hub_forward(q, q, q, rows, hubs, [4, 1, 2], 0.5, True, True, out)
    with pytest.raises(RuntimeError, match="level below"):
        ext.hub_forward(q, q, q, rows, hubs, [8], 0.5, True, True, out)
    with pytest.raises(RuntimeError, match="out must be"):
        ext.hub_forward(q, q, q, rows, hubs, [2, 2, 2], 0.5, True, True, out.float())


@pytest.mark.parametrize("lengths, length", [([24, 17, 1, 9], 24), ([12, 12], 12)])
def test_gradients_equal_the_tree_built_per_batch(lengths, length):
    q, k, v, mask = batch(lengths, length, grad=True, seed=1)
    upstream = torch.randn(len(lengths), length, 3, 4, dtype=torch.float64)
    ref = torch.autograd.grad((tree_based(q, k, v, mask, (2, 3), 4) * upstream).sum(), (q, k, v))
    out = padded_hub_window_hsa(q, k, v, mask, (2, 3), 4)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    for got, want in zip(grads, ref, strict=True):
        assert torch.isfinite(got).all()  # a lone token's family has no key
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_padding_anywhere_and_given_hubs():
    """Tokens after padding, and hubs chosen by the caller (``lifted``)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, _ = batch([20] * 3, 20, seed=2)
    mask = torch.rand(3, 20, generator=gen) > 0.3
    mask[:, 0] = True
    lifted = (torch.rand(3, 20, generator=gen) > 0.7) & mask
    lifted[:, 0] = False  # an example keeps one token that is not a hub
    trees = hub_window_hierarchies(mask.sum(1).tolist(), (2, 2), lifted[mask])
    options = dict(include_self=True, size_bias=True, scale=0.3)
    out = hub_window_attention(q, k, v, mask, lifted, (2, 2), **options)
    ref = padded_hsa(q, k, v, mask, trees, scale=0.3)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert (out - padded_hsa(q, k, v, mask, trees)).abs().max() > 1e-6  # the scale is used


def test_without_hubs_it_is_the_window_tree():
    q, k, v, mask = batch([30, 21, 6], 32)
    out = padded_hub_window_hsa(q, k, v, mask, (2, 4), 0)
    torch.testing.assert_close(out, padded_window_hsa(q, k, v, mask, (2, 4)), rtol=0, atol=1e-12)


def test_half_precision_follows_float64():
    q, k, v, mask = batch([64, 40], 64)
    ref = padded_hub_window_hsa(q, k, v, mask, (2, 4, 8), 8)
    out = padded_hub_window_hsa(*(t.bfloat16() for t in (q, k, v)), mask, (2, 4, 8), 8)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() < 0.05


def test_bad_branching_and_hubs_raise():
    q, k, v, mask = batch([8], 8)
    with pytest.raises(ValueError, match="branching"):
        padded_hub_window_hsa(q, k, v, mask, (1, 2), 2)
    with pytest.raises(ValueError, match="hubs must be"):
        padded_hub_window_hsa(q, k, v, mask, (2,), -1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu():
    q, k, v, mask = batch([40, 17, 1, 0, 33], 40, grad=True)
    cpu = padded_hub_window_hsa(q, k, v, mask, (2, 4), 6)
    inputs = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    gpu = padded_hub_window_hsa(*inputs, mask.cuda(), (2, 4), 6)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-12)
    upstream = torch.randn_like(cpu)
    want = torch.autograd.grad((cpu * upstream).sum(), (q, k, v))
    got = torch.autograd.grad((gpu * upstream.cuda()).sum(), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=1e-12)
