"""``examples/listops.py``: data labels, the HSA-window encoder under padding, a quick run."""

import json
import re
import threading

import pytest
import torch


def _evaluate(tokens: list[int], listops) -> int:
    """The value of a prefix expression, parsed from its tokens (an independent reference)."""
    stack = []
    for token in tokens:
        if token in listops.OPERATORS:
            stack.append([token])
        elif token == listops.CLOSE:
            op, *args = stack.pop()
            value = listops.OPERATORS[op][1](args)
            if not stack:
                return value
            stack[-1].append(value)
        elif stack:
            stack[-1].append(token - 1)
        else:
            return token - 1
    raise ValueError("unbalanced expression")


def test_labels_are_the_expression_values(load_example):
    listops = load_example("listops")
    data = listops.listops(200, 5, 80, seed=3)
    assert all(5 <= len(tokens) <= 80 for tokens, _ in data)
    assert [label for _, label in data] == [_evaluate(tokens, listops) for tokens, _ in data]
    assert len({label for _, label in data}) > 5


def test_hsa_window_attention_ignores_padding(load_example):
    listops = load_example("listops")
    torch.manual_seed(0)
    attn = listops.HSAWindowAttention(8, 2, branching=(2, 4)).double()
    x = torch.randn(3, 37, 8, dtype=torch.float64)
    lengths = [37, 5, 20]
    pad = torch.arange(37)[None, :] >= torch.tensor(lengths)[:, None]
    out = attn(x, pad)
    assert (out[pad] == 0).all()
    for row, n in enumerate(lengths):
        alone = attn(x[row : row + 1, :n])
        torch.testing.assert_close(out[row, :n], alone[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                          reason="needs a CUDA device"))],
)  # fmt: skip
def test_quick_run_trains_every_encoder(load_example, tmp_path, device, capsys):
    listops = load_example("listops")
    out = tmp_path / "listops.json"
    argv = ["--quick", "--budget-seconds", "0.5", "--device", device, "--out", str(out)]
    results = listops.main(argv)
    # a run that learns nothing says so (a newcomer read it as a failure); whether it learnt
    # depends on the steps the budget allowed, so the note follows the printed numbers
    printed = capsys.readouterr().out
    majority = float(re.search(r"majority-class test accuracy ([0-9.]+)", printed).group(1))
    learnt_nothing = all(r["test_accuracy"] <= majority + 0.05 for r in results)
    assert ("this budget does not learn ListOps" in printed) == learnt_nothing
    assert [r["encoder"] for r in results] == list(listops.ENCODERS)
    assert len({r["parameters"] for r in results}) == 1  # only the attention differs
    assert all(r["steps"] >= 1 and 0.0 <= r["test_accuracy"] <= 1.0 for r in results)
    saved = json.loads(out.read_text())
    assert saved["results"] == results and saved["args"]["device"] == device
    attn = listops.HSAWindowAttention(8, 2, branching=(2, 4)).to(device)  # no padding mask
    assert attn(torch.randn(2, 9, 8, device=device)).device.type == device


def test_quick_keeps_explicit_options(load_example, tmp_path):
    """``--quick`` fills only what was not given (it overwrote explicit sizes before); the
    results go into a folder made for them."""
    listops = load_example("listops")
    out = tmp_path / "new" / "listops.json"
    encoder = next(iter(listops.ENCODERS))
    listops.main(["--quick", "--budget-seconds", "0.2", "--batch-size", "8", "--heads", "1",
                  "--encoders", encoder, "--device", "cpu", "--out", str(out)])  # fmt: skip
    args = json.loads(out.read_text())["args"]
    assert (args["batch_size"], args["heads"]) == (8, 1)  # given
    assert (args["dim"], args["train_size"], args["budget_seconds"]) == (32, 1000, 0.2)
    for bad in (["--quick", "--paper"], ["--min-len", "50", "--max-len", "20"]):
        with pytest.raises(SystemExit):
            listops.main(bad)


def test_a_length_range_it_cannot_fill_is_refused(load_example):
    """No expression has 2 or 3 tokens: generating such data looped forever."""
    listops = load_example("listops")
    outcome = []

    def generate():
        try:
            listops.listops(4, 2, 3, seed=0)
        except listops.OptionError as error:
            outcome.append(str(error))

    worker = threading.Thread(target=generate, daemon=True)  # (the old code never returned)
    worker.start()
    worker.join(timeout=60)
    assert outcome and "widen --min-len..--max-len" in outcome[0]


def test_a_tiny_budget_still_trains_one_step(load_example):
    """A budget shorter than the first step trained none (``last_loss`` null, the test
    accuracy of the untrained model); zero or a negative budget is refused when parsed."""
    listops = load_example("listops")
    argv = ["--quick", "--budget-seconds", "1e-9", "--train-size", "16", "--test-size", "4",
            "--batch-size", "4", "--encoders", "flat", "--device", "cpu"]  # fmt: skip
    [result] = listops.main(argv)
    assert result["steps"] == 1 and isinstance(result["last_loss"], float)


def test_sizes_the_library_refuses_end_the_script_before_the_data(load_example, monkeypatch):
    listops = load_example("listops")
    monkeypatch.setattr(listops, "listops", None)  # never reached
    with pytest.raises(SystemExit) as stop:
        listops.run(lambda: listops.main(["--quick", "--block-size", "3"]))
    assert stop.value.code.startswith("error: block_size must be an even int >= 2")
