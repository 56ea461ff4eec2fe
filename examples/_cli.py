"""Command-line pieces shared by the example scripts (imported from the script's folder):
their parser (:func:`example_parser`: the script's docstring and the options' defaults in
``--help``), ``--threads`` and ``--device`` (:func:`add_runtime_options`), argument types
that refuse impossible counts, budgets and output files when the options are parsed
(:func:`at_least`, :func:`above`, :func:`output_file`, :func:`json_to_merge`), options
refused where they do not apply (:func:`refuse_inapplicable`), option values refused later
(:class:`OptionError`, :func:`from_options`), and :func:`run`, which reports missing data
and refused options without a traceback."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from hiergraph.runtime import default_threads

IDLE_CORES = "torch CPU threads (default: at most 2, and no more than the idle cores)"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring as written, and each option's default where it has one (not ``None``,
    which a script's budget fills, and not where the help already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False
        shown = unset or action.default is argparse.SUPPRESS or "default" in text
        return text if shown or not action.option_strings else f"{text} (default: %(default)s)"


def example_parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser: ``--help`` prints its docstring ``doc`` (the first paragraph as the
    description, the rest, budgets, data and run times, after the options) and the
    options' defaults."""
    first, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest, formatter_class=_HelpFormatter)


def at_least(minimum: int, at_most: int | None = None):
    """An argparse ``type``: an int ``>= minimum`` (and ``<= at_most`` where given; else
    argparse's one-line usage error)."""
    bounds = f">= {minimum}" + ("" if at_most is None else f" and <= {at_most}")

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or at_most is not None and value > at_most:
            raise argparse.ArgumentTypeError(f"must be an int {bounds}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


#: An argparse ``type``: a seed, 0 .. 2**32 - 1: what NumPy takes (``np.random.seed``), and
#: PyTorch with room for the scripts' derived seeds (``seed + 1``).
SEED = at_least(0, at_most=2**32 - 1)


def _float_type(accepts: Callable[[float], bool], wanted: str):
    """An argparse ``type``: a float that ``accepts`` (NaN never is: every comparison with
    it is false), else argparse's one-line usage error saying it ``must be <wanted>``."""

    def parse(text: str) -> float:
        value = float(text)
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    parse.__name__ = "float"  # argparse names the type in its messages
    return parse


def above(minimum: float):
    """An argparse ``type``: a finite float ``> minimum``, e.g. ``above(0)`` for a time
    budget."""
    return _float_type(lambda x: minimum < x < math.inf, f"a finite number > {minimum:g}")


def not_below(minimum: float):
    """An argparse ``type``: a finite float ``>= minimum``, e.g. ``not_below(0)`` for a
    weight decay."""
    return _float_type(lambda x: minimum <= x < math.inf, f"a finite number >= {minimum:g}")


#: An argparse ``type``: a learning rate, a finite float ``> 0``.
LEARNING_RATE = above(0)

#: An argparse ``type``: a dropout probability, a float in ``[0, 1]`` (torch's range).
PROBABILITY = _float_type(lambda x: 0 <= x <= 1, "a probability in [0, 1]")


def output_file(text: str) -> str:
    """An argparse ``type`` for a file the script writes (results, a plot, a checkpoint),
    checked when the options are parsed rather than when the file is written, after the
    long run: the path is no folder, its nearest existing ancestor is a folder this process
    may write in (the folders missing below it are made when the file is written), and an
    existing file is writable; else argparse's one-line usage error. Returns ``text``
    unchanged."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    folder = next(p for p in path.absolute().parents if p.exists())
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return text


def output_folder(text: str) -> Path:
    """An argparse ``type`` for a folder the script writes into (a cache), checked when the
    options are parsed: no file is in its place or in the place of a folder above it; else
    argparse's one-line usage error."""
    path = Path(text).expanduser()
    blocking = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make the folder {text}: {blocking} is a file")
    return path


def json_to_merge(text: str) -> str:
    """An argparse ``type`` for a JSON file the script merges its results into: an
    :func:`output_file` that, where it exists, holds a JSON object (checked now, not when
    the first results are merged in). Returns ``text`` unchanged."""
    path = Path(output_file(text))
    if path.exists():
        try:
            table = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise argparse.ArgumentTypeError(f"{text} is not a JSON file: {error}") from None
        except OSError as error:  # (unreadable)
            raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror}") from None
        if not isinstance(table, dict):
            raise argparse.ArgumentTypeError(f"{text} holds no JSON object to merge into")
    return text


#: The encoder sizes the document and record classifiers share, named as their options and
#: keyword arguments (:func:`options_named`).
ENCODER_OPTIONS = ("hidden", "heads", "pos_channels", "mlp", "layers", "dropout")


def options_named(args: argparse.Namespace, names: Iterable[str]) -> dict:
    """``{name: args.<name>}`` for ``names``: options passed on under their own names."""
    return {name: getattr(args, name) for name in names}


def add_threads_option(parser: argparse.ArgumentParser, help: str = IDLE_CORES) -> None:
    """``--threads N``: torch's CPU threads, ``None`` when not given (see :func:`set_threads`;
    0 also takes the default)."""
    parser.add_argument("--threads", type=at_least(0), default=None, help=help)


