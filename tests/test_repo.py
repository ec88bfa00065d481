"""The repository's promises: CI runs the README's test command; the package installs
only under pasa_npu."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    """The Set-up section's commands: two lines, in one code block or two."""
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up"):readme.index("## Quickstart")]
    blocks = re.findall(r"```bash\n(.+?)\n```", setup, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(lines) == 2, f"the README's Set-up should hold two commands, it holds {lines}"
    return lines


def test_ci_runs_the_readme_test_command():
    install, tests = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()
    assert "pip install -q torch==2.13.0 -e '.[test]'" in ci and "-e '.[test]'" in install


def test_only_pasa_npu_is_installed():
    setup = (ROOT / "setup.py").read_text()
    packages = re.search(r"packages=\[(.*?)\]", setup, flags=re.S).group(1)
    assert all(p.strip().strip('"').startswith("pasa_npu") for p in packages.split(","))


def test_development_tools_are_not_installed(tmp_path, monkeypatch):
    """setup.py's build_py, which lays out what a wheel installs, copies tools/ without the
    development tools of tools/dev/ (run from a checkout: python tools/dev/mutation_check.py,
    python -m pasa_npu.tools.dev.ablate in an editable install), among them the simulator's
    self-test, and nothing installed imports them."""
    import sys
    import types

    import setuptools
    from setuptools.dist import Distribution

    captured = {}
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.setitem(sys.modules, "pybind11", types.SimpleNamespace(get_include=lambda: ""))
    exec(compile((ROOT / "setup.py").read_text(), str(ROOT / "setup.py"), "exec"),
         {"__name__": "setup_under_test", "__file__": str(ROOT / "setup.py")})
    # the package named too, as a package list found by discovery would: still left out
    captured["packages"] = [*captured["packages"], "pasa_npu.tools.dev"]
    dist = Distribution(captured)
    dist.script_name = str(ROOT / "setup.py")
    build = dist.get_command_obj("build_py")
    build.build_lib = str(tmp_path)
    build.ensure_finalized()
    build.run()
    tools = tmp_path / "pasa_npu" / "tools"
    assert (tools / "beta.py").is_file() and (tmp_path / "pasa_npu" / "reference.py").is_file()
    # every backend family of fallback/ (a subpackage each) is installed
    families = {p.parent.name for p in (ROOT / "fallback").glob("*/__init__.py")}
    assert {"torch", "triton", "gluon"} <= families
    fallback = tmp_path / "pasa_npu" / "fallback"
    assert (fallback / "kernel_common.py").is_file()
    assert {p.parent.name for p in fallback.glob("*/__init__.py")} == families
    dev = {f.stem for f in (ROOT / "tools" / "dev").glob("*.py")} - {"__init__"}
    assert {"mutation_check", "mutation_list", "ablate", "triton_aot", "sim_selftest"} <= dev
    assert not (tools / "dev").exists()
    installed = {f.stem for f in tools.rglob("*.py")}
    assert not installed & dev, installed & dev
    for f in tools.rglob("*.py"):  # what is installed imports no development module
        for line in f.read_text().splitlines():
            words = line.replace(",", " ").split()
            if words[:1] in (["import"], ["from"]):
                imported = [w for w in words if w.split(".")[-1] in dev or "dev" in w.split(".")]
                assert not imported, f"{f.name} imports {imported}, which is not installed"
    assert {"bench", "beta", "compare", "npu_model", "npu_extrapolate", "npu_calibrate"} <= \
        installed | {d.name for d in tools.iterdir() if d.is_dir()}


def test_development_tools_run_from_the_checkout():
    """The dev tools import as pasa_npu.tools.dev (an editable install maps pasa_npu.tools to
    this checkout's tools/, the GPU suite links it there) and the mutation check, run as a
    script, finds its list beside it."""
    import subprocess
    import sys

    from pasa_npu.tools.dev import mutation_list

    assert mutation_list.MUTATIONS
    listed = subprocess.run([sys.executable, str(ROOT / "tools" / "dev" / "mutation_check.py"),
                             "--list"], capture_output=True, text=True, cwd=ROOT)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert mutation_list.MUTATIONS[0].name in listed.stdout


def test_every_mutation_finds_its_snippet_once():
    """A mutation whose code moved would plant nothing: each snippet stands exactly once in
    its file."""
    from pasa_npu.tools.dev import mutation_list

    stale = [(m.name, m.path, (ROOT / m.path).read_text().count(m.snippet))
             for m in mutation_list.MUTATIONS
             if (ROOT / m.path).read_text().count(m.snippet) != 1]
    assert not stale, stale


def test_readme_counts_the_mutations_the_check_plants():
    """The README's count of planted bugs is the mutation list's length."""
    import re

    from pasa_npu.tools.dev import mutation_list

    said = re.findall(r"mutation_check\.py` plants (\d+) bugs", (ROOT / "README.md").read_text())
    assert said == [str(len(mutation_list.MUTATIONS))], said


def test_test_files_named_elsewhere_exist():
    """The tests are laid out like the source (tests/api/, tests/fallback/triton/, ...): every
    test file the CI scripts, the development tools and the docs name is where they say, and
    no two test modules share a basename (they are imported as top-level modules,
    tests/conftest.py)."""
    named = {}
    sources = [ROOT / ".ci" / "run", ROOT / ".ci" / "gpu-suite", ROOT / "README.md",
               ROOT / "tools" / "dev" / "mutation_list.py", *(ROOT / "docs").rglob("*.md"),
               *(ROOT / "ascend_kernels").rglob("*.md")]
    for source in sources:
        for path in re.findall(r"\btests/[\w/]*test_\w+\.py", source.read_text()):
            named.setdefault(path, source.relative_to(ROOT))
    measure = (ROOT / "tests" / "measure_bounds.py").read_text()
    listed = re.search(r"MEASURING = \[(.*?)\]", measure, flags=re.S).group(1)
    for name in re.findall(r'"([\w/]+\.py)"', listed):
        named.setdefault(f"tests/{name}", "tests/measure_bounds.py")
    assert len(named) > 40
    missing = {path: where for path, where in named.items() if not (ROOT / path).is_file()}
    assert not missing, missing
    modules = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(modules) == len(set(modules)), sorted(m for m in modules if modules.count(m) > 1)
