"""The package's layers (docs/design.md, "Layers"): a module imports only from its own layer
or from lower ones, and nothing in the package imports the tools. Every import counts,
those inside functions too."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: rank and modules of each layer, lowest first; a module of ``fallback/`` (its subfolders
#: too) or ``pasa_npu/integrations/`` belongs to its folder's layer
LAYERS = {
    "core": (0, {"numerics", "npu_params", "beta", "install_record", "tensor_memo"}),
    "contract": (1, {"problem", "outputs", "paged_kv"}),
    "backends": (2, {"backends", "kernel_inputs", "ascendc_cpu", "ascendc_emu", "ascendc_sim",
                     "sim_build", "npu", "reference", "fallback"}),
    "arguments": (2, {"arguments", "options", "views", "lengths", "masks", "paging"}),
    "plan": (3, {"planner", "plans", "overflow"}),
    "api": (4, {"api", "compiled", "distributed", "torch_npu_patch", "integrations",
                "__init__"}),
}


def _layer(module: str) -> str:
    for name, (_, members) in LAYERS.items():
        if module in members:
            return name
    raise KeyError(module)


def _sources():
    for path in sorted((ROOT / "pasa_npu").glob("*.py")):
        yield path.stem, path
    for folder in ("fallback", "pasa_npu/integrations"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield pathlib.Path(folder).name, path


def _folders(path: pathlib.Path) -> tuple[str, ...]:
    """The folders of ``path`` below the package: () in pasa_npu/, ("fallback", "triton")
    in fallback/triton/ (installed as pasa_npu.fallback.triton)."""
    folders = []
    parent = path.parent
    while parent.name not in ("pasa_npu", "fallback") and parent != parent.parent:
        folders.append(parent.name)
        parent = parent.parent
    if parent.name == "fallback":
        folders.append("fallback")
    return tuple(reversed(folders))


def _imported(path: pathlib.Path) -> set[str]:
    """The package modules ``path`` imports: the first name below ``pasa_npu``."""
    found = set()
    folders = _folders(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if 0 < node.level <= len(folders):  # a module inside fallback/, integrations/
                found.add(folders[0])
            elif node.level:
                base = (node.module or "").split(".")[0]
                found.update([base] if base else names)
            elif node.module and node.module.split(".")[0] == "pasa_npu":
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "pasa_npu" and len(parts) > 1:
                    found.add(parts[1])
    return found


SOURCES = list(_sources())


@pytest.mark.parametrize("module,path", SOURCES, ids=[str(p.relative_to(ROOT)) for _, p in SOURCES])
def test_imports_go_down_the_layers(module, path):
    layer = _layer(module)
    rank = LAYERS[layer][0]
    for target in sorted(_imported(path) - {module}):
        if target.startswith("_"):  # the compiled extensions
            continue
        assert target != "tools", f"{path.parent.name}/{path.name} imports the tools"
        target_layer = _layer(target)
        assert target_layer == layer or LAYERS[target_layer][0] < rank, \
            f"{path.parent.name}/{path.name} ({layer}) imports {target} ({target_layer})"


def test_the_rule_catches_an_upward_import(tmp_path):
    """A contract module that imported the plan would fail."""
    source = tmp_path / "pasa_npu" / "problem.py"
    source.parent.mkdir()
    source.write_text("from . import plans\nfrom pasa_npu.overflow import OverflowReport\n")
    assert _imported(source) == {"plans", "overflow"}
    with pytest.raises(AssertionError, match="imports overflow"):
        test_imports_go_down_the_layers("problem", source)


def test_the_call_object_has_the_argument_tables_fields_and_defaults():
    """arguments.Call names every implemented argument as a field, with the table's
    default: the table (torch_npu's, ours, v2's extensions) and the class are one list."""
    import dataclasses

    from pasa_npu import arguments

    table = [a for a in arguments.KEYWORD_ARGUMENTS + arguments.V2_EXTENSIONS
             if a.kind != "unimplemented"]
    fields = dataclasses.fields(arguments.Call)
    assert [f.name for f in fields] == [*arguments.TENSOR_NAMES, *(a.name for a in table)]
    defaults = {f.name: f.default for f in fields[3:]}
    assert defaults == {a.name: a.default for a in table}