def set_threads(args: argparse.Namespace, default: int | None = None) -> int:
    """Run torch on ``args.threads`` CPU threads; when not given (or 0), on ``default``, or
    without one on :func:`hiergraph.runtime.default_threads` (at most 2, and no more than
    the idle cores). The count is stored back in ``args.threads`` and returned."""
    args.threads = args.threads or default or default_threads()
    torch.set_num_threads(args.threads)
    return args.threads


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device NAME``: where the model and the data live (see :func:`get_device`)."""
    parser.add_argument(
        "--device", default=None, help="torch device: cpu, cuda, cuda:1 … (default: cuda if any)"
    )


def add_runtime_options(parser: argparse.ArgumentParser, threads_help: str = IDLE_CORES) -> None:
    """``--threads`` and ``--device`` (:func:`add_threads_option`, :func:`add_device_option`),
    which every script that trains or runs a model takes."""
    add_threads_option(parser, help=threads_help)
    add_device_option(parser)


def get_device(args: argparse.Namespace) -> torch.device:
    """``args.device`` as a :class:`torch.device` (default: ``cuda`` when a CUDA device is
    present, else ``cpu``), stored back in ``args.device`` as its name. A name torch does not
    know, or a CUDA device this machine lacks, stops the script with a one-line message."""
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise SystemExit(f"--device {name!r}: {error}") from None
    count = torch.cuda.device_count()
    if device.type == "cuda" and (device.index or 0) >= count:
        raise SystemExit(f"--device {name!r}: this machine has {count} CUDA device(s)")
    args.device = str(device)
    return device


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> set[str]:
    """The ``dest`` of every option written on the command line ``argv`` (default: the
    script's own), whatever its value: parsed once more into a namespace whose every
    attribute is preset, which argparse then leaves alone unless the option is given."""
    unset = object()
    blank = argparse.Namespace(**{action.dest: unset for action in parser._actions})
    parsed = parser.parse_args(argv, namespace=blank)
    return {dest for dest, value in vars(parsed).items() if value is not unset}


def refuse_inapplicable(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    rules: Iterable[tuple[Iterable[str], bool, str]],
) -> None:
    """Stop with argparse's usage error when an option given on the command line would be
    ignored: ``rules`` are ``(dests, applies, where)``, and an option of ``dests`` given
    while ``applies`` is false is refused as applying ``where`` only."""
    given = given_options(parser, argv)
    for dests, applies, where in rules:
        for dest in dests:
            if dest in given and not applies:
                parser.error(f"--{dest.replace('_', '-')} applies {where} only")


class OptionError(ValueError):
    """A value given on the command line that the script refuses once it can tell: after
    reading a file or the data (``--resume-from`` naming a run of other settings, a subset
    size that leaves a split empty), or when the library refuses a size while the script
    builds from the options (:func:`from_options`). :func:`run` ends the script with its
    message; being a ``ValueError``, it is caught as such by code that calls a script's
    functions."""


@contextmanager
def from_options() -> Iterator[None]:
    """Around code that builds the library's objects (models, mostly) from the options: a
    ``ValueError`` raised inside is the library refusing the user's values (heads that do
    not divide the width, an odd block size …) and is raised again as an
    :class:`OptionError` with its message. Keep such blocks to construction, ahead of the
    long run: a ``ValueError`` raised anywhere else (while training, say) is a bug and
    keeps its traceback. Also a decorator: ``@from_options()``."""
    try:
        yield
    except OptionError:
        raise
    except ValueError as error:
        raise OptionError(str(error)) from error


def run(main: Callable[[], object]) -> None:
    """Run a script's ``main``, ending the script with ``error: <message>`` and exit
    status 1, not a traceback, where the user has something to fix: data that is missing
    (the loaders' ``FileNotFoundError``, whose message says where the files were searched
    and how to supply them; their Python argument ``raw_dir=`` is every such script's
    ``--raw-dir``) or an option refused past parsing (:class:`OptionError`). Under
    ``torchrun`` only rank 0 prints the message (the other ranks end with status 1 alone).
    Every other exception keeps its traceback."""
    try:
        main()
    except FileNotFoundError as error:
        message = str(error)
        if "raw_dir=" in message:  # the loaders' Python argument: say what a script takes
            message += "\n(From a script: raw_dir= is its --raw-dir option.)"
        raise _stop(message) from None
    except OptionError as error:
        raise _stop(str(error)) from None


def _stop(message: str) -> SystemExit:
    """The exit of :func:`run`: ``error: <message>`` on rank 0 (or without ``torchrun``),
    a silent status 1 on the other ranks (one message, not one per process)."""
    return SystemExit(f"error: {message}" if os.environ.get("RANK", "0") == "0" else 1)


if __name__ == "__main__":  # (run by hand, it parsed nothing and printed nothing)
    raise SystemExit(
        "error: _cli.py holds the pieces the example scripts share and runs nothing itself; "
        "run one of the scripts beside it (each takes --help)"
    )
