import importlib
import math
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal import _gathered_attention
from hiergraph.ops.hsa.uniform import uniform_hierarchical_attention
from tests.conftest import assert_same_nans, qkv_rows, spy_calls, with_nan

F64 = dict(dtype=torch.float64)

# (trees, fanout top-down): families of two, three, four, five; a deep tree; families of 8
# and 16 (whose logits the kernel takes 8 or 16 at a time with 16 or 64 channels)
SHAPES = [(3, (2, 3)), (2, (3, 2)), (1, (2, 4, 8)), (2, (4, 4, 4)), (4, (5,)), (2, (8, 16))]
OPTIONS = [
    dict(include_self=True, size_bias=True),
    dict(include_self=False, size_bias=True),
    dict(include_self=True, size_bias=False),
    dict(include_self=False, size_bias=False),
]
LAYOUTS = ["node-major", "heads-first", "strided"]

needs_kernel = pytest.mark.skipif(
    shutil.which("c++") is None, reason="no C++ compiler to build the kernel"
)
pytestmark = needs_kernel


def inputs(shape, layout, heads=3, d=4, d_v=5, dtype=torch.float64, seed=0):
    """``q, k, v`` of the leaves of ``shape`` (:func:`~tests.conftest.qkv_rows`)."""
    return qkv_rows(math.prod(shape), layout, heads, d, d_v, dtype, seed)


