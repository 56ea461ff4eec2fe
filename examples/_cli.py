"""Command-line pieces shared by the example scripts (imported from the script's folder)."""

from __future__ import annotations

import argparse

import torch

from hiergraph.runtime import default_threads

IDLE_CORES = "torch CPU threads (default: at most 2, and no more than the idle cores)"


def add_threads_option(parser: argparse.ArgumentParser, help: str = IDLE_CORES) -> None:
    """``--threads N``: torch's CPU threads, ``None`` when not given (see :func:`set_threads`)."""
    parser.add_argument("--threads", type=int, default=None, help=help)


def set_threads(args: argparse.Namespace, default: int | None = None) -> int:
    """Run torch on ``args.threads`` CPU threads; when not given (or 0), on ``default``, or
    without one on :func:`hiergraph.runtime.default_threads` (at most 2, and no more than
    the idle cores). The count is stored back in ``args.threads`` and returned."""
    args.threads = args.threads or default or default_threads()
    torch.set_num_threads(args.threads)
    return args.threads
