import runpy

import pytest

from hiergraph import info
from hiergraph.ops.hsa import native, triton_uniform


def test_every_entry_is_a_named_string():
    entries = info.environment()
    assert list(entries)[:8] == [
        "hiergraph", "python", "platform", "torch", "torch_geometric", "cuda",
        "native kernels", "triton kernels",
    ]  # fmt: skip
    assert set(info.OPTIONAL) <= set(entries)
    assert all(isinstance(v, str) and v for v in entries.values())


@pytest.mark.parametrize(
    "state, compiler, says",
    [
        ("off", None, "off (HIERGRAPH_NATIVE=0): HSA on the CPU runs PyTorch operations"),
        ("failed", None, "the build failed: HSA on the CPU runs PyTorch operations"),
        ("not built", "/usr/bin/c++", "not built: compiles on the first CPU call that takes "
         "them (with /usr/bin/c++)"),
        ("not built", None, "not built: compiles on the first CPU call that takes them (but "
         "no C++ compiler was found)"),
        ("built", None, "built: load on first use"),
        ("loaded", None, "loaded"),
    ],
)  # fmt: skip
def test_native_kernels_entry(monkeypatch, state, compiler, says):
    monkeypatch.setattr(native, "state", lambda: state)
    asked = []
    monkeypatch.setattr(info.shutil, "which", lambda name: asked.append(name) or compiler)
    monkeypatch.setenv("CXX", "my-c++")
    assert info.environment()["native kernels"] == says
    assert asked == (["my-c++"] if state == "not built" else [])  # PyTorch's compiler


@pytest.mark.parametrize("installed, on", [(False, False), (True, False), (True, True)])
def test_triton_kernels_entry(monkeypatch, installed, on):
    monkeypatch.setattr(triton_uniform, "available", lambda: installed)
    monkeypatch.setattr(triton_uniform, "_enabled", on)
    off = "off (HIERGRAPH_TRITON=1 turns them on)"
    want = f"installed; HSA kernels {'on' if on else off}" if installed else "not installed"
    assert info.environment()["triton kernels"] == want


def test_python_m_hiergraph_prints_every_entry(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["hiergraph"])
    runpy.run_module("hiergraph", run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    entries = info.environment()
    assert len(lines) == len(entries)
    for line, (name, value) in zip(lines, entries.items(), strict=True):
        assert line.startswith(name + "  ") and line.endswith(value)


def test_build_compiles_the_kernels(monkeypatch, capsys):
    built = []
    monkeypatch.setattr(native, "extension", lambda: built.append(1))
    monkeypatch.setattr(native, "state", lambda: "loaded")
    info.main(["--build"])
    lines = capsys.readouterr().out.splitlines()
    assert built == [1] and [x for x in lines if x.startswith("native kernels")][0].endswith(
        "  loaded"
    )


def test_build_that_fails_exits_with_1(monkeypatch):
    monkeypatch.setattr(native, "extension", lambda: None)
    monkeypatch.setattr(native, "state", lambda: "failed")
    with pytest.raises(SystemExit) as exit_:
        info.main(["--build"])
    assert exit_.value.code == 1


def test_build_refused_when_the_kernels_are_off(monkeypatch, capsys):
    monkeypatch.setattr(native, "_enabled", False)
    with pytest.raises(SystemExit) as exit_:
        info.main(["--build"])
    assert exit_.value.code == 2 and "turned off (HIERGRAPH_NATIVE=0)" in capsys.readouterr().err