def position(shape, heads, dtype=torch.float64, seed=1, strided=False):
    """Position embeddings per level below the roots, ``[heads, n_d, 3]`` (``strided``:
    the first channels of wider rows), requiring gradients."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [math.prod(shape[: i + 1]) for i in range(1, len(shape))]
    eps = [torch.randn(heads, n, 5 if strided else 3, generator=gen, dtype=dtype) for n in sizes]
    return [(e[..., :3] if strided else e).requires_grad_() for e in eps]


def run(qkv, shape, fuse=True, eps=None, **options):
    return uniform_hierarchical_attention(
        *qkv, shape, eps, left_only=False, leaf_mask=None, tau=0.7, fuse=fuse, **options
    )


def ran_natively(out) -> bool:
    return type(out.grad_fn).__name__ == "_NativeUniformBackward"


def test_builds_here():
    """Where a compiler is, the kernel builds (a failed build would only show as slower
    HSA)."""
    assert native.extension() is not None


def test_each_install_builds_its_own_extension_and_says_so_once(monkeypatch, tmp_path, capsys):
    """Two installs (source folders) sharing PyTorch's extension cache get two names: with
    one name, each would rebuild the other's build. The first build says it compiles; a
    cached one is silent."""
    from torch.utils import cpp_extension

    name = native.build_flags()[0]
    monkeypatch.setattr(native, "SOURCES", [tmp_path / "csrc" / "uniform.cpp"])
    other = native.build_flags()[0]
    assert name != other and name.rsplit("_", 1)[0] == other.rsplit("_", 1)[0]
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda *_, **__: str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda *_, **__: "module")
    assert native.build() == "module"
    assert "compiling its HSA kernels" in capsys.readouterr().err
    (tmp_path / f"{other}.so").touch()
    native.build()
    assert capsys.readouterr().err == ""


def test_a_rebuild_after_the_sources_changed_says_so(monkeypatch, tmp_path, capsys):
    """A library built from older sources (an update, a ``git pull``) is rebuilt by ninja
    for about a minute: that rebuild is announced like the first build; one built after the
    sources stays silent."""
    import os

    from torch.utils import cpp_extension

    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for source in ("uniform.cpp", "vector_ops.h"):
        (csrc / source).touch()
    monkeypatch.setattr(native, "SOURCES", [csrc / "uniform.cpp"])
    built = tmp_path / "build"
    built.mkdir()
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda *_, **__: str(built))
    monkeypatch.setattr(cpp_extension, "load", lambda *_, **__: "module")
    library = built / f"{native.build_flags()[0]}.so"
    library.touch()
    now = (csrc / "uniform.cpp").stat().st_mtime
    os.utime(library, (now - 60, now - 60))
    os.utime(csrc / "uniform.cpp", (now - 120, now - 120))  # only the header is newer
    native.build()
    assert "compiling its HSA kernels" in capsys.readouterr().err
    os.utime(library, (now + 60, now + 60))
    native.build()
    assert capsys.readouterr().err == ""


def test_state_says_what_the_kernel_is_without_building_it(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda *_, **__: str(tmp_path))
    monkeypatch.setattr(native, "build", lambda: pytest.fail("state() built the kernel"))
    assert native.state() == "not built"
    (tmp_path / f"{native.build_flags()[0]}.so").touch()  # newer than the sources
    assert native.state() == "built"
    native._loaded["module"] = None
    assert native.state() == "failed"
    native._loaded["module"] = native
    assert native.state() == "loaded"
    monkeypatch.setattr(native, "_enabled", False)
    assert native.state() == "off"


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("eps_heads", [None, 1, 3], ids=["no-eps", "eps-1-head", "eps-per-head"])
def test_equals_the_recorded_op_with_gradients(trees, fanout, options, layout, eps_heads):
    shape = (trees, *fanout)
    channels = dict(d=16, d_v=64) if max(fanout) >= 8 else {}
    qkv = inputs(shape, layout, **channels)
    eps = None if eps_heads is None else position(shape, eps_heads, strided=layout == "strided")
    out = run(qkv, shape, eps=eps, **options)
    ref = run(qkv, shape, fuse=False, eps=eps, **options)
    assert ran_natively(out)
    assert out.stride() == torch.empty_like(qkv[2]).stride()  # v's layout
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(ref)
    leaves = qkv + (eps or [])
    got = torch.autograd.grad((out * upstream).sum(), leaves)
    want = torch.autograd.grad((ref * upstream).sum(), leaves)
    for g, w, t in zip(got, want, leaves, strict=True):
        assert g.stride() == t.stride() or layout == "strided"  # the input's layout
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("layout", ["node-major", "heads-first", "strided", "strided-heads-first"])
def test_outputs_and_gradients_take_the_inputs_layouts(layout, heads):
    """The output and the gradients of q, k, v have the memory layout ``torch.empty_like``
    gives their input (the kernel allocates them itself): its strides where it is dense, else
    dense strides in the same order (the first channels of wider heads-first rows give
    heads-first gradients)."""
    shape, gen = (2, 3, 4), torch.Generator().manual_seed(0)
    leaves, wide = math.prod(shape), layout.startswith("strided")
    qkv = []
    for c in (4, 4, 5):
        width = c + 2 if wide else c  # the first channels of wider rows
        if layout.endswith("heads-first"):
            rows = torch.randn(heads, leaves, width, generator=gen, dtype=torch.float64)
            rows = rows.transpose(0, 1)
        else:
            rows = torch.randn(leaves, heads, width, generator=gen, dtype=torch.float64)
        qkv.append(rows[..., :c].requires_grad_())
    out = run(qkv, shape, include_self=True, size_bias=True)
    assert ran_natively(out)
    assert out.stride() == torch.empty_like(qkv[2]).stride()
    got = torch.autograd.grad(out.square().sum(), qkv)
    ref = run(qkv, shape, fuse=False, include_self=True, size_bias=True)
    want = torch.autograd.grad(ref.square().sum(), qkv)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for g, w, t in zip(got, want, qkv, strict=True):
        assert g.stride() == torch.empty_like(t).stride()
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_kernel_sources_include_no_header_of_every_operator():
    """The kernels' sources include PyTorch's lighter headers (``csrc/tensors.h``): the
    headers that declare every operator took most of the build, which runs on a user's
    machine on first use."""
    heavy = ("ATen/ATen.h", "torch/extension.h", "torch/torch.h", "torch/all.h", "ATen/Functions.h")
    for path in native.SOURCES[0].parent.iterdir():
        text = path.read_text()
        assert not [h for h in heavy if f"#include <{h}>" in text], path.name


@pytest.mark.parametrize("include_self", [True, False])
def test_a_nan_query_reaches_the_outputs_the_recorded_op_gives_it(include_self):
    """A NaN in one leaf's query makes NaN the outputs it makes NaN in the recorded op (its
    ancestors' pooled queries are NaN, so are their logits); the kernel once took a row of
    NaN logits for a row without keys and returned zeros there."""
    shape = (2, 4, 4)
    q, k, v = inputs(shape, "node-major")
    qkv = (with_nan(q, 5), k, v)
    out = run(qkv, shape, include_self=include_self, size_bias=True)
    ref = run(qkv, shape, fuse=False, include_self=include_self, size_bias=True)
    assert ran_natively(out)
    assert_same_nans(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("eps_heads", [None, 1], ids=["no-eps", "eps"])
def test_equals_the_recorded_op_without_gradients(trees, fanout, include_self, eps_heads):
    shape = (trees, *fanout)
    qkv = [t.detach() for t in inputs(shape, "node-major", d=8, d_v=8)]
    eps = None if eps_heads is None else [e.detach() for e in position(shape, eps_heads)]
    with torch.no_grad():
        out = run(qkv, shape, eps=eps, include_self=include_self, size_bias=True)
    ref = run(qkv, shape, fuse=False, eps=eps, include_self=include_self, size_bias=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The keyword arguments of every call of the kernel's entry point."""
    return spy_calls(monkeypatch, native, "native_uniform_attention")


