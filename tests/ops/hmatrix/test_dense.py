"""H-matrix attention's dense reference (:mod:`hiergraph.ops.hmatrix.dense`): the
authors' example, the level map's partition of the matrix, sampled rows."""

import math

import pytest
import torch

from hiergraph.data.windows import hmatrix_layout
from hiergraph.ops.hmatrix import (
    hmatrix_attention,
    hmatrix_attention_dense,
    hmatrix_level_masks,
    hmatrix_logits,
)
from tests.ops.hmatrix import qkv as _qkv


def test_golden_example_of_the_authors():
    """Authors' 8x8 unit test (Nr = 2, d = 2): three coarse values, everything else exact."""
    x = torch.tensor(
        [[0.08482573, 1.9097669], [0.29561728, 1.1209449], [0.33432317, -0.8260815],
         [0.6481298, 1.0434877], [-0.7824855, -0.453946], [0.6298023, 0.8152592],
         [-0.3278767, -1.1234418], [-1.6607414, 0.2729053]],
        dtype=torch.float64,
    )  # fmt: skip
    a, b, c = 0.2592372306, -0.8335717156, -0.5346589167
    expected = x @ x.T
    for rows, cols, value in [
        ((0, 2), (4, 6), a), ((0, 2), (6, 8), b), ((2, 4), (6, 8), c),
    ]:  # fmt: skip
        expected[slice(*rows), slice(*cols)] = value
        expected[slice(*cols), slice(*rows)] = value
    x4 = x[None, None]
    logits = hmatrix_logits(x4, x4, block_size=2)[0, 0] * math.sqrt(2)
    torch.testing.assert_close(logits, expected, atol=1e-8, rtol=0)
    out = hmatrix_attention(x4, x4, x4, block_size=2)[0, 0]
    torch.testing.assert_close(out, torch.softmax(expected / math.sqrt(2), -1) @ x)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size", [(16, 2), (64, 4), (96, 8), (256, 16), (37, 2)])
def test_levels_partition_the_matrix(length, block_size, causal):
    masks = hmatrix_level_masks(length, block_size, causal)
    padded = hmatrix_layout(length, block_size).padded_length
    full = torch.ones(padded, padded, dtype=torch.long)
    assert torch.equal(masks.sum(0), full.tril() if causal else full)


@pytest.mark.parametrize("causal", [False, True])
def test_row_sampled_reference_matches_full_reference(causal):
    q, k, v = _qkv(100)
    mask = torch.zeros(2, 100, dtype=torch.bool)
    mask[1, 90:] = True
    rows = torch.tensor([0, 7, 31, 64, 95, 99])
    full = hmatrix_attention_dense(q, k, v, 8, causal, mask)
    sampled = hmatrix_attention_dense(q, k, v, 8, causal, mask, rows=rows)
    torch.testing.assert_close(sampled, full[:, :, rows], atol=1e-14, rtol=0)


@pytest.mark.parametrize(
    "rows, error, match",
    [
        # (a row past the sequence returned a padded position's row)
        (torch.tensor([0, 40]), ValueError, r"span 0\.\.40; .*\[0, the sequence length L = 37\)"),
        (torch.tensor([-1]), ValueError, r"span -1\.\.-1"),  # (an IndexError)
        (torch.tensor([1.0]), TypeError, "rows must be an int64 or int32 tensor"),
        ([0, 1], TypeError, "rows must be an int64 or int32 tensor .*, got list"),
        # (an int16 or uint8 tensor failed inside index_select)
        (torch.tensor([0, 1], dtype=torch.int16), TypeError, "int64 or int32 .*int16"),
        (torch.tensor([0, 1], dtype=torch.uint8), TypeError, "int64 or int32 .*uint8"),
        (torch.tensor([[0, 1]]), ValueError, "rows must be 1-D"),
    ],
)
def test_sampled_rows_outside_the_sequence_are_refused(rows, error, match):
    q, k, v = _qkv(37)
    with pytest.raises(error, match=match):
        hmatrix_attention_dense(q, k, v, 4, rows=rows)


def test_level_masks_check_their_rows_and_flag():
    """The masks' rows index the padded length (64 for 37 tokens in blocks of 4)."""
    assert hmatrix_level_masks(37, 4, rows=torch.tensor([63])).shape == (4, 1, 64)
    with pytest.raises(ValueError, match=r"span 64\.\.64; .*\[0, the padded length L' = 64\)"):
        hmatrix_level_masks(37, 4, rows=torch.tensor([64]))
    with pytest.raises(TypeError, match="causal must be a bool"):  # ("no" was causal)
        hmatrix_level_masks(16, 4, causal="no")


def test_level_masks_are_built_on_the_cpu_whatever_the_default_device():
    """Under ``torch.set_default_device("cuda")`` (``meta`` stands in for it here) the masks
    were built on that device, against the documented CPU and the CPU ``rows``."""
    expected = hmatrix_level_masks(37, 4, rows=torch.tensor([0, 63]))
    with torch.device("meta"):
        masks = hmatrix_level_masks(37, 4, rows=torch.tensor([0, 63], device="cpu"))
        assert torch.equal(hmatrix_level_masks(37, 4)[:, [0, 63]], expected)
    assert masks.device.type == "cpu" and torch.equal(masks, expected)
