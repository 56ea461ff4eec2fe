"""``hiergraph._device``: host-to-device copies of Python metadata."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hiergraph import _device
from hiergraph._device import host_tensor, to_device


@pytest.mark.parametrize("capturing", [False, True])
def test_a_copy_captured_into_a_cuda_graph_keeps_its_pinned_source(monkeypatch, capturing):
    """A captured copy is re-read from its host buffer at every replay: that buffer must
    outlive the call (and never be handed to another allocation)."""
    real_to = torch.Tensor.to

    def to(self, device, non_blocking=False):  # the "device" copy is the staged tensor
        return self if torch.device(device).type == "cuda" else real_to(self, device)

    monkeypatch.setattr(_device, "_captured_sources", [])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone())
    monkeypatch.setattr(torch.Tensor, "to", to)
    staged = host_tensor([3, 1, 4], "cuda")
    assert staged.tolist() == [3, 1, 4]
    source = weakref.ref(staged)
    del staged
    gc.collect()
    assert (source() is not None) == capturing
    assert len(_device._captured_sources) == capturing


def test_host_tensor_on_the_cpu_and_meta():
    assert torch.equal(host_tensor([1, 2], "cpu"), torch.tensor([1, 2]))
    assert host_tensor([1.5], "meta", torch.float32).device.type == "meta"


def test_to_device_leaves_a_cpu_tensor_as_it_is():
    """On the CPU no copy (a cached CPU tensor is handed out as it is: read-only)."""
    tensor = torch.arange(3.0)
    assert to_device(tensor, "cpu") is tensor
    assert to_device(tensor, "meta").device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_copy_replays_its_own_values_on_cuda():
    from hiergraph.ops.masked.banded import segment_ids

    lengths = [3, 5, 2]
    want = segment_ids(lengths, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = segment_ids(lengths, "cuda")
    others = [host_tensor([7, 7, 7], "cuda") for _ in range(64)]  # pinned blocks of that size
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want) and all(o.tolist() == [7, 7, 7] for o in others)
