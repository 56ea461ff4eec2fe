"""``examples/_cli.py``: the ``--threads`` and ``--device`` options the example scripts share,
and ``run``, which reports missing data without a traceback."""

import argparse

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
    assert "raw_dir= is its --raw-dir option where it has one" in str(stop.value.code)
    assert "HIERGRAPH_RAW works for every script" in str(stop.value.code)


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
