"""Bad inputs end with one line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from pasa_npu.tools.compare.cli import main


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Commands run without --out write under the working directory: make it tmp_path."""
    monkeypatch.chdir(tmp_path)


def _fails(argv, capsys, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("pasa-compare: error: "), err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]


@pytest.fixture
def qkv_file(tmp_path):
    q = torch.randn(1, 2, 16, 8).half()
    torch.save({"q": q, "k": q.clone(), "v": q.clone()}, tmp_path / "ok.pt")
    return str(tmp_path / "ok.pt")


def test_missing_file(tmp_path, capsys):
    _fails(["file", str(tmp_path / "nope.pt")], capsys, "input file not found", "nope.pt")


def test_mismatched_shapes(tmp_path, capsys):
    q = torch.randn(1, 2, 16, 8).half()
    torch.save({"q": q, "k": torch.randn(1, 2, 16, 4).half(), "v": q}, tmp_path / "a.pt")
    _fails(["file", str(tmp_path / "a.pt")], capsys, "head dim 4", "head dim 8")
    torch.save({"q": q, "k": q, "v": torch.randn(1, 2, 15, 8).half()}, tmp_path / "b.pt")
    _fails(["file", str(tmp_path / "b.pt")], capsys, "value (batch, heads, seq) (1, 2, 15)")
    np.save(tmp_path / "q.npy", np.zeros((1, 3, 16, 8), np.float16))
    np.save(tmp_path / "k.npy", np.zeros((1, 2, 16, 8), np.float16))
    _fails(["file", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), str(tmp_path / "k.npy")],
           capsys, "query heads 3", "key/value heads 2")


def test_wrong_layout_and_missing_tensor(tmp_path, qkv_file, capsys):
    _fails(["file", qkv_file, "--layout", "BSH"], capsys, "3-D for layout BSH", "(1, 2, 16, 8)")
    _fails(["file", qkv_file, "--layout", "XYZ"], capsys, "--layout must be one of")
    torch.save({"q": torch.zeros(2), "key": torch.zeros(2)}, tmp_path / "c.pt")
    _fails(["file", str(tmp_path / "c.pt")], capsys, "no tensor named v or value", "found: key, q")
    (tmp_path / "d.txt").write_text("x")
    _fails(["file", str(tmp_path / "d.txt")], capsys, "unsupported file type .txt")
    (tmp_path / "e.pt").write_text("not a pickle")
    _fails(["file", str(tmp_path / "e.pt")], capsys, "cannot read it as .pt")


def test_unknown_allocation_backend_baseline(qkv_file, capsys):
    _fails(["file", qkv_file, "--allocations", "pasa-turbo"], capsys,
           "unknown allocation 'pasa-turbo'", "fa-fp32")
    _fails(["file", qkv_file, "--backends", "cuda-magic"], capsys, "unknown backend 'cuda-magic'")
    _fails(["file", qkv_file, "--third-party", "flash9"], capsys, "unknown third-party")
    _fails(["file", qkv_file, "--baseline", "npu-ip1"], capsys, "--baseline npu-ip1")
    _fails(["sweep", "--sweeps", "gaussian"], capsys, "unknown sweep 'gaussian'")
    _fails(["sweep", "--heads", "0"], capsys, "--heads must be >= 1")
    _fails(["sweep", "--dtype", "fp8"], capsys, "dtype must be one of fp16, bf16")
    _fails(["bias", "--ties", "1"], capsys, "--ties must be >= 2")
    _fails(["bias", "--allocations", "nope"], capsys, "unknown allocation 'nope'")


def test_backend_not_available_here(qkv_file, capsys):
    from pasa_npu.backends import available_backends
    missing = [b for b in ("triton", "ascendc-emu", "npu") if b not in available_backends("cpu", emulated=True)]
    if not missing:
        pytest.skip("every planned backend is available on CPU here")
    _fails(["file", qkv_file, "--backends", missing[0]], capsys, f"backend '{missing[0]}'",
           "not available on cpu")


def test_console_script_exits_cleanly(tmp_path):
    """The installed entry point: one line, exit 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "pasa_npu.tools.compare.cli", "file",
                           str(tmp_path / "missing.npz")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"pasa-compare: error: input file not found: " \
                                  f"{tmp_path / 'missing.npz'}"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_an_array_in_place_of_a_path_or_tensor_is_described_not_printed():
    """Arrays are named by type, shape and dtype; their values never reach the message."""
    from pasa_npu.tools.compare import Item, file_item
    from pasa_npu.tools.compare.errors import CompareError
    big = np.full((1, 2, 300, 8), 0.123, np.float16)
    described = "a numpy.ndarray of shape (1, 2, 300, 8) and dtype float16"
    for call in (lambda: file_item([big]), lambda: file_item([big, big, big]),
                 lambda: file_item(big), lambda: Item("x", big, big, big, 0.5),
                 lambda: Item("x", torch.zeros(1), torch.zeros(1), big, 0.5)):
        with pytest.raises(CompareError) as err:
            call()
        message = str(err.value)
        assert described in message and "0.123" not in message and len(message) < 200, message
    with pytest.raises(CompareError, match=r"mask must be a torch.Tensor, got \[\[True\]\]$"):
        Item("x", torch.zeros(1), torch.zeros(1), torch.zeros(1), 0.5, mask=[[True]])


def test_unusable_device_and_scale(qkv_file, capsys):
    if not torch.cuda.is_available():
        _fails(["file", qkv_file, "--device", "cuda"], capsys, "--device must be a device this "
               "torch can run on, got 'cuda': ", "CUDA")
    _fails(["file", qkv_file, "--device", "gpu0"], capsys, "--device", "got 'gpu0'")
    _fails(["file", qkv_file, "--scale", "-1"], capsys, "--scale must be finite and > 0, got -1")
    _fails(["file", qkv_file, "--scale", "0"], capsys, "--scale must be finite and > 0, got 0")


def test_files_that_are_not_arrays_never_suggest_pickle(tmp_path, capsys):
    (tmp_path / "text.npz").write_text("q k v")
    err = _fails(["file", str(tmp_path / "text.npz")], capsys,
                 f"{tmp_path / 'text.npz'}: not a valid .npz archive")
    np.savez(tmp_path / "objects.npz", q=np.array([{"a": 1}], dtype=object))
    err += _fails(["file", str(tmp_path / "objects.npz")], capsys, "objects.npz: not a valid "
                  ".npz archive of numeric arrays: it holds Python objects")
    (tmp_path / "text.npy").write_text("q")
    err += _fails(["file"] + [str(tmp_path / "text.npy")] * 3, capsys,
                  "text.npy: not a valid .npy file")
    (tmp_path / "text.pt").write_text("q")
    err += _fails(["file", str(tmp_path / "text.pt")], capsys, "text.pt: cannot read it as .pt")
    assert "pickle" not in err.lower() and "weights_only" not in err


def test_failed_commands_leave_no_output_folder(tmp_path, qkv_file, capsys):
    """Nothing to write, nothing created: neither the default folder nor --out."""
    _fails(["bias", "--allocations", "nope"], capsys, "unknown allocation 'nope'")
    _fails(["file", qkv_file, "--allocations", "nope"], capsys, "unknown allocation 'nope'")
    _fails(["file", qkv_file, "--allocations", "nope", "--out", "a/b"], capsys, "unknown")
    _fails(["bias", "--allocations", "nope", "--out", "c"], capsys, "unknown allocation")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pt"]
    (tmp_path / "file").write_text("")
    _fails(["file", qkv_file, "--out", "file/x"], capsys, "--out file/x: cannot create it")
