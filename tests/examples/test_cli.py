"""``examples/_cli.py``: the ``--threads`` and ``--device`` options the example scripts share,
and ``run``, which reports missing data without a traceback."""

import argparse
import json
import os
import re

import pytest
import torch

from tests.examples.conftest import EXAMPLES


@pytest.fixture
def cli(load_example):
    threads = torch.get_num_threads()
    yield load_example("_cli")
    torch.set_num_threads(threads)


def test_threads_option_is_unset_until_given(cli):
    parser = argparse.ArgumentParser()
    cli.add_threads_option(parser)
    assert parser.parse_args([]).threads is None
    assert parser.parse_args(["--threads", "3"]).threads == 3
    assert "idle cores" in parser.format_help()
    other = argparse.ArgumentParser()
    cli.add_threads_option(other, help="one thread is fastest here")
    assert "one thread is fastest here" in other.format_help()


def test_runtime_options_are_threads_and_device(cli):
    parser = argparse.ArgumentParser()
    cli.add_runtime_options(parser, threads_help="one thread is fastest here")
    args = parser.parse_args(["--threads", "2", "--device", "cpu"])
    assert (args.threads, args.device) == (2, "cpu")
    assert "one thread is fastest here" in parser.format_help()


def test_set_threads_prefers_the_option_then_the_script_default_then_idle_cores(cli):
    args = argparse.Namespace(threads=1)
    assert cli.set_threads(args, default=2) == 1 == torch.get_num_threads() == args.threads
    args = argparse.Namespace(threads=None)
    assert cli.set_threads(args, default=1) == 1 == torch.get_num_threads() == args.threads
    torch.set_num_threads(2)  # default_threads: at most 2, and no more than the idle cores
    args = argparse.Namespace(threads=None)
    assert 1 <= cli.set_threads(args) == torch.get_num_threads() == args.threads <= 2


@pytest.mark.parametrize(
    ("script", "help_text"),
    [
        ("listops", "at most 2, and no more than the idle cores"),
        ("document_classification", "default 1: fastest for this model"),
        ("ddp_train", "per process"),
    ],
)
def test_scripts_keep_their_threads_help(load_example, script, help_text, capsys):
    module = load_example(script)
    parse = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit):
        parse(["--help"])
    assert help_text in " ".join(capsys.readouterr().out.split())


SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_whole_docstring_and_the_defaults(load_example, script, capsys):
    """``--help`` tells a newcomer what the script needs (budgets, data, run times: the
    docstring's later paragraphs; most printed only its first line) and each option's
    default."""
    module = load_example(script)
    parse = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit):
        parse(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    paragraphs = [p for p in module.__doc__.split("\n\n") if p.strip()]
    for paragraph in (paragraphs[0], paragraphs[-1]):
        assert " ".join(paragraph.split()) in shown
    parser = module.example_parser("First.\n\nLast.")
    parser.add_argument("--n", type=int, default=0, help="a count")
    parser.add_argument("--budget", type=int, default=None, help="set by the budget")
    text = " ".join(parser.format_help().split())
    assert "a count (default: 0)" in text and "set by the budget (default" not in text


def test_device_defaults_to_cuda_when_present_and_refuses_what_is_missing(cli):
    parser = argparse.ArgumentParser()
    cli.add_device_option(parser)
    args = parser.parse_args([])
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert cli.get_device(args) == torch.device(expected) and args.device == expected
    args = parser.parse_args(["--device", "cpu"])
    assert cli.get_device(args) == torch.device("cpu")
    with pytest.raises(SystemExit, match="'gpu'"):
        cli.get_device(parser.parse_args(["--device", "gpu"]))
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last CUDA device
    with pytest.raises(SystemExit, match="CUDA device"):
        cli.get_device(parser.parse_args(["--device", missing]))


def test_run_reports_missing_data_without_a_traceback(cli):
    """A loader's FileNotFoundError (its message says where it searched and how to supply
    the files) ends a script with the message alone and exit status 1."""

    def missing():
        raise FileNotFoundError("Cora: no raw data found. Fix: put the files into raw/")

    with pytest.raises(SystemExit) as stop:
        cli.run(missing)
    assert str(stop.value.code) == "error: Cora: no raw data found. Fix: put the files into raw/"
    assert stop.value.__suppress_context__  # no chained traceback
    cli.run(lambda: None)  # a script that ends normally returns

    def api_advice():  # the loaders name their Python argument: the script says its own
        raise FileNotFoundError("IMDB: no raw data found. Fix: pass raw_dir=<folder>")

    with pytest.raises(SystemExit) as stop:
        cli.run(api_advice)
    # every script whose loaders name raw_dir= takes --raw-dir (see the next test); the
    # loader's own message names the environment variable its dataset reads, which is not
    # HIERGRAPH_RAW for every dataset (the multimodal ones)
    assert str(stop.value.code).endswith("\n(From a script: raw_dir= is its --raw-dir option.)")
    assert "HIERGRAPH_RAW" not in str(stop.value.code)


LOADERS = re.compile(r"from hiergraph\.datasets\.(?!download\b)\w+ import")


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_that_use_the_dataset_loaders_take_raw_dir(load_example, script, capsys):
    """The hint :func:`run` adds to a loader's message (``raw_dir=`` is ``--raw-dir``) holds
    for every script: multimodal_classification and zeroshot_minilm had no such option."""
    if not LOADERS.search((EXAMPLES / f"{script}.py").read_text()):
        pytest.skip("uses none of the dataset loaders")
    module = load_example(script)
    with pytest.raises(SystemExit):
        (getattr(module, "parse_args", None) or module.main)(["--help"])
    assert "--raw-dir" in capsys.readouterr().out


@pytest.mark.parametrize("script", sorted(p.stem for p in EXAMPLES.glob("*.py")))
def test_scripts_that_load_data_end_through_run(script):
    """Every script that reads a dataset runs its main through ``run``."""
    text = (EXAMPLES / f"{script}.py").read_text()
    if script == "_cli" or "datasets" not in text and "load_" not in text:
        pytest.skip("loads no dataset")
    main_block = text.split('if __name__ == "__main__":')[-1]
    assert "run(" in main_block


def test_given_options_are_those_on_the_command_line(cli):
    parser = argparse.ArgumentParser()
    parser.add_argument("--hubs", type=int, default=0)
    parser.add_argument("--smooth", action="store_true")
    parser.add_argument("--model", default="gcn")
    assert cli.given_options(parser, []) == set()
    assert cli.given_options(parser, ["--hubs", "0", "--smooth"]) == {"hubs", "smooth"}


def test_options_that_would_be_ignored_are_refused(cli, capsys):
    """An option given where it does not apply stops with argparse's usage error (exit 2),
    and an option left at its default passes whatever the rule says."""
    parser = argparse.ArgumentParser(prog="script")
    parser.add_argument("--hubs", type=int, default=0)
    parser.add_argument("--model", default="gcn")
    rules = [(("hubs",), False, "to --model hsa")]
    cli.refuse_inapplicable(parser, ["--model", "gat"], rules)
    with pytest.raises(SystemExit) as stop:
        cli.refuse_inapplicable(parser, ["--hubs", "0"], rules)
    assert stop.value.code == 2
    assert "script: error: --hubs applies to --model hsa only" in capsys.readouterr().err
    cli.refuse_inapplicable(parser, ["--hubs", "3"], [(("hubs",), True, "to --model hsa")])


def test_bounded_ints_and_positive_budgets(cli):
    assert cli.at_least(2)("2") == 2 and cli.at_least(0, at_most=3)("3") == 3
    for parse, text in ((cli.at_least(2), "1"), (cli.at_least(0, at_most=3), "4")):
        with pytest.raises(argparse.ArgumentTypeError, match="must be an int >= "):
            parse(text)
    assert cli.above(0)("0.5") == 0.5 and cli.not_below(0)("0") == 0.0
    for text in ("0", "-1", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number > 0"):
            cli.above(0)(text)
    for text in ("-1e-9", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number >= 0"):
            cli.not_below(0)(text)
    assert cli.PROBABILITY("0") == 0.0 and cli.PROBABILITY("1") == 1.0
    for text in ("1.5", "-0.1", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be a probability in \[0, 1\]"):
            cli.PROBABILITY(text)
    assert cli.SEED("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        cli.SEED("-1")  # np.random.seed refuses it (after the data was loaded)


def test_output_folders_are_checked_when_parsed(cli, tmp_path):
    """(A file in a cache folder's place ended hierarchical_lm.py in a FileExistsError
    traceback, after the models were built.)"""
    (tmp_path / "file").write_text("")
    assert cli.output_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    for blocked in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(argparse.ArgumentTypeError, match="file is a file"):
            cli.output_folder(str(blocked))


def test_output_files_are_checked_when_parsed(cli, tmp_path):
    """An output the script could not write is refused up front; folders missing below an
    existing one are fine (the scripts make them when they write)."""
    (tmp_path / "file").write_text("")
    assert cli.output_file(str(tmp_path / "new" / "deeper" / "out.json")).endswith("out.json")
    assert cli.output_file(str(tmp_path / "file")) == str(tmp_path / "file")  # overwritten
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder, not a file"):
        cli.output_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="file is a file, not a folder"):
        cli.output_file(str(tmp_path / "file" / "sub" / "out.json"))
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(argparse.ArgumentTypeError, match="permission denied"):
            cli.output_file(str(locked / "out.json"))
    (tmp_path / "table.json").write_text(json.dumps({"row": 1}))
    (tmp_path / "list.json").write_text("[]")
    assert cli.json_to_merge(str(tmp_path / "table.json")).endswith("table.json")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a JSON file"):
        cli.json_to_merge(str(tmp_path / "file"))
    with pytest.raises(argparse.ArgumentTypeError, match="no JSON object"):
        cli.json_to_merge(str(tmp_path / "list.json"))


def test_run_reports_refused_options_and_keeps_bugs_loud(cli):
    """A ValueError raised while building from the options (:func:`from_options`) or an
    :class:`OptionError` ends a script with ``error: <message>`` and exit status 1; any
    other ValueError, and other errors inside the block, keep their traceback."""

    def build():
        with cli.from_options():
            raise ValueError("heads=3 must divide channels=128")

    with pytest.raises(cli.OptionError) as refused:  # a ValueError to code that calls it
        build()
    assert isinstance(refused.value, ValueError)
    with pytest.raises(SystemExit) as stop:
        cli.run(build)
    assert stop.value.code == "error: heads=3 must divide channels=128"
    assert stop.value.__suppress_context__

    @cli.from_options()  # also a decorator
    def decorated():
        raise ValueError("no")

    with pytest.raises(cli.OptionError):
        decorated()

    def bug():
        raise ValueError("a bug")

    def wrong_type():
        with cli.from_options():
            raise TypeError("also a bug")

    for failing in (bug, wrong_type):
        with pytest.raises((ValueError, TypeError)) as error:
            cli.run(failing)
        assert not isinstance(error.value, cli.OptionError)


def test_under_torchrun_only_rank_zero_prints_the_error(cli, monkeypatch):
    """(Every process printed the same message.)"""

    def refused():
        raise cli.OptionError("--resume: the checkpoint holds another model")

    for rank, code in (("0", "error: --resume: the checkpoint holds another model"), ("3", 1)):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stop:
            cli.run(refused)
        assert stop.value.code == code


#: ``(script, argv, message)``: values the scripts accepted and then crashed on, looped on
#: or reported nonsense for (after a long run, often); now refused when parsed (exit 2)
REFUSED = [
    ("vcc_long_qa", "--length 1", "--length: must be an int >= 2"),
    ("vcc_long_qa", "--keys 0", "--keys: must be an int >= 1"),
    ("vcc_long_qa", "--values 0", "--values: must be an int >= 1"),
    ("vcc_long_qa", "--fillers 0", "--fillers: must be an int >= 1"),
    ("vcc_long_qa", "--distractors -1", "--distractors: must be an int >= 0"),
    ("vcc_long_qa", "--dim 0", "--dim: must be an int >= 2"),
    ("vcc_long_qa", "--dim 63", "--dim must be even"),
    ("vcc_long_qa", "--heads 0", "--heads: must be an int >= 1"),
    ("vcc_long_qa", "--layers 0", "--layers: must be an int >= 1"),
    ("vcc_long_qa", "--local-layers -1", "--local-layers: must be an int >= 0"),
    ("vcc_long_qa", "--local-size 0", "--local-size: must be an int >= 1"),
    ("vcc_long_qa", "--block-size 1", "--block-size: must be an int >= 2"),
    ("vcc_long_qa", "--refined -1", "--refined: must be an int >= 0"),
    ("vcc_long_qa", "--eval-batches 0", "--eval-batches: must be an int >= 1"),
    ("vcc_long_qa", "--min-length 0", "--min-length: must be an int >= 1"),  # looped forever
    ("vcc_long_qa", "--min-length 2", "curriculum starts at 2 tokens"),
    ("vcc_long_qa", "--budget 0", "--budget: must be a finite number > 0"),
    ("hierarchical_lm", "--seq-len 1", "--seq-len: must be an int >= 2"),
    ("hierarchical_lm", "--channels 0", "--channels: must be an int >= 1"),
    ("hierarchical_lm", "--layers 0", "--layers: must be an int >= 1"),
    ("hierarchical_lm", "--heads 0", "--heads: must be an int >= 1"),
    ("hierarchical_lm", "--train-reviews 0", "--train-reviews: must be an int >= 1"),
    ("hierarchical_lm", "--eval-chunks 0", "--eval-chunks: must be an int >= 1"),
    ("hierarchical_lm", "--sample-bytes -1", "--sample-bytes: must be an int >= 0"),
    ("hierarchical_lm", "--cpu-seconds 0", "--cpu-seconds: must be a finite number > 0"),
    ("hierarchical_lm", "--out curves.png", "the PNG of the curves is written next to it"),
    ("zeroshot_minilm", "--hubs -1", "--hubs: must be an int >= 0"),
    ("zeroshot_minilm", "--max-tokens 1", "--max-tokens: must be an int >= 2 and <= 512"),
    ("zeroshot_minilm", "--max-tokens 513", "--max-tokens: must be an int >= 2 and <= 512"),
    ("zeroshot_minilm", "--branching 1,4", "--branching: must be comma-separated window sizes"),
    ("ddp_train", "--hidden 0", "--hidden: must be an int >= 1"),
    ("ddp_train", "--layers 0", "--layers: must be an int >= 1"),
    ("ddp_train", "--heads 0", "--heads: must be an int >= 1"),
    ("ddp_train", "--num-trees 3", "--num-trees: must be an int >= 4"),  # no test tree
    ("ddp_train", "--tree-leaves 15", "--tree-leaves: must be an int >= 16"),  # made 16
    ("ddp_train", "--classes 9", "--classes: must be an int >= 2 and <= 8"),
    ("ddp_train", "--leaf-budget -1", "--leaf-budget: must be an int >= 0"),
    ("ddp_train", "--task node --layers 3", "--layers applies to --task hte only"),
    ("ddp_train", "--raw-dir x", "--raw-dir applies to --task node only"),
    ("listops", "--budget-seconds 0", "--budget-seconds: must be a finite number > 0"),
    ("listops", "--quick --batch-size 1001", "--batch-size 1001 is more than --train-size"),
    ("document_classification", "--hidden 0", "--hidden: must be an int >= 1"),
    ("document_classification", "--proj -1", "--proj: must be an int >= 0"),
    ("document_classification", "--train-size -1", "--train-size: must be an int >= 0"),
    ("document_classification", "--max-tokens 0", "--max-tokens: must be an int >= 1"),
    ("document_classification", "--seeds 0 -1", "--seeds: must be an int >= 0"),
    ("multimodal_classification", "--patch-size 0", "--patch-size: must be an int >= 1"),
    ("multimodal_classification", "--image-size 30", "--image-size 30 is no multiple of"),
    ("multimodal_classification", "--image-stem conv --patch-size 5 --image-size 30",
     "--image-stem conv needs an even --patch-size"),
    ("multimodal_classification", "--max-per-group -1", "--max-per-group: must be an int >= 0"),
    ("multimodal_classification", "--seeds -1", "--seeds: must be an int >= 0"),
    ("node_classification", "--model gcn --hidden 0", "--hidden: must be an int >= 1"),
    ("node_classification", "--max-family 1", "--max-family: must be an int >= 2"),
    ("node_classification", "--pe-dim -1", "--pe-dim: must be an int >= 0"),
    ("node_classification", "--model gps_full --heads 3", "--heads 3 must divide --hidden 64"),
    ("cora_cone_gat", "--qk-channels 0", "--qk-channels: must be an int >= 1"),
    ("cora_cone_gat", "--height-scale e", "--height-scale: must be a number or 'd'"),
    # cone options with no cone attention to take them (they were ignored)
    ("cora_cone_gat", "--attention gat dot --gamma 7", "--gamma applies to cone attention"),
    ("cora_cone_gat", "--attention umbral --squared", "--squared applies to penumbral"),
    ("cora_cone_gat", "--height-scale d", "--height-scale applies to umbral attention"),
    ("ppi_cone_gat", "--hidden 0", "--hidden: must be an int >= 1"),
    ("masked_attention", "--p -1", "--p: must be an int >= 0"),
    # learning rates, weight decays and dropouts: refused by torch after the data loaded
    *((script, "--lr 0", "--lr: must be a finite number > 0") for script in (
        "vcc_long_qa", "hierarchical_lm", "ddp_train", "listops", "document_classification",
        "multimodal_classification", "node_classification", "cora_cone_gat", "ppi_cone_gat",
        "masked_attention")),
    ("document_classification", "--weight-decay -0.1", "--weight-decay: must be a finite"),
    ("multimodal_classification", "--dropout 1.5", "--dropout: must be a probability in [0, 1]"),
    ("node_classification", "--hsa-dropout nan", "--hsa-dropout: must be a probability"),
    ("cora_cone_gat", "--feature-dropout 1.5", "--feature-dropout: must be a probability"),
    # seeds past 2**64 overflowed in torch.manual_seed after the data loaded; seed + 1 too
    *((script, "--seed 18446744073709551616", "--seed: must be an int >= 0 and <= 4294967295")
      for script in ("vcc_long_qa", "hierarchical_lm", "ddp_train", "listops", "masked_attention")),
    ("node_classification", "--seeds -1", "--seeds: must be an int >= 0"),
    ("cora_cone_gat", "--first-seed -1", "--first-seed: must be an int >= 0"),
]  # fmt: skip


@pytest.mark.parametrize(("script", "argv", "message"), REFUSED)
def test_impossible_values_are_refused_when_parsed(load_example, capsys, script, argv, message):
    module = load_example(script)
    with pytest.raises(SystemExit) as stop:
        (getattr(module, "parse_args", None) or module.main)(argv.split())
    assert stop.value.code == 2 and message in capsys.readouterr().err


OUTPUTS = [
    ("listops", "--out"),
    ("vcc_long_qa", "--json"),
    ("hierarchical_lm", "--out"),
    ("document_classification", "--json"),
    ("multimodal_classification", "--json"),
    ("multimodal_classification", "--plot"),
    ("node_classification", "--json"),
    ("cora_cone_gat", "--json"),
    ("ddp_train", "--checkpoint"),
]


@pytest.mark.parametrize(("script", "option"), OUTPUTS)
def test_outputs_that_cannot_be_written_are_refused_before_the_run(
    load_example, capsys, tmp_path, script, option
):
    """They failed when written, after the training."""
    module = load_example(script)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        (getattr(module, "parse_args", None) or module.main)([option, f"{tmp_path}/file/out"])
    assert stop.value.code == 2
    assert f"argument {option}: cannot write" in capsys.readouterr().err


def test_run_by_hand_it_says_it_is_no_script():
    """``python examples/_cli.py --help`` (as one tries every file of the folder) ended with
    status 0 and no output."""
    import runpy

    with pytest.raises(SystemExit, match="runs nothing itself; run one of the scripts beside"):
        runpy.run_path(str(EXAMPLES / "_cli.py"), run_name="__main__")