def leaf_mask(leaves: int, kind: str) -> torch.Tensor:
    """Valid leaves: about half, a sparse few (whole subtrees and trees without any), or
    the first leaf alone."""
    gen = torch.Generator().manual_seed(leaves)
    if kind == "first":
        return torch.arange(leaves) == 0
    return torch.rand(leaves, generator=gen) < (0.5 if kind == "half" else 0.15)


def above_roots(energy, pooled):
    """A stand-in for a family above the roots: a log mass and an output per root made of
    every statistic it is handed."""
    q, k, v = pooled
    log_mass = -torch.nn.functional.softplus(0.3 - energy)
    return log_mass, 0.5 * v + 0.1 * q.sum(-1, keepdim=True) + k[..., :1]


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("kind", ["half", "sparse", "first"])
@pytest.mark.parametrize("padding", [False, True], ids=["rows", "padding"])
@pytest.mark.parametrize("above", [None, above_roots], ids=["roots", "above"])
def test_masked_leaves_and_a_family_above_without_gradients(
    trees, fanout, options, kind, padding, above, kernel_calls
):
    """Inference under a leaf mask (padding: the masked rows are zero and their outputs
    unread; else they are any rows and their outputs 0), with or without a family above
    the roots, equals the recorded op; position embeddings on the deep shapes."""
    shape = (trees, *fanout)
    qkv = [t.detach() for t in inputs(shape, "heads-first", d=8, d_v=8)]
    mask = leaf_mask(math.prod(shape), kind)
    if padding:
        qkv = [t * mask[:, None, None] for t in qkv]
    eps = [e.detach() for e in position(shape, 3)] if len(fanout) > 1 else None
    call = dict(left_only=False, leaf_mask=mask, tau=0.7, padding=padding, above=above)
    with torch.no_grad():
        out = uniform_hierarchical_attention(*qkv, shape, eps, **call, **options)
        ref = uniform_hierarchical_attention(*qkv, shape, eps, fuse=False, **call, **options)
    assert len(kernel_calls) == 1
    rows = mask if padding else slice(None)
    torch.testing.assert_close(out[rows], ref[rows], rtol=0, atol=1e-12)
    assert not out[~mask].any() or padding


