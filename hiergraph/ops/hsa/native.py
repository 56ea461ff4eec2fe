r"""HSA as compiled CPU kernels, built on first use: over equal-fanout forests and over any
forest.

:mod:`~hiergraph.ops.hsa.uniform_fused` runs the two passes of equal-fanout HSA as a fixed
handful of batched operations per level, each a pass over memory: at the lengths most models
run (batches of 128–2,048-token trees) those passes, and the copies between the
``[L, H, d]`` layout of a projection and the heads-first one the batched products want, cost
more than the arithmetic. The kernel in ``csrc/uniform.cpp`` runs the same passes one
(tree, head) at a time, in parallel over them: it reads a tree's leaf rows where they lie
(any row and head strides), keeps a family's logits, weights and products in registers and
cache, and writes the output and the gradients in the inputs' layouts. The forward keeps
the node sums, the weights :math:`P`, the log-partitions and the energies of every level
(about :math:`b_D + 2` values per leaf and head); the backward recomputes the gates from
them.

:func:`forest_attention` (``csrc/ragged.cpp``) runs the same two passes over any forest
(ragged trees, leaves at every depth, window trees over sequences of different lengths)
from the tree index's arrays (every node's children, leaf row and leaf count), one task per
(tree, head), or, with fewer of those than threads, the families of each level in parallel:
float32 and float64 CPU rows, position embeddings or none, first derivatives in the kernel
and second ones through the recorded op, no leaf mask or leaky-causal keys (those take the
other paths). :func:`causal_forest_attention` (``csrc/causal.cpp``) is strictly causal HSA
over any forest (:mod:`~hiergraph.ops.hsa.causal`'s edge lists): one task per (tree, head)
walks the tree's leaves in order as a decoder would, and its backward walks them in
reverse.

The equal-fanout kernel covers what
:func:`~hiergraph.ops.hsa.uniform_fused.fused_uniform_attention` covers and
more: float32 and float64 CPU tensors whose channels are contiguous, position embeddings or
none, every fanout at least 2, a leaf mask (the padding of a batch of documents), first
derivatives (second derivatives differentiate the recorded op, as the fused op's do), and
without gradients (inference) a family above the roots (hub tokens,
:mod:`~hiergraph.ops.hsa.lifted`), between whose passes it stops: the bottom-up pass hands
the roots' energies and pooled rows to that family, the top-down pass starts from what it
returns. :func:`hub_tree_attention` runs the hub window trees of pretrained encoders
(:mod:`~hiergraph.integrations.hub_windows`) whole, windows and root family, one task per
example and head. :func:`kv_step` is the decoding step of
:class:`~hiergraph.nn.HierarchicalKVCache` on its store (``csrc/kv_cache.cpp``).
:func:`edge_softmax` (``csrc/edge_softmax.cpp``) is the softmax of every query row over its
own list of key rows, with its backward, without forming the gathered rows of every edge: the
edge lists of strictly causal HSA (every (leaf, ancestor) pair over the ancestor's left
siblings, per depth) and the family attention of ``kernel="edge"`` (every node over its
siblings, per level) run on it. Everything else, and everything under
``torch.compile``, takes the other paths.

The kernel is compiled with :func:`torch.utils.cpp_extension.load` (a C++ compiler with
OpenMP and ``ninja`` are needed) the first time an eligible call runs: about a minute once
(48 s, 70 CPU s, on one 2-core machine: the sources include PyTorch's lighter headers,
``csrc/tensors.h`` says why), and again after an update changes the sources, then
loaded from PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``); a line on stderr
announces each compilation. :func:`build` compiles it ahead of time. Where the build fails,
a warning says why and the other paths run. Set the environment variable
``HIERGRAPH_NATIVE=0`` (or call :func:`set_enabled`) to turn it off.
"""

from __future__ import annotations

import hashlib
import math
import platform
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, recorded_gradients, records_grad
from hiergraph._environment import env_flag

