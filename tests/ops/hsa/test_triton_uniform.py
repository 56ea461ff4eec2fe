"""The Triton kernels of equal-fanout HSA against the op recorded by autograd: on CPU under
Triton's interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` where no GPU is
present), compiled on a GPU."""

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hiergraph.data import window_forest
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa import triton_uniform
from hiergraph.ops.hsa.lifted import lifted_attention
from hiergraph.ops.hsa.padded import padded_hierarchical_attention
from hiergraph.ops.hsa.uniform import uniform_hierarchical_attention
from tests.conftest import DispatchedOps, qkv_rows, spy_calls, triton_runs_kernels

if not triton_runs_kernels():
    pytest.skip(
        "needs Triton (on a GPU, or its interpreter from 3.7 on: earlier ones cannot run "
        "loops with runtime bounds)",
        allow_module_level=True,
    )
# the interpreter (NumPy) warns of the log of an empty sum (the log-partition -inf of a node
# without keys) and of differences of -inf that a select then drops
pytestmark = [
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning"),
]

# (trees, fanout top-down): families of two, three, four, five; a deep tree; a family of
# 17 members (padded to 32) and one of 32, the widest the kernels take
SHAPES = [(3, 2, 3), (2, 3, 2), (1, 2, 2, 2, 2), (2, 4, 5), (1, 3, 17), (1, 32)]
OPTIONS = [
    dict(include_self=True, size_bias=True),
    dict(include_self=False, size_bias=True),
    dict(include_self=True, size_bias=False),
    dict(include_self=False, size_bias=False),
]
TAU = 0.7
#: the checkout whose package the subprocesses import
REPO = str(Path(__file__).resolve().parents[3])
#: where the kernels run: compiled on a GPU, else in Triton's interpreter on the CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(shape, layout="node-major", heads=2, d=4, d_v=3, dtype=torch.float64, device=DEVICE):
    """``q, k, v`` of the leaves of ``shape`` (:func:`~tests.conftest.qkv_rows`)."""
    return qkv_rows(math.prod(shape), layout, heads, d, d_v, dtype, device=device)


def recorded(shape, leaf_mask=None, **options):
    """The op on ``[L, H, ·]`` rows with every operation recorded by autograd."""

    def op(q, k, v, eps=None):
        return uniform_hierarchical_attention(
            q, k, v, shape, eps or None, left_only=False, leaf_mask=leaf_mask, tau=TAU,
            fuse=False, **options,
        )  # fmt: skip

    return op


def kernels(qkv, shape, eps=(), leaf_mask=None, grad=True, **options):
    """The kernels' op (``grad``: as an autograd node, its second derivatives recorded)."""
    twin = recorded(shape, leaf_mask, **options) if grad else None
    return triton_uniform.triton_uniform_attention(
        *qkv, shape[1:], list(eps), tau=TAU, leaf_mask=leaf_mask, recorded=twin, **options
    )


def outputs_and_gradients(op, qkv, seed=1):
    out = op(qkv)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return out, torch.autograd.grad(out, qkv, grad.to(out.device))


def assert_close(got, want, **tolerance):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_recorded_op(shape, options):
    qkv = inputs(shape)
    out, grads = outputs_and_gradients(lambda t: kernels(t, shape, **options), qkv)
    want, want_grads = outputs_and_gradients(lambda t: recorded(shape, **options)(*t), qkv)
    assert type(out.grad_fn).__name__ == "_TritonUniformBackward"
    assert_close((out, *grads), (want, *want_grads), rtol=1e-12, atol=1e-12)


def embeddings(shape, heads, c=5, strided=False):
    """Position embeddings per level below the roots, ``[heads, n_d, c]`` (``strided``: the
    first channels of wider rows), requiring gradients."""
    gen = torch.Generator().manual_seed(2)
    sizes = [math.prod(shape[: i + 1]) for i in range(1, len(shape))]
    eps = [
        torch.randn(heads, n, c + 2 * strided, generator=gen, dtype=torch.float64).to(DEVICE)
        for n in sizes
    ]
    return [e[..., :c].requires_grad_() for e in eps]


@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("options", OPTIONS[:2], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 2, 5)], ids=str)
def test_position_embeddings(shape, options, shared):
    """Position energies in the logits (the leaves' self energies too) and their gradients,
    per head or shared by the heads (summed over them); 20 channels: two chunks."""
    qkv = inputs(shape, heads=3)
    eps = embeddings(shape, 1 if shared else 3, c=20, strided=True)

    out, grads = outputs_and_gradients(lambda t: kernels(t[:3], shape, t[3:], **options), qkv + eps)
    reference = recorded(shape, **options)
    want, want_grads = outputs_and_gradients(lambda t: reference(*t[:3], t[3:]), qkv + eps)
    assert_close((out, *grads), (want, *want_grads), rtol=1e-12, atol=1e-12)


