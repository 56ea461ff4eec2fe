"""``check_edge_index``: the shared edge_index check, and its options."""

import pytest
import torch

from hiergraph.ops.edge_index import check_edge_index


def test_type_and_shape_only_never_read_values():
    meta = torch.empty(2, 7, dtype=torch.long, device="meta")  # reading its values raises
    check_edge_index(meta, 3, 4, check_range=False)
    with pytest.raises(NotImplementedError):
        check_edge_index(meta, 3, 4)  # the default reads the id range
    with pytest.raises(ValueError, match=r"shape \[2, E\], got \(3, 7\)"):
        check_edge_index(torch.empty(3, 7, dtype=torch.long, device="meta"), 3, check_range=False)
    with pytest.raises(TypeError, match="LongTensor .* got a torch.float32 tensor"):
        check_edge_index(torch.empty(2, 7, device="meta"), 3, check_range=False)
    bad = torch.tensor([[0, 9], [1, 2]])
    check_edge_index(bad, 3, check_range=False)
    with pytest.raises(ValueError, match=r"sources \(row 0, keys\) span 0\.\.9 for num_src = 3"):
        check_edge_index(bad, 3)


def test_int32_ids_on_request():
    ids = torch.tensor([[0, 2], [1, 3]], dtype=torch.int32)
    with pytest.raises(
        TypeError, match="must be a LongTensor of shape \\[2, E\\], got a torch.int32"
    ):
        check_edge_index(ids, 4)
    check_edge_index(ids, 3, 4, int32=True)
    with pytest.raises(ValueError, match=r"targets \(row 1, queries\) span 1\.\.3 for num_dst = 3"):
        check_edge_index(ids, 3, 3, int32=True)
    with pytest.raises(
        TypeError, match="int64 or int32 tensor of shape \\[2, E\\] or a SparseTensor"
    ):
        check_edge_index(ids.to(torch.int16), 4, int32=True, alternative="a SparseTensor")