#: The environment variable that turns the kernel off (``0``, ``false``, ``no``, ``off``).
ENV = "HIERGRAPH_NATIVE"
#: The kernels' sources: equal-fanout and hub-tree HSA, HSA and strictly causal HSA over any
#: forest, the KV cache's step, softmax over lists of keys, the module (``csrc/vector_ops.h``
#: and ``csrc/family_ops.h``: the row operations they share; ``csrc/tensors.h``: their
#: allocations; ``csrc/checks.h``: their input checks).
SOURCES = [
    Path(__file__).parent / "csrc" / f
    for f in (
        "uniform.cpp",
        "ragged.cpp",
        "causal.cpp",
        "kv_cache.cpp",
        "edge_softmax.cpp",
        "bindings.cpp",
    )
]

_lock = threading.Lock()
_enabled = env_flag(ENV, default=True)
_loaded: dict[str, ModuleType | None] = {}


def set_enabled(flag: bool) -> bool:
    """Turn the kernel on or off for this process; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


def enabled() -> bool:
    """Whether eligible calls run the kernel (it is then built on the first of them)."""
    return _enabled


def build_flags() -> tuple[str, list[str], list[str]]:
    """The extension's name and compiler and linker flags for this CPU: the vector
    instructions PyTorch itself dispatches to (``torch.backends.cpu.get_cpu_capability``),
    so that a cache shared by different machines keeps one build per instruction set. The
    name also holds a digest of the sources' folder: PyTorch rebuilds an extension whose
    sources moved, so two installs sharing a cache would otherwise rebuild each other's."""
    capability = torch.backends.cpu.get_cpu_capability()
    isa = {
        "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma",
                   "-mprefer-vector-width=512"],
        "AVX2": ["-mavx2", "-mfma"],
    }.get(capability, [])  # fmt: skip
    cflags = ["-O3", "-fopenmp", "-fno-math-errno", *isa]
    ldflags = ["-fopenmp"]
    if platform.libc_ver()[0] == "glibc" and platform.machine() == "x86_64":
        ldflags.append("-lmvec")  # glibc's vector exp and log1p
    folder = hashlib.sha1(str(SOURCES[0].parent.resolve()).encode()).hexdigest()[:8]
    return f"hiergraph_hsa_{capability.lower()}_{folder}", cflags, ldflags


def build() -> ModuleType:
    """Compile (or load from the cache) and return the extension; raises where the build
    fails."""
    from torch.utils.cpp_extension import load

    name, cflags, ldflags = build_flags()
    if _compiles():
        print(
            "hiergraph: compiling its HSA kernels (once per install and machine, and again "
            "after an update changes them; about a minute; HIERGRAPH_NATIVE=0 skips it)",
            file=sys.stderr,
            flush=True,
        )
    return load(name, [str(p) for p in SOURCES], extra_cflags=cflags, extra_ldflags=ldflags)


def _compiles() -> bool:
    """Whether :func:`build` will compile: no library in the extension's build folder yet,
    or one older than a source or header (an update or a ``git pull`` changed them; ninja
    then rebuilds)."""
    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(build_flags()[0], verbose=False))
    built = [p.stat().st_mtime for p in folder.glob("*.so")]
    csrc = SOURCES[0].parent
    sources = [p.stat().st_mtime for p in csrc.glob("*") if p.suffix in (".cpp", ".h")]
    return not built or max(built) < max(sources, default=0.0)


def state() -> str:
    """What the kernel is in this process, without building it: ``"off"`` (turned off),
    ``"loaded"``, ``"failed"`` (the build failed: PyTorch operations run), ``"built"`` (in
    the cache: loads on first use) or ``"not built"`` (compiles on first use)."""
    if not _enabled:
        return "off"
    if "module" in _loaded:
        return "loaded" if _loaded["module"] is not None else "failed"
    return "not built" if _compiles() else "built"


