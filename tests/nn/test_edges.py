"""The shared edge input of the message-passing layers and its per-graph structure cache."""

import copy
import gc
import pickle
import warnings
import weakref

import pytest
import torch

import hiergraph.ops.edge_index as edge_module
from hiergraph.nn._edges import EdgeInput, GraphCache, GraphStructures
from hiergraph.ops.edge_index import adjacency_to_edge_index


def ids(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, 15), generator=gen)


def counted(calls: list, value):
    """A builder that records its calls and returns ``value``."""
    return lambda: calls.append(1) or value


def test_structures_are_built_once_per_name():
    structures, calls = GraphStructures(), []
    assert structures.get("a", counted(calls, None)) is None  # None is a value too
    assert structures.get("a", counted(calls, 1)) is None
    assert structures.get("b", counted(calls, 2)) == 2
    assert len(calls) == 2 and len(structures) == 2
    throwaway = GraphStructures(store=False)
    throwaway.get("a", counted(calls, 1))
    throwaway.get("a", counted(calls, 1))
    assert len(calls) == 4 and len(throwaway) == 0


def test_a_stored_tensor_written_in_place_is_built_again():
    structures, calls = GraphStructures(), []
    first = structures.get("t", counted(calls, torch.arange(4)))
    assert structures.get("t", counted(calls, torch.arange(4))) is first
    first[0] = 7  # e.g. handed to the caller, who wrote into it
    again = structures.get("t", counted(calls, torch.arange(4)))
    assert again is not first and again[0] == 0 and len(calls) == 2


def test_cache_keys_on_identity_version_and_node_counts():
    cache, edge_index = GraphCache(), ids()
    structures = cache(edge_index, 6, 6)
    assert cache(edge_index, 6, 6) is structures
    assert cache(edge_index, 7, 6) is not structures  # other node counts
    structures = cache(edge_index, 6, 6)
    assert cache(edge_index.clone(), 6, 6) is not structures  # another tensor
    structures = cache(edge_index, 6, 6)
    edge_index[1, 2] = 0  # an in-place write bumps the version
    assert cache(edge_index, 6, 6) is not structures
    structures = cache(edge_index, 6, 6)
    edge_index.add_(0)
    assert cache(edge_index, 6, 6) is not structures


def test_cache_keys_a_sparse_adjacency_on_its_index_tensors():
    cache = GraphCache()
    edge_index = ids()
    values = torch.ones(edge_index.size(1))
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, (6, 6), check_invariants=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        csr = coo.coalesce().to_sparse_csr()
    for adj, index in ((coo, coo._indices()), (csr, csr.col_indices())):
        structures = cache(adj, 6, 6)
        assert cache(adj, 6, 6) is structures
        index.add_(0)  # written in place
        assert cache(adj, 6, 6) is not structures


def test_cache_holds_the_last_graph_weakly():
    cache, edge_index = GraphCache(), ids()
    doubled = counted([], torch.cat([edge_index, edge_index], 1))  # holds no reference to it
    cache(edge_index, 6, 6).get("doubled", doubled)
    ref = weakref.ref(edge_index)
    del edge_index
    gc.collect()
    assert ref() is None and cache.structures is None and cache.ref is None
    first, second = ids(seed=1), ids(seed=2)
    cache(first, 6, 6)
    cache(second, 6, 6)  # replaces the first graph: one graph at a time
    assert cache.ref() is second
    del first
    gc.collect()
    assert cache.ref() is second  # the death of an older graph leaves the current one
    cache_ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert cache_ref() is None  # the graph's callback does not keep the cache alive


def test_copies_start_empty():
    layer_edges, edge_index = EdgeInput("a sparse adjacency", True), ids()
    layer_edges(edge_index, 6, 6).structures.get("x", lambda: 1)
    for clone in (copy.deepcopy(layer_edges), pickle.loads(pickle.dumps(layer_edges))):
        assert clone.cache.structures is None and clone.cache.ref is None
        assert clone.alternative == "a sparse adjacency" and clone.keep_sparse_tensor
    assert layer_edges.cache.structures is not None


