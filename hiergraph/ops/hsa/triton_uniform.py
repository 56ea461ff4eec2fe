r"""Equal-fanout HSA on GPUs as Triton kernels: four launches per level for a forward and
backward.

On an accelerator, :mod:`~hiergraph.ops.hsa.uniform_fused` runs a fixed handful of
batched PyTorch operations per level, each its own kernel launch: at the lengths most
models run (batches of 128–2,048-token trees) a step is about a fixed cost per launch. The
kernels of :mod:`~hiergraph.ops.hsa.triton_kernels` run each pass over a level as one
launch, one program per (family, head): the bottom-up pass (logits, weights, log-partitions,
the parents' sums and energies), the top-down pass (gates, log masses, the output), and
the two sweeps of the backward, so a forward and backward over a depth-:math:`D` forest
take :math:`4D` launches. The leaves are read where they lie (``[L, H, d]`` with any row
and head strides, channels contiguous) and the output and gradients are written in the
inputs' layouts; bfloat16 and float16 rows are computed in float32.

It covers the fused op's options, position embeddings (per head or shared by the heads)
and leaf masks included (the padding of a batch, and the padded embedding of a forest of
window trees over sequences of different lengths, :mod:`~hiergraph.ops.hsa.padded`),
and, without gradients, a family above the roots (hub tokens, :mod:`~hiergraph.ops.hsa.lifted`),
without leaky-causal keys, with every fanout from 2 to :data:`MAX_FANOUT`; second
derivatives differentiate the recorded op.
The kernels are opt-in until they are timed on a GPU: set ``HIERGRAPH_TRITON=1`` (or call
:func:`set_enabled`) to run them for every eligible CUDA call, or run a block under
``with turned_on():``. They need the ``triton``
package (shipped with PyTorch's CUDA wheels).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

from hiergraph._autograd import AutogradFunction, recorded_gradients
from hiergraph._environment import env_flag
from hiergraph._precision import accumulation_dtype

#: The environment variable that turns the kernels on (``1``, ``true``, ``yes``, ``on``).
ENV = "HIERGRAPH_TRITON"
#: The widest family the kernels take: a program holds ``[b, b, CH]`` products.
MAX_FANOUT = 32
#: The most heads the kernels take: the heads are the second dimension of their grid.
MAX_HEADS = 65535
#: Channels per chunk (a power of two): the rows of a family are loaded ``CH`` at a time.
CHUNK = 16

_enabled = env_flag(ENV, default=False)


def set_enabled(flag: bool) -> bool:
    """Turn the kernels on or off for the calls that follow; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


@contextlib.contextmanager
def turned_on(flag: bool = True) -> Iterator[None]:
    """The kernels turned on (``flag``) or off inside a ``with`` block (or a function it
    decorates, ``turned_on()(fn)``), and back as they were after it. The autograd node is
    chosen in the forward: a backward taken after the block still runs the kernels."""
    previous = set_enabled(flag)
    try:
        yield
    finally:
        set_enabled(previous)


