"""hiergraph.masks on devices: every builder makes its tensors on the device of its
tensor input, or on its ``device`` keyword, and gives the same edges on every device."""

import pytest
import torch

from hiergraph.masks import (
    automorphisms,
    block_diagonal_mask,
    causal_mask,
    cross_mask,
    dilated_mask,
    edge_index_to_mask,
    full_mask,
    global_tokens_mask,
    graph_mask,
    random_mask,
    sequence_batch,
    sibling_mask,
    window_mask,
)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

PARENT = torch.tensor([-1, 0, 0, 0, 1, 1, -1, 6, 6])  # two trees, families of 3, 2, 2
SELF_ROOTS = torch.where(PARENT < 0, torch.arange(9), PARENT)  # roots are their own parent
GRAPH = torch.tensor([[0, 1, 1, 3, 3], [1, 0, 1, 2, 2]])  # a loop and a duplicate
# inputs made here, on the CPU, not under the tests' default device
BASE, CAUSAL, BLOCKS = window_mask(5, 1), causal_mask(4), block_diagonal_mask([2, 2])

# builders without a tensor input: ``build(**kw)`` with ``kw`` = {} or {"device": ...}
KEYWORD_BUILDERS = {
    "full": lambda **kw: full_mask(6, **kw),
    "full_no_loops": lambda **kw: full_mask(6, self_loops=False, **kw),
    "causal": lambda **kw: causal_mask(6, **kw),
    "window": lambda **kw: window_mask(7, 2, **kw),
    "window_causal": lambda **kw: window_mask(7, 2, causal=True, **kw),
    "dilated": lambda **kw: dilated_mask(9, 1, 3, **kw),
    "block_diagonal": lambda **kw: block_diagonal_mask([2, 0, 3], **kw),
    "cross": lambda **kw: cross_mask(3, 4, **kw),
    "cross_bipartite": lambda **kw: cross_mask(3, 4, joint=False, **kw),
    "random_dense": lambda **kw: random_mask(10, 40, seed=3, **kw),
    "random_sparse": lambda **kw: random_mask(300, 500, seed=3, self_loops=False, **kw),
}


def batch_on(x_device, **params):
    """Two windowed sequences with features on ``x_device``."""
    x = torch.zeros(5, 1, device=x_device)
    return sequence_batch([3, 2], window_mask, x=x, p=1, **params)


# builders (and mask tools) with a tensor input: ``build(device)`` moves the input there
INPUT_BUILDERS = {
    "global_tokens": lambda d: global_tokens_mask(BASE.to(d), 5, 2),
    "global_read_only": lambda d: global_tokens_mask(BASE.to(d), 5, 2, read_only=True),
    "graph": lambda d: graph_mask(GRAPH.to(d), 4),
    "graph_no_loops": lambda d: graph_mask(GRAPH.to(d), 4, self_loops=False),
    "sibling": lambda d: sibling_mask(PARENT.to(d)),
    "sibling_no_loops": lambda d: sibling_mask(PARENT.to(d), self_loops=False),
    "sibling_self_roots": lambda d: sibling_mask(SELF_ROOTS.to(d)),
    "edge_index_to_mask": lambda d: edge_index_to_mask(GRAPH.to(d), 4, rows="query"),
    "automorphisms": lambda d: automorphisms(CAUSAL.to(d), 4),
    "automorphisms_networkx": lambda d: automorphisms(BLOCKS.to(d), 4, brute_force_up_to=0),
    "sequence_batch_pos": lambda d: batch_on(d).pos,
    "sequence_batch_edges": lambda d: batch_on(d, device=d).edge_index,  # built on x's device
    "sequence_batch_moved": lambda d: batch_on(d).edge_index,  # built elsewhere, moved to x's
}

ALL_BUILDERS = {
    **{name: lambda d, build=build: build(device=d) for name, build in KEYWORD_BUILDERS.items()},
    **INPUT_BUILDERS,
}


@pytest.mark.parametrize("name", KEYWORD_BUILDERS)
def test_device_keyword_keeps_cpu_results(name):
    """``device="cpu"`` (or a ``torch.device``) gives exactly the keyword-less result."""
    build = KEYWORD_BUILDERS[name]
    reference = build()
    assert reference.device.type == "cpu" and reference.dtype == torch.long
    for device in ("cpu", torch.device("cpu")):
        out = build(device=device)
        assert out.device.type == "cpu" and out.dtype == torch.long
        assert torch.equal(out, reference)


# not sequence_batch: PyG's collate makes its own tensors on the default device
@pytest.mark.parametrize("name", [n for n in ALL_BUILDERS if not n.startswith("sequence_batch")])
def test_builders_ignore_the_default_device(name):
    """With the default device set elsewhere (``meta``), CPU inputs or ``device="cpu"``
    still give the CPU result: no builder makes a tensor without naming its device."""
    build = ALL_BUILDERS[name]
    reference = build("cpu")
    with torch.device("meta"):
        out = build("cpu")
    assert out.device.type == "cpu"
    assert torch.equal(out, reference)


@needs_cuda
@pytest.mark.parametrize("name", ALL_BUILDERS)
def test_builders_on_cuda_equal_cpu(name):
    """On CUDA inputs (or ``device="cuda"``) the result lies on CUDA and equals the CPU one."""
    build = ALL_BUILDERS[name]
    out = build("cuda")
    assert out.device.type == "cuda"
    assert torch.equal(out.cpu(), build("cpu"))


@needs_cuda
def test_sequence_batch_on_cuda_without_x():
    """Without ``x``, the ``device`` passed on to the builder places ``pos`` too."""
    batch = sequence_batch([3, 2], window_mask, p=1, device="cuda")
    assert batch.edge_index.device.type == "cuda" and batch.pos.device.type == "cuda"
