"""Shared test helpers: random signal hierarchies of mixed depth, offline dataset guards, the
benchmarks' helper modules."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import random
from pathlib import Path

import pytest
import torch

# Where no GPU is present, Triton runs kernels (hiergraph.ops.hsa.triton_kernels) in its
# interpreter: set before Triton is first imported (torch_geometric imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch_geometric.datasets import PPI, Planetoid  # noqa: E402

from hiergraph.datasets import planetoid as hp
from hiergraph.ops.hsa import native
from tests.triton_interpreter import patch_once_per_launch

if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton"):
    patch_once_per_launch()  # halves the time of the kernels' tests in the interpreter

#: where real raw datasets may be, as the session starts (before any test clears the
#: variables): a collection of them (``$HIERGRAPH_RAW``), the data root where a loader
#: linked them (``$HIERGRAPH_DATA``), the collection next to the repository
RAW_ROOTS = [
    os.environ.get(hp.RAW_ENV),
    os.environ.get(hp.DATA_ENV),
    Path(__file__).resolve().parents[2] / "shared" / "datasets",
]


def triton_runs_kernels() -> bool:
    """Whether Triton is installed and runs the HSA kernels here: compiled on a GPU, or in
    its interpreter, which before Triton 3.7 cannot run loops with runtime bounds."""
    if importlib.util.find_spec("triton") is None:
        return False
    if torch.cuda.is_available():
        return True
    import triton

    return tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 7)


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (``benchmarks`` is no package), for a helper
    module that imports no sibling of its folder (``timing``, ``memory``)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def qkv_rows(
    leaves: int, layout="node-major", heads=3, d=4, d_v=5, dtype=torch.float64, seed=0, device="cpu"
) -> list[torch.Tensor]:
    """Random ``q, k, v`` ``[L, H, ·]`` requiring gradients: contiguous (``node-major``),
    views of heads-first memory, or the first channels of wider rows (``strided``: rows
    ``H (c + 3)`` apart)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = []
    for c in (d, d, d_v):
        if layout == "heads-first":
            t = torch.randn(heads, leaves, c, generator=gen, dtype=dtype).transpose(0, 1)
        elif layout == "strided":
            t = torch.randn(leaves, heads, c + 3, generator=gen, dtype=dtype)[..., :c]
        else:
            t = torch.randn(leaves, heads, c, generator=gen, dtype=dtype)
        qkv.append(t.to(device).requires_grad_())
    return qkv


def random_spec(rng: random.Random, num_leaves: int, max_depth: int = 4, max_branch: int = 5):
    """A random nested spec with exactly ``num_leaves`` leaves (ints 0..L-1, shuffled).

    Families have 1..``max_branch`` children, leaves sit at mixed depths, and
    unary (single-child) nodes occur.
    """
    ids = list(range(num_leaves))
    rng.shuffle(ids)

    def build(leaves: list[int], depth: int):
        if len(leaves) == 1 and (depth >= max_depth or rng.random() < 0.7):
            return leaves[0]
        if depth >= max_depth:
            return list(leaves)
        branch = rng.randint(1, min(max_branch, len(leaves)))
        if branch == 1 and rng.random() < 0.5:
            branch = min(2, len(leaves))
        cuts = sorted(rng.sample(range(1, len(leaves)), branch - 1)) if branch > 1 else []
        parts = [leaves[a:b] for a, b in zip([0, *cuts], [*cuts, len(leaves)], strict=True)]
        return [build(p, depth + 1) for p in parts]

    return build(ids, 0)


def leaves_below(h, num_leaves: int) -> list[list[int]]:
    """Per node of ``h``, the leaves ``0 .. num_leaves - 1`` below it (a walk up ``parent``
    from every leaf: an independent reading of the tree for reference checks)."""
    below = [[] for _ in range(h.num_nodes)]
    parent = h.parent.tolist()
    for leaf in range(num_leaves):
        node = leaf
        while True:
            below[node].append(leaf)
            if parent[node] == node:
                break
            node = parent[node]
    return below


