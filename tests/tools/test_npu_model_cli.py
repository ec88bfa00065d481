"""pasa-npu-model's command line: options are checked before any work, with a one-line error
naming the option; modes refuse the options they would ignore; --jobs stops at the cores here;
Ctrl-C ends with one line; the help shows each default once. No model runs here: every test
stubs the work out so that reaching it fails."""
from __future__ import annotations

import os
import pickle
import signal

import pytest

pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu.tools import npu_calibrate, npu_model, npu_sim  # noqa: E402


class Worked(AssertionError):
    """The tool reached its work."""


@pytest.fixture
def no_work(monkeypatch):
    """Every mode's work raises Worked."""
    def work(*args, **kwargs):
        raise Worked
    for module, name in ((npu_model, "run"), (npu_model, "sensitivity"), (npu_calibrate, "markdown"),
                         (npu_sim, "compare")):
        monkeypatch.setattr(module, name, work)


def _refused(argv, capsys) -> str:
    """The one-line error main(argv) exits with (status 2)."""
    with pytest.raises(SystemExit) as exit_:
        npu_model.main(argv + ["--quiet"])
    assert exit_.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_an_output_folder_that_cannot_be_one_is_refused_before_any_work(no_work, tmp_path, capsys):
    taken = tmp_path / "x.txt"
    taken.write_text("mine")
    assert _refused(["--out", str(taken)], capsys) == \
        f"pasa-npu-model: error: --out {taken}: expected a folder, got an existing file"
    assert f"--out {taken / 'sub'}: cannot create it: {taken} is a file" in _refused(["--out", str(taken / "sub")], capsys)
    assert taken.read_text() == "mine"


@pytest.mark.parametrize("where,message", [
    ("missing/c.pkl", "expected a file in an existing folder, got a path whose folder {tmp}/missing does not exist"),
    (".", "expected a file, got a folder"),
    ("x.txt", "expected a calibration cache pasa-npu-model wrote, got a file that is not one"),
    ("old.pkl", "expected a calibration cache pasa-npu-model wrote, got a file that is not one")])