def enabled() -> bool:
    """Whether eligible calls run the Triton kernels."""
    return _enabled


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), on CPU
    tensors too."""
    return env_flag("TRITON_INTERPRET", default=False)


@functools.cache
def available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def applies(q: Tensor, k: Tensor, v: Tensor, fanout: tuple[int, ...], eps, leaf_mask) -> bool:
    """Whether the kernels run HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` over the
    equal-fanout forest with ``fanout`` (the callers have ruled out leaky-causal keys and
    ``torch.compile``): turned on (:func:`enabled`), CUDA tensors (any device under the
    Triton interpreter) of one floating dtype with contiguous channels, position
    embeddings per level (if any) ``[H | 1, n_d, c]`` (``n_d`` the level's nodes) on that
    device with contiguous channels, a leaf mask (if any) ``[L]`` there, at most
    :data:`MAX_HEADS` heads, every fanout from 2 to :data:`MAX_FANOUT`, and ``triton``
    importable (a family above the roots runs without gradients only: the callers' rule)."""
    if not (_enabled and (q.is_cuda or interpreting())):  # (every CPU call asks)
        return False
    heads = q.size(1) if q.dim() == 3 else 0
    nodes = [q.size(0) // math.prod(fanout[d:]) for d in range(1, len(fanout) + 1)]
    return (
        (eps is None or len(eps) == len(fanout))
        and all(
            e.dim() == 3
            and e.size(0) in (1, heads)
            and e.size(1) == n
            and e.stride(-1) == 1
            and e.is_floating_point()
            and e.device == q.device
            for e, n in zip(eps or (), nodes, strict=False)  # the lengths: checked above
        )
        and (leaf_mask is None or leaf_mask.shape == q.shape[:1] and leaf_mask.device == q.device)
        and q.is_floating_point()
        and all(t.dtype == q.dtype and t.dim() == 3 and t.stride(-1) == 1 for t in (q, k, v))
        and all(t.device == q.device for t in (k, v))
        and q.size(0) > 0
        and heads <= MAX_HEADS
        and 2 <= min(fanout)
        and max(fanout) <= MAX_FANOUT
        and available()
    )


def triton_uniform_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    fanout: tuple[int, ...],
    eps: list[Tensor] | None = None,
    *,
    include_self: bool,
    tau: float,
    size_bias: bool,
    recorded=None,
    leaf_mask: Tensor | None = None,
    above=None,
) -> Tensor:
    r"""HSA of ``q, k [L, H, d]``, ``v [L, H, d_v]`` (any row and head strides, contiguous
    channels) over the forest of equal trees with ``fanout`` ``(b_1, …, b_D)`` below their
    roots (``L`` a multiple of :math:`b_1 \cdots b_D`) and the position embeddings ``eps``
    per level ``[H | 1, n_d, c]`` (contiguous channels; or ``None``), as
    :func:`~hiergraph.ops.hsa.uniform_fused.fused_uniform_attention`; returns ``[L, H,
    d_v]`` in ``q``'s dtype and memory layout; ``leaf_mask`` ``[L]``: nonzero for the valid
    leaves (the others count 0 everywhere, their outputs are 0 and their rows get no
    gradient). ``recorded(q, k, v, eps)`` is the same op recorded by autograd (second
    derivatives); without it no gradient is taken (inference), and then ``above`` (a family
    above the roots) may be given, as in
    :func:`~hiergraph.ops.hsa.uniform.uniform_hierarchical_attention`."""
    counts = None if leaf_mask is None else _counts(leaf_mask, fanout, accumulation_dtype(q.dtype))
    options = (tuple(fanout), include_self, float(tau), size_bias, counts)
    eps = list(eps or ())
    if recorded is None:
        return _forward(q, k, v, eps, *options, above=above)[0]
    if above is not None:
        raise ValueError("the Triton HSA kernels take gradients without a family above the roots")
    return _TritonUniform.apply(options, recorded, q, k, v, *eps)


class _TritonUniform(AutogradFunction):
    @staticmethod
    def forward(ctx, options, recorded, q, k, v, *eps):
        out, levels = _forward(q, k, v, list(eps), *options)
        ctx.options, ctx.recorded, ctx.levels = options, recorded, levels
        ctx.save_for_backward(q, k, v, *eps)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, *eps = ctx.saved_tensors
        inputs = (q, k, v, eps or None)
        if torch.is_grad_enabled():  # create_graph=True: differentiate the recorded op
            return None, None, *recorded_gradients(ctx.recorded, inputs, grad)
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        fanout, include_self, tau, _, counts = ctx.options  # the size bias is in the saved lse
        try:
            grads = _backward(grad, q, k, v, eps, ctx.levels, fanout, include_self, tau, counts)
        except KernelsUnavailable:  # the recorded op's gradients instead (no graph kept)
            with torch.enable_grad():
                found = recorded_gradients(ctx.recorded, inputs, grad)
            grads = [None if g is None else g.detach() for g in found]
        return None, None, *grads


class _Level:
    """One level's shape and buffers: ``nodes`` per head, ``b`` members per family, ``n``
    leaves per node; the saved weights ``p [H, N, b]``, log-partitions ``lse``, energies
    ``energy`` and (above the leaves) log masses ``u`` (``[H, N]``), and the node row sums
    ``rows`` (``[H, N, ·]``, above the leaves)."""

    def __init__(self, nodes: int, b: int, n: int):
        self.nodes, self.b, self.n = nodes, b, n
        self.p = self.lse = self.energy = self.u = None
        self.rows: tuple[Tensor, ...] | None = None


def _counts(leaf_mask: Tensor, fanout: tuple[int, ...], dtype: torch.dtype) -> list[Tensor]:
    """Per level, every node's count of valid leaves ``[N_d]`` (the heads share them)."""
    n, counts = leaf_mask.to(dtype).contiguous(), []  # the kernels read them densely
    for b in reversed(fanout):
        counts.append(n)
        n = n.view(-1, b).sum(-1)
    return counts[::-1]


def _levels(fanout: tuple[int, ...], trees: int) -> list[_Level]:
    levels, nodes = [], trees
    for d, b in enumerate(fanout):
        nodes *= b
        levels.append(_Level(nodes, b, math.prod(fanout[d + 1 :])))
    return levels


class KernelsUnavailable(RuntimeError):
    """Triton could not build a kernel for this device (a warning said why); the kernels
    are turned off and the caller runs the default path."""


def _run(kernel, grid: tuple[int, int], *args, **meta) -> None:
    """Launch ``kernel`` over ``grid``; a kernel Triton cannot build for this device turns
    the kernels off with a warning and raises :class:`KernelsUnavailable`."""
    try:
        kernel[grid](*args, **meta)
    except Exception as error:
        if not _cannot_build(error):
            raise
        set_enabled(False)
        warnings.warn(
            f"Triton could not build the HSA kernels for this device ({type(error).__name__}: "
            f"{str(error).strip()[:300]}); they are turned off and the default path runs.",
            RuntimeWarning,
            stacklevel=2,
        )
        raise KernelsUnavailable(str(error)) from error


def _cannot_build(error: Exception) -> bool:
    """Whether ``error`` is Triton's for a kernel it cannot build: one of
    :func:`_build_errors`, or the plain ``RuntimeError`` its compiler raises when one of its
    MLIR passes fails (any other error, a CUDA fault say, is not a build's)."""
    if isinstance(error, _build_errors()):
        return True
    return type(error) is RuntimeError and "PassManager::run failed" in str(error)


@functools.cache
def _build_errors() -> tuple[type[BaseException], ...]:
    """Triton's errors of a kernel that cannot be built (compilation, ``ptxas``, registers
    or shared memory past the device's limits), those this version has."""
    import triton
    from triton.runtime import errors

    found = [getattr(triton, "CompilationError", None), getattr(triton, "OutOfResources", None)]
    found.append(getattr(errors, "PTXASError", None))
    return tuple(e for e in found if e is not None)


@functools.lru_cache(maxsize=256)
def _grid(nodes: int, b: int, heads: int, channels: int):
    """The grid (families, heads) and the block sizes of the programs of a level of ``nodes``
    nodes in families of ``b`` (copy ``meta`` before changing it): products of at
    most 4,096 elements (``[b, b, CH]``: channels in chunks of :data:`CHUNK`, fewer for
    families of more than 16) on one warp per 1,024 of them, at most 4. Compiled for an
    H100 (sm_90), no kernel spills registers; families of 32 with chunks of 16 channels took
    255 registers in the backward's second sweep, with chunks of 4 96."""
    block = _next_power_of_2(b)
    chunk = min(CHUNK, _next_power_of_2(channels), max(1, 4096 // (block * block)))
    warps = min(4, max(1, block * block * chunk // 1024))
    return (nodes // b, heads), dict(B=b, BB=block, CH=chunk, num_warps=warps)


def _flags(leaves: bool, include_self: bool, counts: list | None) -> dict[str, bool]:
    """The kernels' flags of a level (:mod:`~hiergraph.ops.hsa.triton_kernels`)."""
    masked = counts is not None
    return dict(
        LEAVES=leaves,
        GATE=include_self or not leaves,
        OWN=include_self and leaves,
        MASK=masked,
        ZERO=masked and leaves,
    )


def _next_power_of_2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _strides(x: Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


def _buffer_strides(level: _Level, channels: int) -> tuple[int, int]:
    return channels, level.nodes * channels


@functools.cache
def _tau(tau: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``tau`` as a one-element tensor in the kernels' dtype (a float argument would be
    float32), made on ``device`` once: filled there, not copied from host memory, which a
    first call inside a CUDA-graph capture could not do (nor a replay repeat). Unbounded on
    purpose: a captured graph reads the tensor where it was, so none may be freed (one
    element per distinct scale, dtype and device: models use a few)."""
    return torch.full((1,), tau, dtype=dtype, device=device)


def _output_like(q: Tensor, channels: int) -> Tensor:
    """An uninitialised ``[L, H, channels]`` tensor in ``q``'s dtype and memory order of
    rows and heads."""
    length, heads = q.shape[:2]
    if q.stride(0) < q.stride(1):  # heads first in memory
        return q.new_empty(heads, length, channels).transpose(0, 1)
    return q.new_empty(length, heads, channels)


def _count(counts: list[Tensor] | None, d: int, unused: Tensor) -> Tensor:
    """Level ``d``'s leaf counts, or ``unused`` without a mask."""
    return unused if counts is None else counts[d]


def _embedding(eps: list[Tensor], d: int, unused: Tensor) -> tuple:
    """The kernels' arguments for level ``d``'s position embeddings ``[H | 1, n_d, c]``:
    the rows, their row and head strides (0 when the heads share them) and ``c``, or
    ``unused`` and zeros without embeddings."""
    if not eps:
        return unused, 0, 0, 0
    e = eps[d]
    return e, e.stride(1), e.stride(0) if e.size(0) > 1 else 0, e.size(-1)


def _forward(q, k, v, eps, fanout, include_self, tau, size_bias, counts, above=None):
    """The two passes; returns the output and the levels the backward reads. With
    ``above``, the level-0 program also pools the roots (their sums and energies), the
    family above them hands back the log mass and output every root starts the top-down
    pass from."""
    from hiergraph.ops.hsa import triton_kernels as kernels

    length, heads, dim = q.shape
    dim_v = v.size(-1)
    depth, work = len(fanout), accumulation_dtype(q.dtype)
    trees = length // math.prod(fanout)
    levels = _levels(fanout, trees)
    roots = None if above is None else _Level(trees, 1, math.prod(fanout))
    tau_t = _tau(tau, work, q.device)
    unused = q.new_empty((1,), dtype=work)  # for pointers never read
    for d in range(depth - 1, -1, -1):  # bottom-up
        level = levels[d]
        leaves = d == depth - 1
        level.p = q.new_empty((heads, level.nodes, level.b), dtype=work)
        level.lse = q.new_empty((heads, level.nodes), dtype=work)
        if leaves:
            rows = (q, k, v)
            strides = [_strides(t) for t in rows]
            level.energy = q.new_empty((heads, level.nodes), dtype=work) if include_self else unused
        else:
            rows = level.rows
            strides = [_buffer_strides(level, t.size(-1)) for t in rows]
        parent = levels[d - 1] if d else roots
        if parent is not None:
            parent.rows = tuple(
                q.new_empty((heads, parent.nodes, c), dtype=work) for c in (dim, dim, dim_v)
            )
            parent.energy = q.new_empty((heads, parent.nodes), dtype=work)
        e, e_row, e_head, dim_e = _embedding(eps, d, unused)
        grid, meta = _grid(level.nodes, level.b, heads, max(dim, dim_v, dim_e))
        sums = parent.rows if parent is not None else (unused, unused, unused)
        _run(kernels.up_kernel, grid,
            *rows, *(s for pair in strides for s in pair),
            e, e_row, e_head, _count(counts, d, unused), tau_t, level.energy, level.p,
            level.lse,
            *sums, parent.energy if parent is not None else unused,
            level.nodes, dim, dim_v, dim_e, level.n,
            PARENT=parent is not None, SIZE_BIAS=size_bias, EPS=bool(eps),
            **_flags(leaves, include_self, counts), **meta,
        )  # fmt: skip
    out, acc = _output_like(q, dim_v), unused
    if roots is not None:  # the family above the roots, on their means
        n = roots.n if counts is None else counts[0].view(trees, -1).sum(-1).clamp(min=1)
        n = n if isinstance(n, int) else n[:, None]
        u, acc = above(roots.energy, [t / n for t in roots.rows])
        roots.u, acc = u.to(work).contiguous(), acc.to(work).contiguous()
    for d in range(depth):  # top-down
        level = levels[d]
        leaves = d == depth - 1
        parent = levels[d - 1] if d else roots
        if leaves:
            values, value_strides, target, target_strides = v, _strides(v), out, _strides(out)
        else:
            values = level.rows[2]
            value_strides = _buffer_strides(level, dim_v)
            level.u = q.new_empty((heads, level.nodes), dtype=work)
            target = q.new_empty((heads, level.nodes, dim_v), dtype=work)
            target_strides = _buffer_strides(level, dim_v)
        grid, meta = _grid(level.nodes, level.b, heads, dim_v)
        _run(kernels.down_kernel, grid,
            values, *value_strides, _count(counts, d, unused), level.p, level.lse,
            level.energy,
            unused if parent is None else parent.u, acc,
            unused if leaves else level.u, target, *target_strides,
            level.nodes, dim_v, level.n,
            TOP=parent is None, **_flags(leaves, include_self, counts), **meta,
        )  # fmt: skip
        acc = target
    return out, levels


def _backward(grad, q, k, v, eps, levels, fanout, include_self, tau, counts):
    from hiergraph.ops.hsa import triton_kernels as kernels

    heads, dim, dim_v = q.size(1), q.size(-1), v.size(-1)
    depth, work = len(fanout), accumulation_dtype(q.dtype)
    tau_t = _tau(tau, work, q.device)
    unused = q.new_empty((1,), dtype=work)  # for pointers never read
    grads, dws, d_downs, dus = [None] * depth, [None] * depth, [None] * depth, [None] * depth
    grads[-1] = grad
    dus[-1] = q.new_empty((heads, levels[-1].nodes), dtype=work) if include_self else unused
    for d in range(depth - 1, -1, -1):  # leaves to roots
        level = levels[d]
        leaves = d == depth - 1
        parent = levels[d - 1] if d else None
        dws[d] = q.new_empty((heads, level.nodes, level.b), dtype=work)
        d_downs[d] = q.new_empty((heads, level.nodes), dtype=work)
        if parent is not None:
            grads[d - 1] = q.new_empty((heads, parent.nodes, dim_v), dtype=work)
            dus[d - 1] = q.new_empty((heads, parent.nodes), dtype=work)
        if leaves:
            g_strides, values, v_strides = _strides(grad), v, _strides(v)
        else:
            g_strides = _buffer_strides(level, dim_v)
            values, v_strides = level.rows[2], _buffer_strides(level, dim_v)
        grid, meta = _grid(level.nodes, level.b, heads, dim_v)
        _run(kernels.grad_up_kernel, grid,
            grads[d], *g_strides, values, *v_strides, _count(counts, d, unused), level.p,
            level.lse, level.energy,
            unused if parent is None else parent.u, dus[d], dws[d], d_downs[d],
            unused if parent is None else grads[d - 1], unused if parent is None else dus[d - 1],
            level.nodes, dim_v, level.n,
            TOP=parent is None, **_flags(leaves, include_self, counts), **meta,
        )  # fmt: skip
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    d_eps = [q.new_empty((heads, *e.shape[1:]), dtype=work) for e in eps]
    pooled = da = None
    for d in range(depth):  # roots to leaves
        level = levels[d]
        leaves = d == depth - 1
        parent = levels[d - 1] if d else None
        if leaves:
            rows, row_strides = (q, k, grad), [_strides(t) for t in (q, k, grad)]
            targets = (dq, dk, dv)
            target_strides = [_strides(t) for t in targets]
            level_da = unused
        else:
            rows = (*level.rows[:2], grads[d])  # the sums of q and k; v's are not read
            row_strides = [_buffer_strides(level, t.size(-1)) for t in rows]
            targets = tuple(
                q.new_empty((heads, level.nodes, c), dtype=work) for c in (dim, dim, dim_v)
            )
            target_strides = [_buffer_strides(level, t.size(-1)) for t in targets]
            level_da = q.new_empty((heads, level.nodes), dtype=work)
        e, e_row, e_head, dim_e = _embedding(eps, d, unused)
        grid, meta = _grid(level.nodes, level.b, heads, max(dim, dim_v, dim_e))
        _run(kernels.grad_down_kernel, grid,
            *rows, *(s for pair in row_strides for s in pair),
            e, e_row, e_head, _count(counts, d, unused), tau_t, level.p, level.lse,
            level.energy, unused if parent is None else parent.u, dus[d], dws[d], d_downs[d],
            unused if parent is None else da, *(pooled or (unused, unused, unused)), level_da,
            *targets, d_eps[d] if eps else unused,
            *(s for pair in target_strides for s in pair),
            level.nodes, dim, dim_v, dim_e, level.n,
            TOP=parent is None, EPS=bool(eps), **_flags(leaves, include_self, counts), **meta,
        )  # fmt: skip
        pooled, da = targets, level_da
    # per head; an embedding the heads share gets the sum over them
    d_eps = [
        g.sum(0, keepdim=True) if e.size(0) < heads else g for e, g in zip(eps, d_eps, strict=True)
    ]
    return dq, dk, dv, *(g.to(e.dtype) for e, g in zip(eps, d_eps, strict=True))