def random_qkv(num_leaves: int, heads: int = 2, dim: int = 4, dv: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_leaves, heads, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(num_leaves, heads, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(num_leaves, heads, dv, generator=gen, dtype=torch.float64)
    return q, k, v


#: Backward nodes whose CPU kernel adds gradient rows with unordered atomic adds when
#: the index repeats (``x[index]``: ``index_put(accumulate=True)``; ``x.take``: ``put_``),
#: so that a multi-threaded backward is not bitwise reproducible. ``index_select``'s
#: backward (``index_add_``) adds in index order.
UNORDERED_BACKWARD = ("IndexBackward0", "TakeBackward0")


def unordered_backward_nodes(out: torch.Tensor) -> list[str]:
    """Names of the :data:`UNORDERED_BACKWARD` nodes in ``out``'s autograd graph."""
    found, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() in UNORDERED_BACKWARD:
            found.append(node.name())
        stack.extend(child for child, _ in node.next_functions)
    return found


#: the most worker processes ``-n auto`` starts: each holds its own PyTorch, PyG and test
#: data (up to ~0.9 GB measured), and past a few workers the longest tests set the pace
MAX_WORKERS = 8


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: pytest-xdist's count (one worker per core), at most :data:`MAX_WORKERS`."""
    workers = yield
    return min(workers, MAX_WORKERS)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n`` without ``--dist``: idle workers take tests queued for the busy ones
    (pytest-xdist's ``worksteal``). With its default (``load``) the tests are shared out
    ahead, and a worker that drew the long ones (a GPU script's CPU run, compiles) finished
    alone: on 2 cores the suite took 621 s, with ``worksteal`` 543 s."""
    option = config.option
    if getattr(option, "numprocesses", None) and getattr(option, "dist", None) == "no":
        option.dist = "worksteal"


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Run the suite on one intra-op thread (restored after).

    The tests are thousands of tiny ops; on a 2-core machine that is also running
    other work, waking a second OpenMP thread per op costs milliseconds (measured
    here: ``logsigmoid`` on 40 numbers, 5 us on one thread vs 8 ms on two under load).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hsa_kernel():
    """The compiled HSA extension (:mod:`hiergraph.ops.hsa.native`), or a skip where it
    cannot be built here."""
    ext = native.extension()
    if ext is None:
        pytest.skip("the HSA kernel could not be built here")
    return ext


def assert_same_gradients(out, ref, inputs, upstream=None, **tolerance) -> None:
    """The gradients of ``(out * upstream).sum()`` and ``(ref * upstream).sum()`` with respect
    to ``inputs`` are close (``upstream``: standard normal, by default)."""
    upstream = torch.randn_like(ref) if upstream is None else upstream
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    expected = torch.autograd.grad((ref * upstream).sum(), inputs)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **tolerance)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``‖got − want‖ / ‖want‖`` (Frobenius norms), taken in float64."""
    want = want.double()
    return ((got.double() - want).norm() / want.norm()).item()


def rounding_error(exact: torch.Tensor, dtype: torch.dtype) -> float:
    """The relative error of rounding ``exact`` to ``dtype`` once: what a half-precision
    result computed in float32 and rounded once costs."""
    return relative_error(exact.to(dtype), exact)


def with_nan(x: torch.Tensor, row: int) -> torch.Tensor:
    """A copy of ``x`` with one NaN in row ``row``, requiring a gradient."""
    x = x.detach().clone()
    x[row].view(-1)[0] = float("nan")
    return x.requires_grad_()


def assert_same_nans(out: torch.Tensor, ref: torch.Tensor, **tolerance) -> None:
    """``out`` is NaN exactly where the reference ``ref`` is (somewhere, not everywhere) and
    equals it elsewhere: a NaN input reaches the outputs that the reference gives it."""
    nan = ref.isnan()
    assert nan.any() and not nan.all()
    assert torch.equal(out.isnan(), nan), (out.isnan().sum(), nan.sum())
    torch.testing.assert_close(out.masked_fill(nan, 0), ref.masked_fill(nan, 0), **tolerance)


def spy_calls(monkeypatch, owner, name: str) -> list[dict]:
    """The arguments of every call of ``owner.name`` from now on, by parameter name (those
    passed by position too; extra keywords as they are); the function still runs."""
    calls, fn = [], getattr(owner, name)
    signature = inspect.signature(fn)

    def spy(*args, **kwargs):
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        for parameter in signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(parameter.name, {}))
        calls.append(arguments)
        return fn(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def kernel_or_torch_ops(request, monkeypatch, owner, name: str) -> list[dict] | None:
    """For a fixture with ``params=["kernel", "torch-ops"]``: the kernel on and the calls of
    ``owner.name`` (a function its path goes through, :func:`spy_calls`), or the kernel off
    and ``None``."""
    if request.param == "torch-ops":
        monkeypatch.setattr(native, "_enabled", False)
        return None
    hsa_kernel()
    return spy_calls(monkeypatch, owner, name)


@pytest.fixture
def torch_ops(monkeypatch):
    """Equal-fanout HSA on PyTorch operations alone (the compiled kernel of
    :mod:`hiergraph.ops.hsa.native` off), for tests of those operations."""
    monkeypatch.setattr(native, "_enabled", False)


@pytest.fixture
def rng():
    return random.Random(1234)


@functools.cache
def planetoid_raw(name: str) -> Path | None:
    """The first ``<name>/raw`` under :data:`RAW_ROOTS` with the real raw files of Planetoid
    dataset ``name``, or ``None``; tests that clear the variables (``no_env``) still find it."""
    for root in filter(None, RAW_ROOTS):
        folder = Path(root) / name / "raw"
        if all((folder / f).exists() for f in hp.planetoid_raw_files(name)):
            return folder
    return None


def needs_planetoid(name: str):
    """Skip the test where the real raw files of ``name`` are absent."""
    return pytest.mark.skipif(planetoid_raw(name) is None, reason=f"real {name} raw files absent")


@pytest.fixture
def no_env(monkeypatch):
    """No dataset root or raw-folder environment variables."""
    monkeypatch.delenv(hp.DATA_ENV, raising=False)
    monkeypatch.delenv(hp.RAW_ENV, raising=False)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt of a Planetoid/PPI loader to download fails the test."""

    def fail(*args, **kwargs):
        raise AssertionError("a loader tried to download")

    monkeypatch.setattr(Planetoid, "download", fail)
    monkeypatch.setattr(PPI, "download", fail)


# ------------------------------------------------------------------ the ``cuda`` marker


def _is_cuda(value) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


def _needs_cuda(item) -> bool:
    """Whether a collected test exercises CUDA: a CUDA device among its parameters, or (when
    no parameter is a device) ``cuda`` in its name or a skip reason. Other CUDA tests carry
    ``@pytest.mark.cuda`` themselves."""
    callspec = getattr(item, "callspec", None)
    params = list(callspec.params.values()) if callspec is not None else []
    if any(_is_cuda(p) for p in params):
        return True
    if any(p == "cpu" or isinstance(p, torch.device) for p in params):
        return False  # the CPU variant of a device-parametrised test
    if "cuda" in item.name.lower():
        return True
    reasons = (str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
    return any("cuda" in reason.lower() for reason in reasons)


def pytest_collection_modifyitems(config, items):
    """Mark every CUDA test ``cuda``: ``pytest -m cuda`` runs exactly those (the GPU check of
    ``benchmarks/gpu.py``)."""
    for item in items:
        if _needs_cuda(item):
            item.add_marker(pytest.mark.cuda)


class DispatchedOps(TorchDispatchMode):
    """Records every aten operation that reaches the dispatcher inside the ``with`` block:
    ``calls``, ``(name, shape of the first argument or None)`` in order."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else None
        self.calls.append((func.overloadpacket.__name__, shape))
        return func(*args, **(kwargs or {}))

    def shapes(self, name: str) -> list[tuple | None]:
        """The first arguments' shapes of the calls of ``name``."""
        return [shape for called, shape in self.calls if called == name]