def extension() -> ModuleType | None:
    """The loaded extension, built on the first call; ``None`` where the build failed (one
    warning) or the kernel is turned off."""
    if not _enabled:
        return None
    if "module" not in _loaded:
        with _lock:
            if "module" not in _loaded:
                try:
                    _loaded["module"] = build()
                except Exception as error:  # no compiler, no OpenMP, no ninja, no cache dir
                    warnings.warn(
                        "hiergraph could not build its HSA kernels, so HSA runs "
                        f"on PyTorch operations (set {ENV}=0 to skip the attempt): {error}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    _loaded["module"] = None
    return _loaded["module"]


#: Most leaves per tree when gradients are taken. A task's rows then outgrow the caches,
#: and with few trees few tasks share the threads: forward+backward over one tree, 4
#: heads x 64, 2 threads, took 0.43x the time of the PyTorch operations at 1K leaves and
#: 0.8x at 16K, but 1.25x at 64K and 1.4x at 256K (forward alone: 0.78x at 256K).
MAX_TREE_LEAVES = 1 << 14

#: With a gradient, the kernel takes families of fewer members. A task keeps a family's
#: weights in a small buffer; a wider family's no longer fit in cache, where the batched
#: products of the PyTorch operations stream them: forward+backward of stars of 256, 512
#: and 1,024 leaves (4 heads x 64, 2 threads) took 1.14x, 1.30x and 1.63x the time of the
#: PyTorch operations (``benchmarks/hsa_wide.py``), trees with families of 128 0.8-1.1x.
WIDE_FANOUT = 256


def applies(
    q: Tensor, k: Tensor, v: Tensor, fanout: tuple[int, ...], eps, grad: bool, trees=None
) -> bool:
    """Whether the kernel runs HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over the
    equal-fanout forest with ``fanout`` (the callers have ruled out leaky-causal keys and,
    with a gradient, a family above the roots): float32 or float64 CPU tensors with
    contiguous channels (``q, k, v``; the position embeddings per level ``eps``, if any,
    of the same dtype), every fanout at least 2, at least as many (tree, head) tasks as
    threads, with a ``grad`` at most :data:`MAX_TREE_LEAVES` leaves per tree and families
    of fewer than :data:`WIDE_FANOUT` members, outside ``torch.compile``, and the
    extension built. ``trees``: the forest's trees where ``q`` has fewer rows than its
    leaves (the real leaves of a padded forest)."""
    leaves = math.prod(fanout)
    trees = q.size(0) // leaves if trees is None else trees
    return _runs(
        _eligible(q, k, v, *(eps or ()))
        and min(fanout) >= 2
        and trees * q.size(1) >= torch.get_num_threads()
        and (not grad or (leaves <= MAX_TREE_LEAVES and max(fanout) < WIDE_FANOUT))
    )


def applies_to_hub_trees(q: Tensor, k: Tensor, v: Tensor, trees: int) -> bool:
    """Whether the kernel runs :func:`hub_tree_attention` of ``trees`` trees over the rows
    ``q, k [N, H, d]``, ``v [N, H, d_v]``: float32 or float64 CPU tensors with contiguous
    channels, no gradient, not under ``torch.compile``, at least as many (tree, head)
    tasks as threads, and the extension built."""
    return _runs(
        _eligible(q, k, v)
        and not records_grad(q, k, v)
        and trees * q.size(1) >= torch.get_num_threads()
    )


def hub_tree_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    leaf_rows: Tensor,
    hub_rows: Tensor,
    fanout: tuple[int, ...],
    out: Tensor,
    *,
    include_self: bool,
    size_bias: bool,
    scale: float,
) -> None:
    r"""HSA over trees whose root has ``W = fanout[0]`` window subtrees of equal fanout
    ``fanout[1:]`` (each at least 2) and ``G`` hubs as leaves of its own family
    (:mod:`~hiergraph.integrations.hub_windows`), without gradients, read from and written
    to token rows in place: tree ``t``'s window leaves are the rows ``leaf_rows[t]``
    (``[trees, W b_2 \cdots b_D]``) of ``q, k [N, H, d]``, ``v [N, H, d_v]``, its hubs the
    rows ``hub_rows[t]`` (``[trees, G]``), ``-1`` a padding slot (no leaf, no hub). Every
    leaf's and hub's output goes to its row of ``out`` ``[N, H, d_v]``; other rows are left
    as they are."""
    extension().hub_forward(
        q, k, v, leaf_rows, hub_rows, list(fanout), float(scale), include_self, size_bias, out
    )


