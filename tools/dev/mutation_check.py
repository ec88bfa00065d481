"""Mutation check of the test suite (a development tool; not installed with the package).

    python tools/dev/mutation_check.py [--only NAME ...] [--jobs N] [--list] [--no-baseline] [--quiet]

Each mutation is a small deliberate bug: a file, a snippet of it that must occur there
exactly once (so that code which moved is noticed, not silently skipped) and its
replacement. For each, the tool copies the working tree to a temporary directory, applies
the mutation, rebuilds the AscendC emulation extension there when the mutation is in its C++
sources, and runs the tests chosen to catch it: a test that fails catches it, and so does
one whose process a signal kills (the unmutated tree passes the same tests, and
pytest-xdist, as CI runs the suite, fails a test whose worker crashed). A progress bar on
stderr counts the selections of the baseline, then the mutations as they finish, with how
many went uncaught so far (``--quiet``: none). At the end it prints a table (mutation,
caught or not, by which test, seconds) and how many each test file caught first, and exits 0
only if every mutation was caught: 1 if one was not, 2 if a snippet does not match exactly
once or the unmutated tree fails the tests.

The tests run in the copy against the copy's code: ``fallback/`` and ``tools/`` are linked
into the copy's ``pasa_npu/`` as the install maps them, the built extension is copied (or
rebuilt where it is missing or older than the C++ sources; building needs pybind11 in the
environment), and the tool checks which files a test process imports before it trusts a
result.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script or with -m
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutation_list import MUTATIONS, Mutation  # noqa: E402

from pasa_npu.tools.compare.progress import ProgressBar  # noqa: E402


@dataclass
class Outcome:
    mutation: Mutation
    caught: bool
    by: str
    seconds: float


# --------------------------------------------------------------------------- the copy


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         check=True, capture_output=True).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def _base_tree(dest: Path) -> None:
    """The working tree as the package installs it: ``fallback/`` and ``tools/`` linked as
    ``pasa_npu/fallback`` and ``pasa_npu/tools``; the built extension copied, or rebuilt
    where it is missing or older than a file of ``ascend_kernels/``."""
    for name in _tracked_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    libs = list((ROOT / "pasa_npu").glob("_ascendc_emu*.so"))
    sources = max(p.stat().st_mtime for p in (ROOT / "ascend_kernels").rglob("*") if p.is_file())
    for lib in libs:
        shutil.copy2(lib, dest / "pasa_npu" / lib.name)
    for package in ("fallback", "tools"):
        (dest / "pasa_npu" / package).symlink_to(Path("..") / package)
    if not libs or min(lib.stat().st_mtime for lib in libs) < sources:
        _rebuild(dest)


def _mutant_tree(base: Path, dest: Path) -> None:
    shutil.copytree(base, dest, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "build", ".hypothesis"))


def _apply(mutation: Mutation, tree: Path) -> None:
    path = tree / mutation.path
    text = path.read_text()
    path.write_text(text.replace(mutation.snippet, mutation.replacement, 1))


def _rebuild(tree: Path) -> None:
    for lib in (tree / "pasa_npu").glob("_ascendc_emu*.so"):
        lib.unlink()
    env = dict(os.environ, CFLAGS=os.environ.get("CFLAGS", "") + " -g0")
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"rebuilding the emulation failed:\n{done.stderr[-2000:]}")


def _check_imports(tree: Path) -> None:
    """A test process in ``tree`` must import the copy's code, not the installed one."""
    probe = ("import pasa_npu, pasa_npu._ascendc_emu as e, pasa_npu.fallback.torch.blockwise as t;"
             "print(pasa_npu.__file__); print(e.__file__); print(t.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True,
                         text=True, check=True).stdout.split()
    outside = [f for f in out if not Path(f).resolve().is_relative_to(tree.resolve())]
    if outside:
        raise RuntimeError(f"a test process in the copy imports code outside it: {outside}")


# --------------------------------------------------------------------------- running


def _test_env() -> dict:
    """The test processes' environment: the simulator's asc-devkit is found beside this checkout,
    not beside the copy (where its tests would skip)."""
    from pasa_npu import sim_build
    env = dict(os.environ, PYTEST_ADDOPTS="")
    devkit = sim_build.devkit()
    if devkit is not None:
        env["PASA_ASC_DEVKIT"] = devkit
    return env


