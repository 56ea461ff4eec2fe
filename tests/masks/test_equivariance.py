"""hiergraph.masks.equivariance: automorphism groups of the masks and the
relabelling convention."""

import math

import numpy as np
import pytest
import torch

from hiergraph.masks import (
    automorphisms,
    block_diagonal_mask,
    causal_mask,
    cross_mask,
    equivariance_error,
    equivariance_errors,
    full_mask,
    is_automorphism,
    random_mask,
    relabel,
    window_mask,
)
from tests.masks.conftest import dense


def aut_size(edge_index, n):
    return automorphisms(edge_index, n).size(0)


def test_automorphism_classification_n6():
    """Note §2 table and §4.4, n = 6 (720 permutations)."""
    n = 6
    assert aut_size(full_mask(n), n) == 720
    assert aut_size(window_mask(n, 0), n) == 720  # identity mask
    identity = torch.arange(n)[None]
    assert torch.equal(automorphisms(causal_mask(n), n), identity)
    for p in (1, 2, 3):
        assert torch.equal(automorphisms(window_mask(n, p, causal=True), n), identity)
    # bidirectional window |i - j| <= w: 2, 2, 4, 48 (twins appear when n <= 2w)
    assert [aut_size(window_mask(n, w), n) for w in (1, 2, 3, 4)] == [2, 2, 4, 48]
    assert aut_size(block_diagonal_mask([2, 2, 2]), n) == 48  # S_2 wr S_3
    reversal = torch.arange(n - 1, -1, -1)
    assert is_automorphism(window_mask(n, 2), n, reversal)
    assert not is_automorphism(causal_mask(n), n, reversal)


def test_cross_attention_automorphisms_never_swap_sides():
    """T5: the joint encoder -> decoder graph has Aut = S_m x S_n, no swap (m = n = 3)."""
    m = n = 3
    auts = automorphisms(cross_mask(m, n), m + n)
    assert auts.size(0) == math.factorial(m) * math.factorial(n)
    assert bool((auts[:, :m] < m).all())  # encoder positions stay encoders


def test_automorphisms_networkx_matches_brute_force():
    for edge_index, n in [(window_mask(6, 1), 6), (block_diagonal_mask([2, 2, 2]), 6)]:
        brute = automorphisms(edge_index, n)
        assert torch.equal(automorphisms(edge_index, n, brute_force_up_to=0), brute)
    cycle = torch.stack([torch.arange(9), (torch.arange(9) + 1) % 9])
    assert aut_size(cycle, 9) == 9  # directed 9-cycle: rotations only (networkx path)
    no_nodes = torch.empty(2, 0, dtype=torch.long)  # one automorphism: the empty permutation
    for brute_force_up_to in (8, -1):
        assert automorphisms(no_nodes, 0, brute_force_up_to=brute_force_up_to).shape == (1, 0)


def test_permutations_are_checked():
    edge_index = window_mask(3, 1)
    with pytest.raises(ValueError, match=r"permutation of 0 .. 2, got \[0, 0, 2\]"):
        relabel(edge_index, torch.tensor([0, 0, 2]))  # (silently accepted before)
    # a list: "must be a tensor" (it said "must be a permutation … got list" elsewhere)
    for check in (lambda p: relabel(edge_index, p), lambda p: is_automorphism(edge_index, 3, p)):
        with pytest.raises(TypeError, match=r"^perm must be an int64 or int32 tensor.*got list"):
            check([2, 1, 0])
    with pytest.raises(ValueError, match=r"permutation of 0 .. 2, got \[1, 0\]"):
        is_automorphism(edge_index, 3, torch.tensor([1, 0]))  # (a raw size error before)
    with pytest.raises(ValueError, match=r"permutation of 0 .. 2, got \[2, 1, 0\]"):
        is_automorphism(edge_index, 3, torch.tensor([2, 1, 0], dtype=torch.uint8))  # (a mask)
    assert window_mask(np.int64(3), np.int64(1)).size(1) == 7  # NumPy ints are ints


def test_equivariance_checks_its_flag_and_edges():
    """``relabel_graph="no"`` was true; edges were never checked (float ids were used as they
    came, an id past the nodes raised an ``IndexError`` when relabelled)."""
    x, edge_index, perm = torch.randn(3, 2), window_mask(3, 1), torch.tensor([2, 0, 1])
    layer = lambda x, edge_index: x  # noqa: E731  (equivariant to everything)
    with pytest.raises(TypeError, match="relabel_graph must be a bool"):
        equivariance_error(layer, x, edge_index, perm, relabel_graph="no")
    with pytest.raises(TypeError, match="relabel_graph must be a bool"):
        equivariance_errors(layer, x, edge_index, perm[None], relabel_graph="no")
    with pytest.raises(TypeError, match="int64 or int32"):
        equivariance_errors(layer, x, edge_index.float(), perm[None])
    with pytest.raises(ValueError, match="out of range"):
        equivariance_errors(layer, x, torch.tensor([[0, 7], [1, 0]]), perm[None], True)
    assert equivariance_errors(layer, x, edge_index, perm[None], True).tolist() == [0.0]


def test_relabel_convention():
    """x_new = x[perm] turns the mask into M[perm][:, perm] and the edges into inv[E]."""
    gen = torch.Generator().manual_seed(0)
    edge_index = random_mask(7, 20, seed=1)
    perm = torch.randperm(7, generator=gen)
    m = dense(edge_index, 7)
    assert torch.equal(dense(relabel(edge_index, perm), 7), m[perm][:, perm])