def kv_step(
    store: tuple[Tensor, ...],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    m: int,
    first: int,
    widths: list[int],
    leaves: list[int],
    slot: int,
    tau: float,
) -> Tensor:
    """One decoding step of :class:`~hiergraph.nn.HierarchicalKVCache` on its ``store``
    (keys, values, queries, prefix sums, ``n g`` and ``g``; ``csrc/kv_cache.cpp``): the
    output ``[H, d_v]`` of the token ``q, k [H, d]``, ``v [H, d_v]`` whose leaf is child
    ``slot`` of open node ``m - 1``, below open nodes whose closed children number
    ``widths`` and hold ``leaves`` leaves, the path's nodes ``first - 1 …`` new."""
    return extension().kv_step(*store, q, k, v, m, first, widths, leaves, slot, tau)


def applies_to_edges(q: Tensor) -> bool:
    """Whether :func:`edge_softmax` runs in the kernel for queries ``q``: a float32 or
    float64 CPU tensor, outside ``torch.compile``, and the extension built."""
    return _runs(_cpu_float(q))


def edge_softmax(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_n: Tensor,
    eps: Tensor | None,
    pair_node: Tensor,
    key_pair: Tensor,
    key_node: Tensor,
    tau: float,
    recorded,
) -> tuple[Tensor, Tensor]:
    r"""Softmax attention of every query row ``p`` of ``q [P, H, d]`` over the key rows
    ``key_node[e]`` of its edges (``key_pair[e] == p``; ``key_pair`` ascending) with the logits
    :math:`s_e = \tau\, q_p^\top k_n + \log n_n + \varepsilon_{m}^\top \varepsilon_n`
    (``k [N, H, d]``, ``log_n [N]``, ``eps [N, H, c]`` or ``None``, :math:`m` =
    ``pair_node[p]``): ``lse [P, H]`` (:math:`-\infty` without edges) and ``theta [P, H,
    d_v]``, the softmax-weighted rows of ``v [N, H, d_v]`` (0 without edges), computed row by
    row in ``csrc/edge_softmax.cpp`` without forming the gathered ``[E, H, ·]`` rows.
    Differentiable in ``q, k, v, eps``; second derivatives differentiate ``recorded(q, k, v,
    eps)``, the same op on tensor operations."""
    ptr = _row_pointers(key_pair, q.size(0))
    eps = None if eps is None else eps.contiguous()
    graph = (log_n.contiguous(), pair_node, ptr, key_pair, key_node, float(tau), recorded)
    q, k, v = (t.contiguous() for t in (q, k, v))
    return _EdgeSoftmax.apply(graph, q, k, v, eps)