def test_a_cache_that_cannot_be_one_is_refused_before_any_work(no_work, monkeypatch, tmp_path, capsys,
                                                               where, message):
    """A file that is not a cache (text; a bare pickle without the header) is refused from
    its first line, never unpickled."""
    (tmp_path / "x.txt").write_text("not a cache\n")
    (tmp_path / "old.pkl").write_bytes(pickle.dumps(dict(fingerprint=npu_model.calibration_fingerprint(), fits={})))
    monkeypatch.setattr(npu_model.pickle, "load", lambda *a: pytest.fail("unpickled"))
    path = os.path.join(str(tmp_path), where)
    err = _refused(["--sensitivity", "--cache", path, "--out", str(tmp_path / "out")], capsys)
    assert err.startswith(f"pasa-npu-model: error: --cache {path}: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "out").exists()


def test_a_cache_of_another_build_or_cut_short_is_refused(no_work, tmp_path, capsys):
    cache = str(tmp_path / "c.pkl")
    npu_model.save_calibrations(cache, {"key": "fit"}, "another build")
    assert "its calibrations were made by another build" in _refused(["--sensitivity", "--cache", cache], capsys)
    npu_model.save_calibrations(cache, {"key": "fit"}, npu_model.calibration_fingerprint())
    assert npu_model.load_calibrations(cache, npu_model.calibration_fingerprint()) == {"key": "fit"}
    with open(cache, "rb+") as f:
        f.truncate(os.path.getsize(cache) - 4)
    with pytest.raises(npu_model.CacheError, match="expected a whole cache file, got a damaged one"):
        npu_model.load_calibrations(cache, npu_model.calibration_fingerprint())


def test_the_fingerprint_reads_python_sources_by_their_code(tmp_path):
    """A docstring, comment or layout edit keeps a Python file's part of the calibration
    fingerprint; any edit of its code, and any edit of another file, changes it."""
    def code(text, name="m.py"):
        (tmp_path / name).write_text(text)
        return npu_model.code_of(tmp_path / name)

    base = code('"""Module."""\nX = 1\n\ndef f(a):\n    """Doc."""\n    return a + X\n')
    assert code('"""Other words."""\nX = 1  # why\n\n\ndef f(a):\n    """More."""\n\n'
                '    return (a + X)\n') == base
    for changed in ('X = 2\n\ndef f(a):\n    return a + X\n',
                    'X = 1\n\ndef f(a):\n    return a - X\n',
                    'X = 1\n\ndef f(a):\n    a = "not a docstring"\n    return a + X\n'):
        assert code(changed) != base, changed
    assert code("int k = 1; // note\n", "k.cpp") != code("int k = 1; // other\n", "k.cpp")


@pytest.mark.parametrize("argv,message", [
    (["--calibrate", "--sensitivity"], "argument --sensitivity: not allowed with argument --calibrate"),
    (["--sim", "--params"], "argument --params: not allowed with argument --sim"),
    (["--sim", "--sets", "decode", "--no-band"],
     "--sets, --no-band: not used by --sim, which takes --out, --algorithms, --quiet"),
    (["--sensitivity", "--algorithms", "pasa"],
     "--algorithms: not used by --sensitivity, which takes --out, --sets, --jobs, --cache, --quiet"),
    (["--calibrate", "--jobs", "2"], "--jobs: not used by --calibrate, which takes --out, --quiet"),
    (["--params", "--out", "x"], "--out: not used by --params, which takes --quiet"),
    (["--cache", "c.pkl"], "--cache: not used by the model run, which takes --out, --sets, --algorithms, "
                           "--no-band, --jobs, --quiet")])
def test_a_mode_refuses_the_options_it_would_ignore(no_work, capsys, argv, message):
    assert _refused(argv, capsys) == f"pasa-npu-model: error: {message}"


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_jobs_below_one_are_refused(no_work, capsys, text):
    assert _refused(["--jobs", text], capsys) == \
        f"pasa-npu-model: error: argument --jobs: expected a whole number of processes >= 1, got {text}"


def test_jobs_stop_at_the_cores_here(monkeypatch, tmp_path):
    got = {}

    def run(*args, jobs):
        got["jobs"] = jobs
        raise Worked
    monkeypatch.setattr(npu_model, "run", run)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with pytest.raises(Worked):
        npu_model.main(["--jobs", "1000", "--quiet", "--out", str(tmp_path / "out")])
    assert got["jobs"] == cores


def test_ctrl_c_ends_with_one_line_and_leaves_no_folder(monkeypatch, tmp_path, capsys):
    def run(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(npu_model, "run", run)
    out = tmp_path / "new" / "out"
    try:
        status = npu_model.main(["--quiet", "--out", str(out)])
    except KeyboardInterrupt:  # caught here, or it would end the test session
        pytest.fail("KeyboardInterrupt came out of main")
    assert status == 130
    assert capsys.readouterr().err == "pasa-npu-model: interrupted\n"
    assert not (tmp_path / "new").exists()


def test_calibration_workers_leave_ctrl_c_to_the_main_process():
    """The main process reports Ctrl-C once and ends the pool; a worker's own traceback would
    follow it for each worker."""
    pool = npu_model._calibration_pool(2)
    try:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
    finally:
        pool.terminate()


def test_help_shows_each_default_once_as_typed(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit):
        npu_model.main(["--help"])
    lines = {}  # each option's invocation and help, joined
    for line in capsys.readouterr().out.split("options:")[1].splitlines():
        if line.startswith("  -"):
            option = line.split()[0]
            lines[option] = line
        elif line.startswith("    "):
            lines[option] += line
    assert all(line.count("(default") <= 1 for line in lines.values()), lines
    assert "(default: paper sweep decode; with --sensitivity: readme)" in lines["--sets"]
    assert "(default: fa-fp32 pasa pasa-exact)" in lines["--algorithms"]
    assert "(default: npu-model-out)" in lines["--out"] and "(default: 1)" in lines["--jobs"]