@pytest.mark.parametrize("trees, fanout", SHAPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(k for k, v in o.items() if v))
@pytest.mark.parametrize("kind", ["half", "sparse", "first"])
@pytest.mark.parametrize("padding", [False, True], ids=["rows", "padding"])
def test_masked_leaves_with_gradients(trees, fanout, options, kind, padding):
    """Under a leaf mask the output and the gradients of q, k, v and the position embeddings
    equal the recorded op's (padding: the masked rows are zero, and their outputs, which
    nobody reads, get no gradient); the masked leaves' rows get 0, as a mask means (the
    recorded op's padding rows get those of its plain sums)."""
    shape = (trees, *fanout)
    mask = leaf_mask(math.prod(shape), kind)
    qkv = [t.detach() for t in inputs(shape, "strided", d=8, d_v=8)]
    if padding:
        qkv = [t * mask[:, None, None] for t in qkv]
    qkv = [t.requires_grad_() for t in qkv]
    eps = position(shape, 3) if len(fanout) > 1 else []
    call = dict(left_only=False, leaf_mask=mask, tau=0.7, padding=padding)
    out = uniform_hierarchical_attention(*qkv, shape, eps or None, **call, **options)
    ref = uniform_hierarchical_attention(*qkv, shape, eps or None, fuse=False, **call, **options)
    assert ran_natively(out)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), **F64)
    if padding:
        upstream = upstream * mask[:, None, None]
    got = torch.autograd.grad(out, [*qkv, *eps], upstream)
    want = torch.autograd.grad(ref, [*qkv, *eps], upstream)
    torch.testing.assert_close(out[mask], ref[mask], rtol=0, atol=1e-12)
    # (padding rows enter the recorded op's plain sums, so it gives them gradients)
    rows = mask if padding else slice(None)
    for g, w in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(g[rows], w[rows], rtol=0, atol=1e-12)
    for g, w in zip(got[3:], want[3:], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    assert all(not g[~mask].any() for g in got[:3])


def test_masked_second_derivatives():
    shape = (2, 2, 3)
    mask = torch.tensor([True, False, True, True, False, False] * 2)
    qkv = inputs(shape, "node-major", heads=2, d=2, d_v=2)
    eps = position(shape, 1)

    def op(q, k, v, *eps):
        return uniform_hierarchical_attention(
            q, k, v, shape, list(eps), left_only=False, leaf_mask=mask, tau=0.7,
            include_self=True, size_bias=True,
        )  # fmt: skip

    assert ran_natively(op(*qkv, *eps))
    assert torch.autograd.gradgradcheck(op, (*qkv, *eps), fast_mode=True)


def test_a_masked_forest_in_float32(kernel_calls):
    shape = (6, 4, 16)
    qkv = inputs(shape, "node-major", heads=4, d=32, d_v=32, dtype=torch.float32)
    qkv = [t.detach() for t in qkv]
    mask = leaf_mask(math.prod(shape), "half")
    call = dict(left_only=False, leaf_mask=mask, tau=0.2, include_self=True, size_bias=True)
    with torch.no_grad():
        out = uniform_hierarchical_attention(*qkv, shape, None, **call)
        ref = uniform_hierarchical_attention(*(t.double() for t in qkv), shape, None, **call)
    assert len(kernel_calls) == 2
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


def test_float32():
    shape = (4, 4, 16)
    qkv = inputs(shape, "node-major", heads=4, d=64, d_v=64, dtype=torch.float32)
    out = run(qkv, shape, include_self=True, size_bias=True)
    assert ran_natively(out)
    ref = run([t.double() for t in qkv], shape, fuse=False, include_self=True, size_bias=True)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(out.square().sum(), qkv)
    want = torch.autograd.grad(ref.square().sum(), qkv)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w.float(), rtol=1e-4, atol=1e-4)


def test_output_gradients_of_any_layout():
    """A broadcast output gradient (as ``out.sum()`` sends) and one with strided channels."""
    shape = (2, 3, 4)
    qkv = inputs(shape, "node-major")
    out = run(qkv, shape, include_self=True, size_bias=True)
    ref = run(qkv, shape, fuse=False, include_self=True, size_bias=True)
    for upstream in (torch.ones((), **F64).expand_as(out), torch.randn(24, 3, 10, **F64)[..., ::2]):
        got = torch.autograd.grad(out, qkv, upstream, retain_graph=True)
        want = torch.autograd.grad(ref, qkv, upstream, retain_graph=True)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_backward_twice_with_a_retained_graph():
    shape = (2, 3, 4)
    qkv = inputs(shape, "node-major")
    out = run(qkv, shape, include_self=True, size_bias=True)
    first = torch.autograd.grad(out.square().sum(), qkv, retain_graph=True)
    second = torch.autograd.grad(out.square().sum(), qkv)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["node-major", "heads-first"])
