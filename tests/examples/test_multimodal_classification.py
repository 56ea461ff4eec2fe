"""examples/multimodal_classification.py: the patch stem against dense references, and a run.

The end-to-end run uses the generated emoji package of ``tests/datasets/test_emoji.py``
(a synthetic stand-in: flat-colour squares named "thing N").
"""

import json

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import ImageField, MultimodalSchema, SequenceField
from tests.datasets.test_emoji import fake_package, needs_minilm  # noqa: F401 (fixture)


@pytest.fixture
def mm(load_example):
    return load_example("multimodal_classification")


def records(schema, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        image = torch.rand(3, 8, 8, generator=gen, dtype=torch.float64) if i != 1 else None
        title = torch.randn(2 + i, 5, generator=gen, dtype=torch.float64)
        out.append(schema.build({"image": image, "title": title}))
    return Batch.from_data_list(out)


def leaf_types(batch):
    return batch.node_type.index_select(0, batch.tree_index().leaf_node)


@pytest.mark.parametrize("stem", ["pixels", "conv"])
def test_patch_stem_matches_dense_reference(mm, stem):
    schema = MultimodalSchema([ImageField("image", 3, patch_size=4), SequenceField("title", 5)])
    batch = records(schema)
    mean, std = torch.tensor([0.2, 0.5, 0.7]), torch.tensor([0.1, 0.3, 2.0])
    torch.manual_seed(0)
    module = mm.PatchStem(3, 4, 0, mean, std, stem=stem).double()
    types = leaf_types(batch)
    out = module(batch.x, types)
    assert out.shape == batch.x.shape and out.dtype == torch.float64
    image = types == 0
    assert int(image.sum()) == 2 * 4  # records 0 and 2 have a 2x2 patch grid
    torch.testing.assert_close(out[~image], batch.x[~image], rtol=0, atol=0)  # tokens untouched
    for row in image.nonzero().view(-1).tolist():  # one patch at a time, by hand
        patch = batch.x[row, :48].view(3, 4, 4)
        ref = (patch - mean.double().view(3, 1, 1)) / std.double().view(3, 1, 1)
        if stem == "conv":
            conv1, conv2 = module.conv[0], module.conv[2]
            ref = torch.nn.functional.gelu(conv1(ref[None]))
            ref = torch.nn.functional.gelu(conv2(ref))[0]
            assert ref.shape == (12, 2, 2)
        torch.testing.assert_close(out[row, :48], ref.flatten(), rtol=1e-12, atol=1e-12)
        assert out[row, 48:].eq(0).all()  # the zero padding stays zero


def test_patch_stem_gradients_and_bad_input(mm):
    schema = MultimodalSchema([ImageField("image", 3, patch_size=4), SequenceField("title", 5)])
    batch = records(schema)
    module = mm.PatchStem(3, 4, 0, torch.zeros(3), torch.ones(3), stem="conv").double()
    module(batch.x, leaf_types(batch)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    text = leaf_types(batch) == 1  # a batch without image leaves passes through
    assert torch.equal(module(batch.x[text], leaf_types(batch)[text]), batch.x[text])
    with pytest.raises(ValueError, match="stem must be"):
        mm.PatchStem(3, 4, 0, torch.zeros(3), torch.ones(3), stem="vit")
    with pytest.raises(ValueError, match="even patch_size"):
        mm.PatchStem(3, 5, 0, torch.zeros(3), torch.ones(3), stem="conv")


def emoji_run(mm, tmp_path, device: str) -> dict:
    """Three models, two epochs, the conv stem and hubs on the generated emoji package."""
    return mm.main(
        [
            "--dataset",
            "emoji",
            "--root",
            str(tmp_path / "cache"),
            "--models",
            "hsa",
            "fsa",
            "image",
            "--seeds",
            "0",
            "--epochs",
            "2",
            "--image-stem",
            "conv",
            "--hubs",
            "2",
            "--device",
            device,
            "--json",
            str(tmp_path / "r.json"),
        ]
    )


@needs_minilm
def test_runs_end_to_end_on_a_generated_emoji_package(mm, fake_package, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HIERGRAPH_EMOJI", str(fake_package))
    out = emoji_run(mm, tmp_path, "cpu")
    assert set(out["models"]) == {"hsa", "fsa", "image"}
    sizes = {m: out["models"][m]["summary"]["parameters"] for m in out["models"]}
    assert len(set(sizes.values())) == 1  # equal size: the same layer, stem and head
    for model in out["models"].values():
        run = model["runs"][0]
        assert 0 <= run["test"]["acc"] <= 1 and len(run["history"]) == 2
        assert sum(map(sum, run["confusion"])) == out["sizes"]["test"]
    pairs = out["paired_vs_hsa"]
    assert set(pairs) == {"fsa", "image"} and pairs["fsa"]["acc"]["seeds"] == 1
    hsa, fsa = (out["models"][m]["runs"][0]["test"]["f1"] for m in ("hsa", "fsa"))
    assert pairs["fsa"]["f1"]["mean"] == pytest.approx(hsa - fsa)
    config = json.loads((tmp_path / "r.json").read_text())["config"]
    assert (config["image_stem"], config["hubs"], config["device"]) == ("conv", 2, "cpu")


@needs_minilm
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_end_to_end_on_cuda(mm, fake_package, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HIERGRAPH_EMOJI", str(fake_package))
    out = emoji_run(mm, tmp_path, "cuda")
    for model in out["models"].values():
        run = model["runs"][0]
        assert 0 <= run["test"]["acc"] <= 1 and len(run["history"]) == 2
        assert sum(map(sum, run["confusion"])) == out["sizes"]["test"]
    assert json.loads((tmp_path / "r.json").read_text())["config"]["device"] == "cuda"


def test_quick_budget_by_default_and_the_benchmark_setting_with_paper(mm):
    quick = mm.parse_args([])
    assert (quick.seeds, quick.epochs, quick.baselines) == ([0], 2, False)
    assert (quick.image_stem, quick.group_size, quick.readout) == ("pixels", None, "leaves")
    paper = mm.parse_args(["--paper"])
    assert (paper.seeds, paper.epochs, paper.baselines) == ([0, 1, 2, 3, 4], 8, True)
    assert (paper.image_stem, paper.group_size, paper.readout) == ("conv", 2, "tree")
    mixed = mm.parse_args(["--paper", "--group-size", "0", "--epochs", "1"])
    assert (mixed.group_size, mixed.epochs, mixed.image_stem) == (None, 1, "conv")


def test_raw_dir_is_an_option_the_missing_data_hint_can_name(mm, tmp_path, monkeypatch):
    """The hint added to a loader's message names ``--raw-dir``, which the script lacked."""
    monkeypatch.delenv("HIERGRAPH_EMOJI", raising=False)
    argv = ["--dataset", "emoji", "--root", str(tmp_path / "root"), "--device", "cpu"]
    with pytest.raises(SystemExit) as stop:
        mm.run(lambda: mm.main([*argv, "--raw-dir", str(tmp_path / "given")]))
    message = str(stop.value.code)
    assert message.startswith("error: GoogleEmoji: no raw data found")
    assert f"  - {tmp_path / 'given'}\n" in message  # the folder searched
    assert message.endswith("(From a script: raw_dir= is its --raw-dir option.)")