def test_nothing_is_stored_under_inference_mode_or_compilation(monkeypatch):
    cache, edge_index, calls = GraphCache(), ids(), []
    with torch.inference_mode():
        cache(edge_index, 6, 6).get("x", counted(calls, 1))
        inference = ids()
    assert cache.structures is None
    cache(inference, 6, 6).get("x", counted(calls, 1))  # no version counter: not stored
    assert cache.structures is None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache(edge_index, 6, 6).get("x", counted(calls, 1))
    assert cache.structures is None and len(calls) == 3


def test_edge_input_unpacks_an_adjacency_and_checks_the_ids():
    edges = EdgeInput("a sparse adjacency")
    edge_index = ids()
    values = torch.randn(edge_index.size(1), 2)
    adj = torch.sparse_coo_tensor(edge_index.flip(0), values, (6, 6, 2), check_invariants=True)
    unpacked = edges(adj, 6, 6)
    assert torch.equal(unpacked.edge_index, edge_index) and unpacked.adjacency is adj
    assert torch.equal(unpacked.values, values)
    assert edges(adj, 6, 6).structures is unpacked.structures  # keyed on the adjacency
    with pytest.raises(TypeError, match="or a sparse adjacency"):
        edges(edge_index.float(), 6, 6)
    with pytest.raises(ValueError, match="out of range"):
        edges(edge_index, 6, 3)
    edges(edge_index, 6, 3, validate=False)


def counting_range_checks(monkeypatch) -> list:
    """Patch the layers' check: the list gets one entry per id-range check."""
    calls, real = [], edge_module.check_edge_index

    def counting(*args, check_range=True, **kwargs):
        if check_range:
            calls.append(args[0])
        return real(*args, check_range=check_range, **kwargs)

    monkeypatch.setattr(edge_module, "check_edge_index", counting)
    return calls


def test_ids_are_range_checked_once_per_graph(monkeypatch):
    calls = counting_range_checks(monkeypatch)
    checked, ids = EdgeInput("a BandMask"), torch.tensor([[0, 2, 1], [1, 3, 0]])
    for _ in range(3):
        checked(ids, 3, 4)
    assert len(calls) == 1
    checked(ids, 3, 5)  # other node counts
    ids[0, 0] = 0  # written in place
    checked(ids, 3, 5)
    checked(ids.clone(), 3, 5)  # another tensor
    assert len(calls) == 4
    checked(ids.clone(), 3, 5, validate=False)  # type and shape only
    assert len(calls) == 4
    with pytest.raises(TypeError, match="or a BandMask"):
        checked(ids.float(), 3, 5)  # the type: every call
    bad = torch.tensor([[0, 3], [1, 1]])
    with pytest.raises(ValueError, match="out of range"):
        checked(bad, 3, 4)
    with pytest.raises(ValueError, match="out of range"):
        checked(bad, 3, 4)  # a failed check is not remembered
    for clone in (copy.deepcopy(checked), pickle.loads(pickle.dumps(checked))):
        assert clone.cache.ref is None
    adj = torch.sparse_coo_tensor(
        torch.tensor([[1, 0], [0, 2]]), torch.ones(2), (2, 3), check_invariants=True
    )
    calls.clear()
    for _ in range(2):  # an adjacency: the ids are new tensors every call, remembered by adj
        assert torch.equal(checked(adj, 3, 2).edge_index, adjacency_to_edge_index(adj, 3, 2)[0])
    assert len(calls) == 1
    adj._indices()[0, 0] = 1  # written in place
    checked(adj, 3, 2)
    assert len(calls) == 2


def test_inference_tensors_are_checked_on_every_call(monkeypatch):
    """An inference tensor keeps no version counter: its ids cannot be remembered as
    checked, so they are checked on every call (an error before)."""
    calls = counting_range_checks(monkeypatch)
    checked = EdgeInput("a sparse adjacency")
    with torch.inference_mode():
        edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    checked(edge_index, 3, 3)
    checked(edge_index, 3, 3)
    assert len(calls) == 2
    with pytest.raises(ValueError):
        checked(edge_index, 2, 2)
