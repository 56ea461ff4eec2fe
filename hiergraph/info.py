r"""What this install runs on: versions, devices and which fast paths the ops can take.

``python -m hiergraph`` prints it (paste it into a bug report); ``python -m hiergraph
--build`` also compiles the CPU kernels of HSA now, instead of in the first CPU call that
takes them (about a minute, once per install and machine)::

    $ python -m hiergraph
    hiergraph       0.1.0
    python          3.11.7
    torch           2.13.0+cpu (CPU: AVX2, 2 threads)
    ...
    native kernels  built: load on first use

Each line is one entry of :func:`environment`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
import sys

import torch
from torch.utils.cpp_extension import get_cxx_compiler

from hiergraph.ops.hsa import native, triton_uniform

#: The optional packages the library uses where they are installed (Triton: its own entry).
OPTIONAL = ("torch_scatter", "torch_sparse", "ogb", "transformers", "networkx")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _optional(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    return _version(module.replace("_", "-")) or "installed"


def _cuda() -> str:
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return f"not available (torch built with CUDA {built})" if built else "not in this torch"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{torch.version.cuda}: " + ", ".join(names)


def _native() -> str:
    state = native.state()
    if state == "off":
        return f"off ({native.ENV}=0): HSA on the CPU runs PyTorch operations"
    if state == "failed":
        return "the build failed: HSA on the CPU runs PyTorch operations"
    if state == "not built":
        compiler = shutil.which(get_cxx_compiler())  # PyTorch's: $CXX, else c++
        where = f"with {compiler}" if compiler else "but no C++ compiler was found"
        return f"not built: compiles on the first CPU call that takes them ({where})"
    return {"built": "built: load on first use", "loaded": "loaded"}[state]


def _triton() -> str:
    if not triton_uniform.available():
        return "not installed"
    on = "on" if triton_uniform.enabled() else f"off ({triton_uniform.ENV}=1 turns them on)"
    return f"installed; HSA kernels {on}"


def environment() -> dict[str, str]:
    """The entries :mod:`hiergraph.info` prints, in order: name, value."""
    cpu = torch.backends.cpu.get_cpu_capability()
    info = {
        "hiergraph": _version("hiergraph") or "not installed (imported from a checkout)",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": f"{torch.__version__} (CPU: {cpu}, {torch.get_num_threads()} threads)",
        "torch_geometric": _version("torch-geometric") or "not installed",
        "cuda": _cuda(),
        "native kernels": _native(),
        "triton kernels": _triton(),
    }
    info.update({name: _optional(name) for name in OPTIONAL})
    return info


def main(argv: list[str] | None = None) -> None:
    """``python -m hiergraph [--build]`` (``argv``: its arguments; default: the command
    line's). Exits with 1 where ``--build`` could not build the kernels (the report says
    so), with 2 where they are turned off."""
    parser = argparse.ArgumentParser(prog="python -m hiergraph", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--build", action="store_true", help="compile the CPU kernels of HSA now (about a minute)"
    )
    args = parser.parse_args(argv)
    if args.build:
        if not native.enabled():
            parser.error(f"the CPU kernels are turned off ({native.ENV}=0)")
        native.extension()
    entries = environment()
    width = max(map(len, entries)) + 2
    for name, value in entries.items():
        print(f"{name:<{width}}{value}")
    if args.build and native.state() != "loaded":
        sys.exit(1)