class _EdgeSoftmax(AutogradFunction):
    @staticmethod
    def forward(ctx, graph, q, k, v, eps):
        log_n, pair_node, ptr, _, key_node, tau, _ = graph
        lse, theta = extension().edge_softmax_forward(
            q, k, v, log_n, eps, pair_node, ptr, key_node, tau
        )
        ctx.graph = graph
        ctx.save_for_backward(q, k, v, eps, lse, theta)
        return lse, theta

    @staticmethod
    def backward(ctx, grad_lse: Tensor, grad_theta: Tensor):
        q, k, v, eps, lse, theta = ctx.saved_tensors
        log_n, pair_node, ptr, key_pair, key_node, tau, recorded = ctx.graph
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            return None, *recorded_gradients(recorded, (q, k, v, eps), (grad_lse, grad_theta))
        # the keys' edges, transposed: the backward writes every key row from one thread
        order = torch.argsort(key_node, stable=True)
        key_ptr = _row_pointers(key_node[order], k.size(0))
        dq, dk, dv, d_eps, d_eps_query = extension().edge_softmax_backward(
            grad_lse.contiguous(), grad_theta.contiguous(), q, k, v, log_n, eps, pair_node,
            ptr, key_node, key_pair, order, key_ptr, lse, theta, tau,
        )  # fmt: skip
        if eps is not None:
            d_eps = d_eps.index_add(0, pair_node, d_eps_query)
        return None, dq, dk, dv, d_eps


def _row_pointers(rows: Tensor, size: int) -> Tensor:
    """``[size + 1]`` offsets of the runs of ``0, 1, …, size - 1`` in the ascending ``rows``
    (a binary search per row: no output whose size depends on values, no host read)."""
    return torch.searchsorted(rows, torch.arange(size + 1, device=rows.device))


def _runs(eligible: bool, fits: Callable[[], bool] | None = None) -> bool:
    """Whether a kernel runs a call that meets its own conditions (``eligible``): outside
    ``torch.compile``, the extension built (on the first call that gets this far), and
    ``fits()`` (asked last, of calls the kernel could run: it may read a number from the
    host)."""
    return (
        eligible
        and not torch.compiler.is_compiling()
        and extension() is not None
        and (fits is None or fits())
    )