def test_second_derivatives(layout):
    """create_graph=True differentiates the recorded op."""
    shape = (2, 2, 3)
    qkv = inputs(shape, layout, heads=2, d=2, d_v=2)
    eps = position(shape, 1)
    assert ran_natively(run(qkv, shape, eps=eps, include_self=True, size_bias=True))

    def op(q, k, v, *eps):
        return run([q, k, v], shape, eps=list(eps), include_self=True, size_bias=True)

    assert torch.autograd.gradgradcheck(op, (*qkv, *eps), fast_mode=True)


@pytest.mark.parametrize(
    "case",
    [
        "native",
        "position",
        "off",
        "bfloat16",
        "leaf-mask",
        "eps-dtype",
        "fanout-1",
        "threads",
        "large-trees",
        "wide-families",
    ],
)
def test_where_the_kernel_runs(case, monkeypatch):
    shape = (2, 3, 4)
    qkv = inputs(shape, "node-major", heads=2)
    options = dict(left_only=False, leaf_mask=None, tau=0.7, include_self=True, size_bias=True)
    eps = None
    if case == "off":
        monkeypatch.setattr(native, "_enabled", False)
    if case == "bfloat16":
        qkv = [t.detach().bfloat16().requires_grad_() for t in qkv]
    if case == "leaf-mask":
        options["leaf_mask"] = torch.arange(24) % 5 != 0
    if case in ("position", "eps-dtype"):
        eps = [torch.randn(1, 6, 2, **F64), torch.randn(1, 24, 2, **F64)]
        eps = [e.float() for e in eps] if case == "eps-dtype" else eps
    if case == "fanout-1":
        shape = (2, 3, 1, 4)
    if case == "threads":  # 2 trees x 2 heads: fewer tasks than threads
        monkeypatch.setattr(torch, "get_num_threads", lambda: 5)
    if case == "large-trees":
        monkeypatch.setattr(native, "MAX_TREE_LEAVES", 11)
    if case == "wide-families":  # families of 4: as wide as the limit
        monkeypatch.setattr(native, "WIDE_FANOUT", 4)
    out = uniform_hierarchical_attention(*qkv, shape, eps, **options)
    assert ran_natively(out) == (case in ("native", "position", "leaf-mask"))


@pytest.mark.parametrize("limit", ["MAX_TREE_LEAVES", "WIDE_FANOUT"])
def test_inference_runs_trees_of_any_size(limit, kernel_calls, monkeypatch):
    """Without a gradient the kernel runs large trees and wide families too (it keeps
    nothing for a backward); with one they take the reshaped views."""
    monkeypatch.setattr(native, limit, 4)
    shape = (2, 3, 4)
    qkv = inputs(shape, "node-major")
    with torch.no_grad():
        run(qkv, shape, include_self=True, size_bias=True)
    run(qkv, shape, include_self=True, size_bias=True)
    assert [call["recorded"] is None for call in kernel_calls] == [True]


