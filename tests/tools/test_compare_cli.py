"""``pasa-compare``'s command line: refused option combinations, failure reasons on stderr
and the exit status, help texts."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from pasa_npu.tools.compare import candidates as cand_mod
from pasa_npu.tools.compare import cli
from pasa_npu.tools.compare.cli import main


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Commands run without --out write under the working directory: make it tmp_path."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal((1, 2, 16, 8)).astype(np.float16) for n in "qkv"}
    np.savez(tmp_path / "qkv.npz", **arrays)
    return str(tmp_path / "qkv.npz")


def _fails(argv, capsys, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(err) == 1 and err[0].startswith("pasa-compare: error: "), err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]


QUIET = ["--quiet", "--no-plots", "--third-party"]


def test_a_scale_without_a_beta_solution_is_refused(npz, capsys):
    _fails(["file", npz, "--scale", "1e-30", "--allocations", "pasa"] + QUIET, capsys,
           "--scale 1e-30", "no solution", "leave pasa out of --allocations")
    _fails(["file", npz, "--scale", "1e-30", "--allocations", "pasa-mixed", "fa-fp16",
            "--beta0", "0.9"] + QUIET, capsys, "--scale 1e-30", "leave pasa-mixed out")
    assert main(["file", npz, "--scale", "1e-30", "--allocations", "fa-fp16"] + QUIET) == 0


def _fail_on(monkeypatch, allocation):
    """Candidates of ``allocation`` raise, as a backend that lacks it does."""
    run = cand_mod.Candidate.run

    def failing(self, item):
        if self.allocation == allocation:
            raise NotImplementedError(f"no {allocation} here\nsecond line")
        return run(self, item)
    monkeypatch.setattr(cand_mod.Candidate, "run", failing)


def test_failure_reasons_go_to_stderr_once(npz, capsys, monkeypatch):
    _fail_on(monkeypatch, "pasa-mixed")
    rc = main(["file", npz, "--allocations", "pasa-mixed", "fa-fp16", "--backends", "torch"]
              + QUIET)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0
    assert err == ["pasa-compare: pasa-mixed failed: NotImplementedError: no pasa-mixed here"]


def test_no_candidate_computing_anything_exits_1(npz, capsys, monkeypatch):
    _fail_on(monkeypatch, "pasa-mixed")
    rc = main(["file", npz, "--allocations", "pasa-mixed", "--backends", "torch"] + QUIET)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[0] == "pasa-compare: pasa-mixed failed: NotImplementedError: no pasa-mixed here"
    assert len(err) == 2 and err[1].startswith("pasa-compare: error: no candidate computed")


def _failed(candidate, reason):
    from pasa_npu.tools.compare.evaluate import Record
    return Record("item", candidate, "error", reason)


def test_failures_lists_each_reason_once():
    rec = _failed
    lines = cli._failures([rec("a", "X: 1"), rec("a", "X: 1"), rec("b", "X: 1"),
                           rec("c", "Y: 2"), rec("d", "")], 3)
    assert lines == ["a (2 of 3 items), b (1 of 3 items) failed: X: 1",
                     "c (1 of 3 items) failed: Y: 2", "d (1 of 3 items) failed: (no reason given)"]
    assert cli._failures([rec(f"c{i}", f"E{i}") for i in range(12)], 1, most=10)[-1] == \
        "... and 2 more reasons (see summary.md)"


def test_paper_shape_with_a_shape_option_is_refused(capsys, monkeypatch):
    def no_inputs(*args, **kwargs):
        raise AssertionError("the sweep ran")
    monkeypatch.setattr(cli, "case_item", no_inputs)
    _fails(["sweep", "--paper-shape", "--heads", "2", "--seq", "64"], capsys,
           "--paper-shape: not allowed with --heads, --seq", "(1, 16, 1280, 128)")


def test_every_option_says_what_it_does_and_its_default():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subs.choices.items():
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or not action.option_strings \
                    or action.dest == "help":
                continue
            name = f"{command} {action.option_strings[-1]}"
            assert action.help, f"{name} has no help"
            told = action.help.count("default")
            assert told <= 1, f"{name}: the default is told {told} times: {action.help!r}"
            shape = command == "sweep" and action.dest in cli.SHAPE_OPTIONS  # default None
            if not (action.default is None or action.default is False) or shape:
                assert told == 1, f"{name} does not say its default: {action.help!r}"


def test_top_level_help_says_a_bare_run_sweeps(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a bare ``pasa-compare`` runs the default sweep, a minute or more" in out


def test_more_token_ids_than_max_tokens_is_refused(tmp_path, capsys):
    ids = [str(i) for i in range(1, 9)]
    _fails(["capture", str(tmp_path), "--token-ids", *ids, "--max-tokens", "3"], capsys,
           "--token-ids: 8 ids given, more than --max-tokens 3")


def test_repeated_names_count_once():
    cands, _ = cand_mod.build(["pasa", "fa-fp16", "pasa"], ["torch", "torch"], ["sdpa", "sdpa"])
    assert [c.label for c in cands] == ["pasa", "fa-fp16", "sdpa"]


def test_capture_of_a_file_points_at_file(npz, capsys):
    _fails(["capture", npz], capsys, f"{npz} is a file, not a model directory",
           f"'pasa-compare file {npz}'")


def test_unknown_command_lists_the_commands(capsys):
    _fails(["bogus"], capsys, "unknown command 'bogus'", "sweep, file, capture, bias")


def test_inputs_beyond_memory_are_refused_with_their_size(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_memory_bytes", lambda: 16 * 2 ** 30)
    _fails(["--seq", "100000000", "--heads", "1", "--dim", "128", "--sweeps", "resonance"],
           capsys, "(B, N, S, D) = (1, 1, 100000000, 128) need about 429 GiB",
           "this machine's 16 GiB")


def test_an_allocation_failure_ends_in_one_line(capsys, monkeypatch):
    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 1024 bytes.")
    monkeypatch.setattr(cli, "case_item", oom)
    _fails(["--sweeps", "resonance"], capsys, "out of memory: can't allocate memory: you "
           "tried to allocate 1024 bytes.")

    def other(*args, **kwargs):
        raise RuntimeError("not an allocation failure")
    monkeypatch.setattr(cli, "case_item", other)
    with pytest.raises(RuntimeError, match="not an allocation failure"):
        main(["--sweeps", "resonance"])
