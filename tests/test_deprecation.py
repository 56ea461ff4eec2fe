"""Renamed arguments keep their old names until ``REMOVED_IN``, with a FutureWarning."""

import inspect
import warnings

import pytest
import torch

from hiergraph._deprecation import REMOVED_IN, renamed_arguments, renamed_attribute
from hiergraph.integrations import block_attention_flops, padded_block_attention
from hiergraph.ops import top_per_tree


@renamed_arguments(old="new", was="now")
def _renamed(a, new=1, now=2):
    return a, new, now


def test_old_keywords_are_passed_on_as_the_new_ones_with_a_warning():
    with pytest.warns(FutureWarning) as warned:
        assert _renamed(0, old=5) == (0, 5, 2)
    assert len(warned) == 1 and warned[0].filename == __file__  # the caller's line
    assert str(warned[0].message) == (
        f"_renamed(): the argument 'old' is now called 'new'; 'old' stops working in "
        f"hiergraph {REMOVED_IN}"
    )
    with pytest.warns(FutureWarning) as warned:
        assert _renamed(0, old=5, was=6) == (0, 5, 6)
    assert len(warned) == 2


def test_new_and_positional_calls_do_not_warn_and_both_names_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _renamed(0, 3, 4) == (0, 3, 4)
        assert _renamed(0, new=3, now=4) == (0, 3, 4)
    with pytest.raises(TypeError, match="got both 'old' and 'new'; 'old' is the old name"):
        _renamed(0, old=3, new=3)
    assert list(inspect.signature(_renamed).parameters) == ["a", "new", "now"]


def test_renamed_functions_take_their_old_names():
    scores = torch.tensor([0.5, 2.0, 1.0, 3.0])
    with pytest.warns(FutureWarning, match="'g' is now called 'hubs'"):
        assert torch.equal(top_per_tree(scores, 1, g=2), top_per_tree(scores, 1, hubs=2))
    with pytest.warns(FutureWarning, match="'block' is now called 'block_size'"):
        old = block_attention_flops(10, block=4, head_dim=16)
    assert old == block_attention_flops(10, block_size=4, head_dim=16)
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    valid = torch.ones(1, 6, dtype=torch.bool)
    with pytest.warns(FutureWarning, match="'block' is now called 'block_size'"):
        old = padded_block_attention(q, q, q, valid, block=3)
    assert torch.equal(old, padded_block_attention(q, q, q, valid, block_size=3))


def test_a_renamed_attribute_reads_the_new_one_with_a_warning():
    class Holder:
        new = 7
        old = renamed_attribute("new", "a reason")

    with pytest.warns(FutureWarning, match=rf"Holder.old is now called new \(a reason\); "
                      rf"'old' stops working in hiergraph {REMOVED_IN}"):  # fmt: skip
        assert Holder().old == 7
    assert isinstance(Holder.old, renamed_attribute)  # on the class: the descriptor