def test_a_failed_build_warns_once_and_falls_back(monkeypatch):
    def fail():
        raise OSError("no compiler here")

    monkeypatch.setattr(native, "build", fail)
    monkeypatch.setattr(native, "_loaded", {})
    shape = (2, 3, 4)
    qkv = inputs(shape, "node-major")
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        out = run(qkv, shape, include_self=True, size_bias=True)
    assert not ran_natively(out)
    ref = run(qkv, shape, fuse=False, include_self=True, size_bias=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(qkv, shape, include_self=True, size_bias=True)  # no second warning


def test_environment_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    try:
        assert not importlib.reload(native).enabled()
        assert native.extension() is None
    finally:
        monkeypatch.delenv(native.ENV)
        importlib.reload(native)
    assert native.enabled()


def test_set_enabled_returns_the_previous_setting():
    assert native.set_enabled(False) is True
    try:
        assert not native.enabled()
    finally:
        assert native.set_enabled(True) is False


def test_the_kernel_checks_its_inputs():
    ext = native.extension()
    q = torch.randn(12, 2, 4, **F64)
    with pytest.raises(RuntimeError, match="whole number of trees"):
        ext.forward(q, q, q, [], [5], 0.5, True, True, False, None)
    with pytest.raises(RuntimeError, match="at least 2"):
        ext.forward(q, q, q, [], [1, 3], 0.5, True, True, False, None)
    with pytest.raises(RuntimeError, match="unit channel stride"):
        ext.forward(q.mT.contiguous().mT, q, q, [], [3], 0.5, True, True, False, None)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.forward(q, q.float(), q, [], [3], 0.5, True, True, False, None)
    with pytest.raises(RuntimeError, match="levels and heads"):
        ext.forward(q, q, q, [torch.randn(1, 5, 2, **F64)], [3], 0.5, True, True, False, None)
    with pytest.raises(RuntimeError, match="one tensor per level"):
        ext.forward(q, q, q, [torch.randn(1, 12, 2, **F64)] * 2, [3], 0.5, True, True, False, None)
    out, saved = ext.forward(q, q, q, [], [3], 0.5, True, True, True, None)
    with pytest.raises(RuntimeError, match="saved"):
        ext.backward(out, q, q, q, [], saved[1:], [3], 0.5, True, True, None)
    mask = torch.ones(12, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="one value per leaf"):
        ext.backward(out, q, q, q, [], saved, [3], 0.5, True, True, mask[1:])
    with pytest.raises(RuntimeError, match="one value per leaf"):
        ext.forward(q, q, q, [], [3], 0.5, True, True, False, mask[1:])
    saved, energy, *pooled = ext.up(q, q, q, [], [3], 0.5, True, True, mask)
    assert energy.shape == (2, 4) and [t.shape for t in pooled] == [(2, 4, 4)] * 3
    with pytest.raises(RuntimeError, match="up pass"):
        ext.down(q, q, q, [], saved[1:], energy, pooled[2], [3], 0.5, True, True, mask)
    with pytest.raises(RuntimeError, match="u must be"):
        ext.down(q, q, q, [], saved, energy.T, pooled[2], [3], 0.5, True, True, mask)
    with pytest.raises(ValueError, match="without a family above"):
        native.native_uniform_attention(
            q, q, q, (3,), None, include_self=True, tau=0.5, size_bias=True,
            recorded=lambda *args: None, above=lambda *args: None,
        )  # fmt: skip


def edge_case(with_eps: bool, dtype=torch.float64, pairs=40, nodes=15, seed=0):
    """Arguments of :func:`~hiergraph.ops.hsa.native.edge_softmax` (``q, k, v`` and the
    embeddings requiring gradients): 0 to 4 edges per query (every fourth query none), keys
    drawn from all nodes but the last two (which get no edge), and the op on tensor
    operations (``recorded``)."""
    gen = torch.Generator().manual_seed(seed)
    heads, d, dv, c, tau = 3, 4, 5, 2, 0.7
    counts = torch.randint(0, 5, (pairs,), generator=gen)
    counts[::4] = 0
    key_pair = torch.arange(pairs).repeat_interleave(counts)
    key_node = torch.randint(0, nodes - 2, (key_pair.numel(),), generator=gen)
    pair_node = torch.randint(0, nodes, (pairs,), generator=gen)
    log_n = torch.rand(nodes, generator=gen, dtype=dtype) * 2

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()

    q, k, v = rand(pairs, heads, d), rand(nodes, heads, d), rand(nodes, heads, dv)
    eps = rand(nodes, heads, c) if with_eps else None

    def recorded(q, k, v, e):
        return _gathered_attention(q, key_pair, key_node, pair_node, k, v, log_n[:, None], e, tau)

    args = (q, k, v, log_n, eps, pair_node, key_pair, key_node, tau, recorded)
    return args, recorded


@pytest.mark.parametrize("with_eps", [False, True])
def test_edge_softmax_equals_the_gathered_op(with_eps):
    """The kernel's softmax over lists of keys equals gathers, a scatter softmax and a
    scatter (float64): ``lse`` (``-inf`` without edges), ``theta`` and the gradients of
    ``q, k, v`` and the embeddings (query and key sides)."""
    args, recorded = edge_case(with_eps)
    inputs = [t for t in (args[0], args[1], args[2], args[4]) if t is not None]
    ours, ref = native.edge_softmax(*args), recorded(*args[:3], args[4])
    assert torch.isinf(ours[0]).sum() > 0 and torch.equal(torch.isinf(ours[0]), torch.isinf(ref[0]))
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)
    gen = torch.Generator().manual_seed(1)
    upstream = [torch.randn(t.shape, generator=gen, **F64) for t in ref]
    grads = torch.autograd.grad(ours, inputs, upstream)
    expected = torch.autograd.grad(ref, inputs, upstream)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)
    assert args[1].size(0) - 2 > 0 and grads[1][-2:].abs().max() == 0  # keys without edges