def leaf_mask(shape, seed):
    """Valid leaves at random (60%), one family's leaves all masked, and with three trees
    or more one whole tree."""
    leaves, b = math.prod(shape), shape[-1]
    mask = (torch.rand(leaves, generator=torch.Generator().manual_seed(seed)) < 0.6).to(DEVICE)
    mask[b : 2 * b] = False
    if shape[0] >= 3:
        mask[-leaves // shape[0] :] = False
    return mask


MASKED = [
    (shape, options, False) for shape in [(3, 2, 3), (2, 4, 2, 2), (3, 5, 4)] for options in OPTIONS
]
MASKED += [((2, 4, 2, 2), options, True) for options in OPTIONS[:2]]  # with position embeddings


@pytest.mark.parametrize("shape, options, positions", MASKED, ids=str)
def test_leaf_mask(shape, options, positions):
    """Masked leaves count 0 everywhere (a node without valid leaves is no key, its share of
    its parent's energy is 0, a family without keys has no mass), their outputs are 0 and
    their rows get no gradient, as in the recorded op; masked rows that are not zero."""
    qkv = inputs(shape, heads=2)
    eps = embeddings(shape, 1) if positions else []
    mask = leaf_mask(shape, seed=sum(shape))
    if positions:  # a float mask, every other entry of a longer one: read densely all the same
        mask = torch.stack([mask, ~mask], 1).flatten().double()[::2]
        assert not mask.is_contiguous()

    def ours(t, grad=True):
        return kernels(t[:3], shape, t[3:], leaf_mask=mask, grad=grad, **options)

    reference = recorded(shape, mask, **options)
    out, grads = outputs_and_gradients(ours, qkv + eps)
    want, want_grads = outputs_and_gradients(lambda t: reference(*t[:3], t[3:]), qkv + eps)
    assert out.isfinite().all() and out[mask == 0].eq(0).all()
    assert_close((out, *grads), (want, *want_grads), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(ours(qkv + eps, grad=False), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["heads-first", "strided"])
def test_reads_and_writes_the_inputs_layouts(layout):
    """Rows where they lie, 20 and 17 channels (two chunks of 16, the second partial): the
    output in ``q``'s memory order, each gradient in its input's."""
    shape, options = (2, 3, 4), OPTIONS[0]
    qkv = inputs(shape, layout, heads=3, d=20, d_v=17)
    out, grads = outputs_and_gradients(lambda t: kernels(t, shape, **options), qkv)
    want, want_grads = outputs_and_gradients(lambda t: recorded(shape, **options)(*t), qkv)
    assert_close((out, *grads), (want, *want_grads), rtol=1e-12, atol=1e-12)
    heads_first = layout == "heads-first"
    assert (out.stride(0) < out.stride(1)) == heads_first
    for grad, t in zip(grads, qkv, strict=True):
        assert (grad.stride(0) < grad.stride(1)) == (t.stride(0) < t.stride(1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_computes_in_float32(dtype):
    """Half rows are computed in float32 and rounded once: the result of the float32 op on
    the same rounded inputs, rounded."""
    shape, options = (2, 4, 4), OPTIONS[0]
    qkv = inputs(shape, d=8, d_v=8, dtype=dtype)
    out, grads = outputs_and_gradients(lambda t: kernels(t, shape, **options), qkv)
    wide = [t.detach().float().requires_grad_() for t in qkv]
    want, want_grads = outputs_and_gradients(lambda t: recorded(shape, **options)(*t), wide)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    tolerance = dict(rtol=1e-2, atol=1e-2)
    assert_close((out, *grads), (want.to(dtype), *(g.to(dtype) for g in want_grads)), **tolerance)


def test_without_gradients_records_nothing():
    shape, options = (2, 2, 3), OPTIONS[1]
    qkv = inputs(shape)
    with torch.no_grad():
        out = kernels(qkv, shape, grad=False, **options)
        want = recorded(shape, **options)(*qkv)
    assert out.grad_fn is None
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_second_derivatives_differentiate_the_recorded_op():
    shape, options = (2, 2, 3), OPTIONS[0]
    qkv = inputs(shape)

    def grad_norm(op):
        out = op(qkv)
        grads = torch.autograd.grad(out.pow(2).sum(), qkv, create_graph=True)
        total = sum(g.pow(2).sum() for g in grads)
        return torch.autograd.grad(total, qkv)

    got = grad_norm(lambda t: kernels(t, shape, **options))
    want = grad_norm(lambda t: recorded(shape, **options)(*t))
    assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.fixture
def kernels_on(monkeypatch):
    monkeypatch.setattr(triton_uniform, "_enabled", True)
    monkeypatch.setattr(triton_uniform, "interpreting", lambda: True)


def against_the_default_path(run, qkv, calls):
    """``run(qkv)`` with the kernels on (one call of them) and off (none): outputs and
    gradients agree."""
    out = run(qkv)
    assert len(calls) == 1
    grads = torch.autograd.grad(out.sum(), qkv)
    with triton_uniform.turned_on(False):
        want = run(qkv)
    assert len(calls) == 1
    assert_close((out, *grads), (want, *torch.autograd.grad(want.sum(), qkv)))


@pytest.mark.parametrize("positions", [False, True], ids=["plain", "pos_emb"])
def test_hierarchical_attention_runs_the_kernels_when_turned_on(kernels_on, monkeypatch, positions):
    calls = spy_calls(monkeypatch, triton_uniform, "triton_uniform_attention")
    hierarchy = window_forest([12, 12], branching=(4, 3)).to(DEVICE)  # fanout (3, 4) per root
    qkv = inputs((2, 3, 4), heads=2)
    if positions:  # every node's embedding, shared by the heads
        gen = torch.Generator().manual_seed(3)
        pos = torch.randn(hierarchy.num_nodes, 3, generator=gen, dtype=torch.float64).to(DEVICE)
        qkv.append(pos.requires_grad_())
    options = dict(include_self=True)

    def run(t):
        return hierarchical_attention(
            *t[:3], hierarchy, pos_emb=t[3] if positions else None, **options
        )

    against_the_default_path(run, qkv, calls)


@pytest.mark.parametrize("masked", [False, True], ids=["lengths", "lengths+leaf_mask"])
def test_padded_forest_runs_the_kernels(kernels_on, monkeypatch, masked):
    """Sequences of different lengths, run on their equal-fanout embedding (padding slots
    are masked leaves), with a leaf mask of their own or none."""
    calls = spy_calls(monkeypatch, triton_uniform, "triton_uniform_attention")
    index = window_forest([12, 9, 7], branching=(4, 3)).tree_index().to(DEVICE)
    assert index.padded is not None
    qkv = inputs((28,), heads=2)
    mask = (torch.rand(28, generator=torch.Generator().manual_seed(5)) < 0.6).to(DEVICE)
    mask = mask if masked else None
    options = dict(include_self=True, left_only=False, tau=TAU, size_bias=True)

    def run(t):
        return padded_hierarchical_attention(
            *t, index, index.padded, None, leaf_mask=mask, **options
        )

    against_the_default_path(run, qkv, calls)


def failing_launch(error: Exception):
    """A stand-in for a kernel whose every launch raises ``error``."""

    class Failing:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                raise error

            return launch

    return Failing()


def build_error(kind: str) -> Exception:
    """The error of a kernel Triton cannot build: out of shared memory, or the plain
    ``RuntimeError`` its compiler raises when an MLIR pass fails."""
    import triton

    if kind == "out-of-resources":
        return triton.OutOfResources(300_000, 232_448, "shared memory")
    return RuntimeError("PassManager::run failed")


@pytest.mark.parametrize("kind", ["out-of-resources", "mlir-pass"])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_kernel_triton_cannot_build_turns_them_off(kernels_on, monkeypatch, where, kind):
    """A kernel Triton cannot build for the device warns, turns the kernels off, and the
    default path runs; in the backward, the recorded op's gradients."""
    from hiergraph.ops.hsa import triton_kernels

    broken = "up_kernel" if where == "forward" else "grad_down_kernel"
    monkeypatch.setattr(triton_kernels, broken, failing_launch(build_error(kind)))
    hierarchy = window_forest([12, 12], branching=(4, 3)).to(DEVICE)
    qkv = inputs((2, 3, 4), heads=2)
    with pytest.warns(RuntimeWarning, match="could not build the HSA kernels"):
        out = hierarchical_attention(*qkv, hierarchy, include_self=True)
        grads = torch.autograd.grad(out.sum(), qkv)
    assert not any(g.requires_grad for g in grads)  # no graph of the fallback kept
    assert not triton_uniform.enabled()
    assert (type(out.grad_fn).__name__ == "_TritonUniformBackward") == (where == "backward")
    want = hierarchical_attention(*qkv, hierarchy, include_self=True)
    assert_close((out, *grads), (want, *torch.autograd.grad(want.sum(), qkv)))


def test_an_error_other_than_a_build_propagates(kernels_on, monkeypatch):
    """A launch failing for another reason (here a CUDA fault) is not taken for a kernel
    that cannot be built: it propagates, and the kernels stay on."""
    from hiergraph.ops.hsa import triton_kernels

    fault = RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(triton_kernels, "up_kernel", failing_launch(fault))
    hierarchy = window_forest([12, 12], branching=(4, 3)).to(DEVICE)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        hierarchical_attention(*inputs((2, 3, 4), heads=2), hierarchy, include_self=True)
    assert triton_uniform.enabled()


def test_turned_on_as_a_block_and_as_a_decorator():
    seen = []
    inside = triton_uniform.turned_on()(lambda: seen.append(triton_uniform.enabled()))
    with triton_uniform.turned_on(False):
        inside()
        inside()  # the decorated function runs its block every call
        assert not triton_uniform.enabled()
    assert seen == [True, True]


@pytest.mark.parametrize("value, on", [(None, False), ("1", True)])
def test_off_unless_the_environment_turns_it_on(value, on):
    """The module reads its switch at import (the values: ``tests/test_environment.py``)."""
    env = {k: v for k, v in os.environ.items() if k != triton_uniform.ENV} | {"PYTHONPATH": REPO}
    if value is not None:
        env[triton_uniform.ENV] = value
    code = "from hiergraph.ops.hsa import triton_uniform; print(triton_uniform.enabled())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split()[-1] == str(on), done.stderr[-2000:]


@pytest.mark.parametrize("lengths", [[8, 8, 8], [8, 5, 7]], ids=["equal", "lengths"])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "leaf_mask"])
def test_hub_leaves_without_gradients(kernels_on, monkeypatch, lengths, masked):
    """A family above the roots (every tree's top nodes and its hub leaves,
    :func:`~hiergraph.ops.hsa.lifted.lifted_attention`): the kernels pool the roots, the
    family runs between their passes, as on the default path."""
    calls = spy_calls(monkeypatch, triton_uniform, "triton_uniform_attention")
    index = window_forest(lengths, (2, 4)).tree_index().to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (t.detach() for t in inputs((sum(lengths),), heads=2))
    lifted = (torch.rand(sum(lengths), generator=gen) < 0.3).to(DEVICE)
    mask = None
    if masked:  # the second tree without valid leaves
        mask = torch.rand(sum(lengths), generator=gen) < 0.8
        mask[lengths[0] : lengths[0] + lengths[1]] = False
        mask = mask.to(DEVICE)
        lifted &= mask
    options = dict(pos_emb=None, include_self=True, leaf_mask=mask)
    out = lifted_attention(q, k, v, index, lifted, 8, **options)
    assert len(calls) == 1 and calls[0]["above"] is not None
    with triton_uniform.turned_on(False):
        want = lifted_attention(q, k, v, index, lifted, 8, **options)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_refuses_what_it_does_not_cover(kernels_on):
    q, k, v = inputs((1, 2, 2))
    fanout = (2, 2)
    assert triton_uniform.applies(q, k, v, fanout, None, None)
    assert triton_uniform.applies(q, k, v, fanout, embeddings((1, 2, 2), 2), None)
    assert triton_uniform.applies(q, k, v, fanout, None, torch.ones(4, device=DEVICE))
    zeros = functools.partial(torch.zeros, device=DEVICE)
    short_mask = torch.ones(3, device=DEVICE)  # a leaf mask of another length
    refused = [
        (q, k, v, fanout, [zeros(3, 2, 3), zeros(3, 4, 3)], None),  # 3 heads
        (q, k, v, fanout, [zeros(1, 3, 2).mT, zeros(1, 4, 3)], None),  # strided channels
        (q, k, v, fanout, [zeros(1, 2, 3), zeros(1, 5, 3)], None),  # a level's rows: 4
        (q, k, v, fanout, [zeros(1, 2, 3)], None),  # one level of two
        (q, k, v, fanout, None, short_mask),
        (q, k, v.float(), fanout, None, None),  # mixed dtypes
        (q, k, v.transpose(1, 2), fanout, None, None),  # strided channels
        (q, k, v, (2, triton_uniform.MAX_FANOUT + 1), None, None),  # too wide
        (q[:0], k[:0], v[:0], fanout, None, None),  # no leaves
    ]
    many = [t[:, :1].expand(-1, triton_uniform.MAX_HEADS + 1, -1) for t in (q, k, v)]
    refused.append((*many, fanout, None, None))  # more heads than a grid dimension holds
    for args in refused:
        assert not triton_uniform.applies(*args)
    assert triton_uniform.set_enabled(False) is True
    assert not triton_uniform.applies(q, k, v, fanout, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_the_default_path(dtype):
    """Compiled by Triton: a batch of window trees of 512 leaves, 8 heads of 64 channels, as
    the default CUDA path computes it."""
    shape, options = (4, 16, 8, 4), OPTIONS[0]
    qkv = inputs(shape, heads=8, d=64, d_v=64, dtype=dtype, device="cuda")

    def default_path(t):
        return uniform_hierarchical_attention(
            *t, shape, None, left_only=False, leaf_mask=None, tau=TAU, **options
        )

    with triton_uniform.turned_on():
        out, grads = outputs_and_gradients(default_path, qkv)
    assert type(out.grad_fn).__name__ == "_TritonUniformBackward"
    want, want_grads = outputs_and_gradients(default_path, qkv)
    assert type(want.grad_fn).__name__ != "_TritonUniformBackward"
    # both compute in float32; bf16 outputs and gradients are rounded once (a unit in the
    # last place apart at most where the sums' order differs)
    tolerance = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-3)
    assert_close((out, *grads), (want, *want_grads), **tolerance)


COMPILE = """
import itertools, os, re, subprocess, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hiergraph.ops.hsa import triton_kernels as K
from hiergraph.ops.hsa.triton_uniform import _grid

LEAF_ROWS = {"q_ptr", "k_ptr", "v_ptr", "g_ptr", "out_ptr", "dq_ptr", "dk_ptr", "dv_ptr"}
bin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
names = [n for n in ("ptxas-blackwell", "ptxas") if os.path.exists(os.path.join(bin, n))]
ptxas = os.path.join(bin, names[0]) if names else None
compiled, spills = 0, []
for fn, (leaves, top, b), on in itertools.product(
    [K.up_kernel, K.down_kernel, K.grad_up_kernel, K.grad_down_kernel],
    [(True, False, 4), (False, True, 16), (False, False, 32)],
    [True, False],  # self energies, size bias, position embeddings, a leaf mask: all or none
):
    _, meta = _grid(64 * b, b, 8, 64)  # 8 heads of 64 channels
    meta = dict(meta)
    warps = meta.pop("num_warps")
    flags = dict(meta, LEAVES=leaves, GATE=on or not leaves, OWN=on and leaves,
                 TOP=top, PARENT=not top, SIZE_BIAS=on, EPS=on, MASK=on, ZERO=on and leaves)
    flags = {name: value for name, value in flags.items() if name in fn.arg_names}
    signature = {
        name: "constexpr" if name in flags
        else ("*bf16" if leaves and name in LEAF_ROWS else "*fp32") if name.endswith("_ptr")
        else "i32"
        for name in fn.arg_names
    }
    source = ASTSource(fn, signature, constexprs=flags)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    compiled += 1
    if ptxas:  # the register report of the kernel's PTX
        with open("kernel.ptx", "w") as f:
            f.write(kernel.asm["ptx"])
        command = [ptxas, "-v", "--gpu-name", "sm_90a", "kernel.ptx", "-o", "kernel.o"]
        report = subprocess.run(command, capture_output=True, text=True).stderr
        spilled = re.findall("([0-9]+) bytes spill stores", report)
        if not spilled or int(spilled[0]):
            spills.append((fn.__name__, b, report[-300:]))
print(compiled, "spills:", spills if ptxas else "no ptxas")
"""


def test_kernels_compile_for_a_gpu(tmp_path):
    """Triton's compiler (front end, LLVM, ``ptxas``) builds every kernel for an H100 (sm_90)
    with bfloat16 leaves, at the leaves, the roots and a level between (families of 4, 16
    and 32, with the block sizes a batch of 8 heads of 64 channels gets), with every option
    or none, without a GPU: what the interpreter cannot check (constexpr branches, types,
    layouts). None spills registers (``ptxas -v``, where Triton ships it)."""
    pytest.importorskip("triton.backends.nvidia")
    # the caller's PYTHONPATH after the repository's: a Triton put first on it is the one tested
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:3] in (["24", "spills:", "[]"], ["24", "spills:", "no"])


def test_the_logit_scale_is_made_on_the_device_without_a_host_copy():
    """A copy from host memory cannot be captured in a CUDA graph (the first call may come
    inside one): the scale is filled on the device."""
    triton_uniform._tau.cache_clear()
    with DispatchedOps() as ops:
        tau = triton_uniform._tau(0.25, torch.float64, torch.device("cpu"))
    assert [name for name, _ in ops.calls] == ["full"]
    assert tau.dtype == torch.float64 and tau.tolist() == [0.25]
