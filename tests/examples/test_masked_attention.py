"""examples/masked_attention.py: every mask trains and is scored."""


def test_every_mask_trains_and_is_scored(load_example, capsys):
    masked = load_example("masked_attention")
    results = masked.main(["--steps", "3", "--batch-size", "4"])
    assert set(results) == {"causal_window", "window", "causal", "full", "random"}
    assert all(0.0 <= a <= 1.0 for a in results.values())
    assert "causal_window: test accuracy" in capsys.readouterr().out