def test_edge_softmax_of_a_nan_query_is_nan():
    """A query with a NaN and edges gets a NaN ``lse`` and ``theta``, as on tensor
    operations; the other queries are unchanged."""
    (q, *rest), recorded = edge_case(False)
    args = (with_nan(q, 1), *rest)
    assert args[6].eq(1).any()  # query 1 has edges
    for ours, ref in zip(native.edge_softmax(*args), recorded(*args[:3], args[4]), strict=True):
        assert_same_nans(ours, ref, atol=1e-13, rtol=0)


def test_edge_softmax_in_float32_and_second_derivatives():
    args, recorded = edge_case(True, dtype=torch.float32, seed=2)
    ours, ref = native.edge_softmax(*args), recorded(*args[:3], args[4])
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    args, _ = edge_case(True, pairs=9, nodes=6, seed=3)
    inputs = (args[0], args[1], args[2], args[4])

    def fn(q, k, v, e):
        return native.edge_softmax(q, k, v, args[3], e, *args[5:])[1]

    assert torch.autograd.gradgradcheck(fn, inputs, fast_mode=True)


def test_edge_softmax_checks_its_inputs():
    ext = native.extension()
    (q, k, v, log_n, eps, pair_node, key_pair, key_node, tau, _), _ = edge_case(True)
    ptr = torch.cat(
        [torch.zeros(1, dtype=torch.long), torch.bincount(key_pair, minlength=40).cumsum(0)]
    )
    q, k, v, eps = (t.detach() for t in (q, k, v, eps))
    with pytest.raises(RuntimeError, match="ptr must be"):
        ext.edge_softmax_forward(q, k, v, log_n, eps, pair_node, ptr[1:], key_node, tau)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ext.edge_softmax_forward(q.half(), k, v, log_n, eps, pair_node, ptr, key_node, tau)
    with pytest.raises(RuntimeError, match="do not match"):
        ext.edge_softmax_forward(q, k, v[:-1], log_n, eps, pair_node, ptr, key_node, tau)
    with pytest.raises(RuntimeError, match="eps must be"):
        ext.edge_softmax_forward(q, k, v, log_n, eps[:-1], pair_node, ptr, key_node, tau)
    with pytest.raises(RuntimeError, match="key_node must hold rows of k"):
        ext.edge_softmax_forward(q, k, v, log_n, eps, pair_node, ptr, key_node + 15, tau)
    with pytest.raises(RuntimeError, match="pair_node must hold rows of k"):
        ext.edge_softmax_forward(q, k, v, log_n, eps, pair_node - 20, ptr, key_node, tau)
    with pytest.raises(RuntimeError, match="ptr must ascend"):
        ext.edge_softmax_forward(q, k, v, log_n, eps, pair_node, ptr.flip(0), key_node, tau)


@pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_builds_for_narrower_vectors(capability):
    """The kernel built for AVX2 (32-byte vectors) and for no vector extension (16 bytes)
    equals the recorded op too, masked leaves included, and so do its softmax over lists of
    keys and its forest and causal kernels (each build compiles for about a minute)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    here = os.path.dirname(__file__)
    forests = [os.path.join(here, f"test_native_{name}.py") for name in ("forest", "causal")]
    args = ["-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", __file__, *forests]
    args += [
        "-k",
        "(recorded_op or masked or edge_softmax or edge_path or edge_lists) and not narrower",
    ]
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