def _cpu_float(x: Tensor) -> bool:
    """Whether ``x`` is a float32 or float64 CPU tensor."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def _eligible(q: Tensor, k: Tensor, v: Tensor, *eps: Tensor | None) -> bool:
    """Float32 or float64 CPU rows ``[N, H, ·]`` of one dtype with contiguous channels, and
    position embeddings ``eps`` (``None`` entries: none) of that dtype."""
    return (
        _cpu_float(q)
        and all(t.dtype == q.dtype and t.dim() == 3 and t.stride(-1) == 1 for t in (q, k, v))
        and all(e is None or e.dtype == q.dtype for e in eps)
    )


def native_uniform_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    fanout: tuple[int, ...],
    eps: list[Tensor] | None,
    *,
    include_self: bool,
    tau: float,
    size_bias: bool,
    recorded=None,
    leaf_mask: Tensor | None = None,
    above=None,
) -> Tensor:
    r"""HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` (any row and head strides) over the
    forest of equal trees with ``fanout`` ``(b_1, …, b_D)`` below their roots (``L`` a
    multiple of :math:`b_1 \cdots b_D`) and the position embeddings ``eps`` per level
    ``[H | 1, n_d, c]`` (or ``None``), as
    :func:`~hiergraph.ops.hsa.uniform_fused.fused_uniform_attention`; returns ``[L, H,
    d_v]`` in ``v``'s memory layout; ``leaf_mask`` ``[L]``: nonzero for the valid leaves
    (the outputs of the others are 0, and their rows get no gradient). ``recorded(q, k, v,
    eps)`` is the same op recorded by autograd (second derivatives); without it no gradient
    is taken (inference), and then ``above`` (a family above the roots) may be given, as in
    :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention`."""
    eps = [e if e.stride(-1) == 1 else e.contiguous() for e in eps or ()]
    options = (list(fanout), float(tau), include_self, size_bias)
    if recorded is not None:
        if above is not None:
            raise ValueError("the HSA kernel takes gradients without a family above the roots")
        return _NativeUniform.apply(options, leaf_mask, recorded, q, k, v, *eps)
    if above is None:
        return extension().forward(q, k, v, eps, *options, False, leaf_mask)[0]
    # the bottom-up pass to the roots, the family above them, the top-down pass
    saved, energy, *pooled = extension().up(q, k, v, eps, *options, leaf_mask)
    log_mass, acc = above(energy, pooled)
    return extension().down(q, k, v, eps, saved, log_mass, acc, *options, leaf_mask)


class _NativeUniform(AutogradFunction):
    @staticmethod
    def forward(ctx, options, leaf_mask, recorded, q, k, v, *eps):
        out, saved = extension().forward(q, k, v, list(eps), *options, True, leaf_mask)
        ctx.options, ctx.leaf_mask, ctx.recorded = options, leaf_mask, recorded
        ctx.save_for_backward(q, k, v, saved, *eps)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, saved, *eps = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            inputs = (q, k, v, eps or None)
            return None, None, None, *recorded_gradients(ctx.recorded, inputs, grad)
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        dq, dk, dv, *d_eps = extension().backward(
            grad, q, k, v, eps, saved, *ctx.options, ctx.leaf_mask
        )
        d_eps = [_per_embedding(g, e, 0) for e, g in zip(eps, d_eps, strict=True)]
        return None, None, None, dq, dk, dv, *d_eps


def _per_embedding(grad: Tensor, embedding: Tensor, heads_dim: int) -> Tensor:
    """A kernel's per-head gradient of position embeddings for ``embedding``: an embedding
    shared by the heads (size 1 along ``heads_dim``) gets the sum over the heads."""
    if embedding.size(heads_dim) == grad.size(heads_dim):
        return grad
    return grad.sum(heads_dim, keepdim=True)


#: Most sibling weights (every family's ``b^2``, times the heads) :func:`forest_attention`
#: keeps for the backward: a forest with more (families of thousands of members) runs on the
#: block kernel, which chunks a giant family's rows.
MAX_FOREST_WEIGHTS = 1 << 25


def applies_to_forest(q: Tensor, k: Tensor, v: Tensor, index, pos: Tensor | None) -> bool:
    """Whether :func:`forest_attention` runs HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]``
    over the forest ``index`` with the position embeddings ``pos`` (or ``None``): float32
    or float64 CPU rows with contiguous channels and embeddings of their dtype, outside
    ``torch.compile``, the extension built, and at most :data:`MAX_FOREST_WEIGHTS` weights
    (the callers have ruled out leaf masks and leaky-causal keys)."""
    return _runs(
        _eligible(q, k, v, pos), lambda: int(index.pair_ptr[-1]) * q.size(1) <= MAX_FOREST_WEIGHTS
    )


def forest_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos: Tensor | None,
    index,
    *,
    tau: float,
    include_self: bool,
    size_bias: bool,
    recorded,
) -> Tensor:
    r"""HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over any forest ``index`` (a
    :class:`~hiergraph.plan.TreeIndex`: ragged trees, leaves at any depth) with the position
    embeddings ``pos`` ``[N, H | 1, c]`` in node order (or ``None``), without leaf masks or
    leaky-causal keys, as :func:`~hiergraph.ops.hsa.attention.general_attention` computes
    it, in ``csrc/ragged.cpp``: one task per (tree, head), or, with fewer of those than
    threads, level by level in parallel over every (family, head); a family's logits and
    weights in cache, no copy of the leaf rows. Returns ``[L, H, d_v]`` (node-major).
    The forward keeps the inner nodes' means, every family's weights and per node and head
    four numbers for the backward; second derivatives differentiate ``recorded(q, k, v,
    pos)``, the same op on tensor operations."""
    count = torch.cat([level.count for level in index.levels]).to(q.dtype)
    forest = (index.child_ptr, index.leaf_row, index.order, count, index.pair_ptr, index.tree_ptr)
    options = (list(index.level_ptr), float(tau), include_self, size_bias)
    q, k, v = (t.contiguous() for t in (q, k, v))
    eps = None if pos is None else pos.contiguous()
    return _PlannedKernel.apply("ragged", forest, options, recorded, q, k, v, eps)


class _PlannedKernel(AutogradFunction):
    """A compiled kernel over a plan's arrays: ``{name}_forward(q, k, v, eps, *arrays,
    *options)`` returns the output and what ``{name}_backward(grad, q, k, v, eps, *arrays,
    *saved, *options)`` reads, which returns the gradients of ``q, k, v`` and, per head,
    ``eps``; second derivatives differentiate ``recorded``."""

    @staticmethod
    def forward(ctx, name, arrays, options, recorded, q, k, v, eps):
        out, *saved = getattr(extension(), f"{name}_forward")(q, k, v, eps, *arrays, *options)
        # (not ctx.name: the backward node's own name() method)
        ctx.kernel, ctx.arrays, ctx.options, ctx.recorded = name, arrays, options, recorded
        ctx.save_for_backward(q, k, v, eps, *saved)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, eps, *saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            grads = recorded_gradients(ctx.recorded, (q, k, v, eps), grad)
            return None, None, None, None, *grads
        dq, dk, dv, d_eps = getattr(extension(), f"{ctx.kernel}_backward")(
            grad.contiguous(), q, k, v, eps, *ctx.arrays, *saved, *ctx.options
        )
        d_eps = None if eps is None else _per_embedding(d_eps, eps, 1)
        return None, None, None, None, dq, dk, dv, d_eps


def applies_to_causal(q: Tensor, k: Tensor, v: Tensor, eps: Tensor | None) -> bool:
    """Whether :func:`causal_forest_attention` runs for ``q, k [L, H, d]``, ``v [L, H,
    d_v]`` and the position embeddings ``eps`` (or ``None``): float32 or float64 CPU rows
    with contiguous channels and embeddings of their dtype, outside ``torch.compile``, and
    the extension built."""
    return _runs(_eligible(q, k, v, eps))


def causal_forest_attention(
    q: Tensor, k: Tensor, v: Tensor, eps: Tensor | None, plan, *, tau: float, recorded
) -> Tensor:
    r"""Strictly causal HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over the forest of the
    :class:`~hiergraph.plan.CausalPlan` ``plan`` with the position embeddings ``eps`` ``[N,
    H, c]`` in node order (or ``None``), as :mod:`~hiergraph.ops.hsa.causal` computes it on
    its edge lists, in ``csrc/causal.cpp``: one task per (tree, head) walks the tree's
    leaves in order as a decoder would (the prefix sums of the open nodes, one softmax per
    ancestor over its left siblings, the energies up the path, the gated output), and its
    backward walks them in reverse. Returns ``[L, H, d_v]``. Second derivatives
    differentiate ``recorded(q, k, v, eps)``, the same op on tensor operations."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    eps = None if eps is None else eps.contiguous()
    options = _causal_options(plan, tau)
    return _PlannedKernel.apply("causal", plan.breadth_first, options, recorded, q, k, v, eps)


def causal_forest_statistics(
    q: Tensor, k: Tensor, v: Tensor, eps: Tensor | None, plan, *, tau: float
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The forward of :func:`causal_forest_attention` with the node statistics it computes
    on its way, without autograd: ``out [L, H, d_v]``, the sums of ``q, k, v`` over every
    node's leaves ``[N, H, d + d + d_v]`` and every node's complete energy :math:`g` (its
    value at the node's last leaf; a root's 0) ``[N, H]``, both in node order: what
    :func:`~hiergraph.ops.hsa.causal.causal_statistics` returns."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    eps = None if eps is None else eps.contiguous()
    out, sums, energy = extension().causal_statistics(
        q, k, v, eps, *plan.breadth_first, *_causal_options(plan, tau)
    )
    position = plan.tree_index.rank  # node id -> breadth-first position
    return out, sums.index_select(0, position), energy.index_select(0, position)


def _causal_options(plan, tau: float) -> tuple[int, float]:
    """The causal kernel's scalar arguments: the number of trees (the roots' positions
    come first) and the logit scale."""
    return plan.tree_index.level_ptr[1], float(tau)