def _pytest(tree: Path, tests: tuple[str, ...]) -> tuple[int, str, float]:
    """pytest's status on ``tests`` in ``tree``, the first test that failed or erred (a fixture
    that failed, as a ring whose ranks hang), or, for a process killed by a signal, the test
    faulthandler shows it in, else the output's end; and seconds."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p",
                           "no:cacheprovider", *tests], cwd=tree, capture_output=True,
                          text=True, env=_test_env())
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", done.stdout, flags=re.M)
    if done.returncode < 0:
        frames = re.findall(r'File "[^"]*?/(tests/[^"]*\.py)", line \d+ in (test_\w+)', done.stderr)
        failed = [f"{path}::{name}" for path, name in frames[-1:]]  # the outermost test frame
    return done.returncode, (failed[0] if failed else done.stdout[-300:]), time.monotonic() - start


def _run_one(mutation: Mutation, base: Path, workdir: Path) -> Outcome:
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=workdir)) / "tree"
    start = time.monotonic()
    try:
        _mutant_tree(base, tree)
        _apply(mutation, tree)
        if mutation.path.startswith("ascend_kernels/"):
            _rebuild(tree)
        rc, by, _ = _pytest(tree, mutation.tests)
    except Exception as exc:  # a crashed run is reported, never counted as caught
        return Outcome(mutation, False, f"error: {exc}", time.monotonic() - start)
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)
    if rc == 1:
        return Outcome(mutation, True, by, time.monotonic() - start)
    if rc < 0:  # a test process killed by a signal: pytest-xdist, as CI runs it, fails that test
        return Outcome(mutation, True, f"crashed (signal {-rc}): {by}", time.monotonic() - start)
    why = "no test failed" if rc == 0 else f"pytest status {rc}: {by}"
    return Outcome(mutation, False, why, time.monotonic() - start)


def _in_pool(work, items: list, jobs: int, progress, label) -> list:
    """``work`` of each item, ``jobs`` at once, in the items' order; ``progress(done, total,
    label(item, result))`` as each finishes."""
    results = [None] * len(items)
    progress(0, len(items), "starting")
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(work, item): i for i, item in enumerate(items)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            i = futures[future]
            results[i] = future.result()
            progress(done, len(items), label(items[i], results[i]))
    return results


def _baseline(selections: list, base: Path, workdir: Path, jobs: int, progress) -> list[str]:
    """The unmutated tree passes every selection (else "caught" would mean nothing)."""
    tree = workdir / "baseline"
    _mutant_tree(base, tree)
    runs = _in_pool(lambda s: _pytest(tree, s), selections, jobs, progress,
                    lambda s, run: f"baseline {Path(s[0]).stem}")
    return [f"{' '.join(s)}: {by}" for s, (rc, by, _) in zip(selections, runs) if rc != 0]


def _mismatches(mutations) -> list[str]:
    problems = []
    for m in mutations:
        count = (ROOT / m.path).read_text().count(m.snippet)
        if count != 1:
            problems.append(f"{m.name}: its snippet occurs {count} times in {m.path}")
    return problems


def _table(outcomes: list[Outcome]) -> str:
    rows = [("mutation", "file", "caught", "by", "s")]
    rows += [(o.mutation.name, o.mutation.path, "yes" if o.caught else "NO", o.by,
              f"{o.seconds:.0f}") for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + f" | {r[4]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _by_family(outcomes: list[Outcome]) -> str:
    """How many mutations each test file caught first."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.caught:
            family = o.by.split("::")[0]
            counts[family] = counts.get(family, 0) + 1
    return "\n".join(f"  {family}: {n}" for family, n in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutations run at once (default: one per core)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running the selected tests on the unmutated tree first")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    mutations = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.only and len(mutations) != len(set(args.only)):
        known = {m.name for m in MUTATIONS}
        print(f"unknown mutations: {sorted(set(args.only) - known)}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutations:
            print(f"{m.name}  ({m.path}; {' '.join(m.tests)})")
        return 0
    problems = _mismatches(mutations)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pasa-mutation-") as tmp:
        workdir = Path(tmp)
        base = workdir / "base"
        _base_tree(base)
        _check_imports(base)
        if not args.no_baseline:
            selections = list(dict.fromkeys(m.tests for m in mutations))
            failing = _baseline(selections, base, workdir, args.jobs, ProgressBar(not args.quiet))
            if failing:
                print("the unmutated tree fails:\n" + "\n".join(failing), file=sys.stderr)
                return 2
        missed_so_far = []

        def label(mutation: Mutation, outcome: Outcome) -> str:
            if not outcome.caught:
                missed_so_far.append(mutation.name)
            return f"{len(missed_so_far)} not caught; {mutation.name}"

        outcomes = _in_pool(lambda m: _run_one(m, base, workdir), mutations, args.jobs,
                            ProgressBar(not args.quiet), label)
    print(_table(outcomes))
    print("\ncaught first by:\n" + _by_family(outcomes))
    missed = [o.mutation.name for o in outcomes if not o.caught]
    print(f"\n{len(outcomes) - len(missed)} of {len(outcomes)} mutations caught in "
          f"{time.monotonic() - start:.0f} s")
    if missed:
        print("not caught: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
