"""The import contract: the layers the code shows, held by a test (import-linter's
"layers" contract, written out over the source with `ast` so that lazy imports inside
functions count too).

    cli, __main__, notebook                 (the entry points)
    commands                                (one module per face: arguments and output)
    diagnosis, job, rulebase, api,          (compositions: a run's diagnosis is log + env + run
      integrations                           rules; a job is many ranks' logs; the rule base)
    env | logs | run | probe                (the faces: each its own evidence and checks;
                                             none imports another)
    instrument                              (inside the user's process: records only)
    engine                                  (rules, matching, judging, the one assembler)
    logtext, render                         (log text; the renderers of plain data)
    knowledge, findings, redact             (tables with sources; the findings model)

A module imports only from its own package or from layers below it. The package root
(`mpdoctor`: its version and lazy public API) may be imported anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mpdoctor"

LAYERS: list[set[str]] = [
    {"knowledge", "findings", "redact"},
    {"logtext", "render"},
    {"engine"},
    {"instrument"},
    {"env", "logs", "run", "probe"},
    {"diagnosis", "job", "rulebase", "api", "integrations"},
    {"commands"},
    {"cli", "__main__", "notebook"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
FACES = LAYERS[4]
# The child side: what runs inside the user's training process records and never judges.
CHILD_SIDE_MAY_IMPORT = {"instrument": {"knowledge"}}
# The main module of a process of its own (not a library module of its face): it composes
# what that process needs, as cli does for the parent; never commands or cli.
ENTRY_POINTS = {
    "mpdoctor.probe.child": "the probe's child program: trains one mode and records its environment",
}
# Folders of modules that are not packages.
NOT_PACKAGES = {
    "boot": "instrument/boot is put first on PYTHONPATH: its sitecustomize.py is a top-level module",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path) -> list[str]:
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append(mod)
            if not node.module:  # from . import x: x may be a module
                found += [f"{mod}.{a.name}" for a in node.names]
    return [m for m in found if m == "mpdoctor" or m.startswith("mpdoctor.")]


def _area(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


MODULES = _modules()


def test_every_package_and_top_module_has_a_layer():
    areas = {_area(m) for m in MODULES} - {None}
    assert areas <= set(LAYER_OF), f"not in any layer: {sorted(areas - set(LAYER_OF))}"


def test_every_package_has_an_init():
    for folder in PACKAGE.rglob("*"):
        if folder.is_dir() and any(folder.glob("*.py")) and folder.name not in NOT_PACKAGES:
            assert (folder / "__init__.py").exists(), folder


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    mine = _area(module)
    if mine is None:
        return
    if module in ENTRY_POINTS:
        above = [t for t in _imports(module, MODULES[module]) if LAYER_OF.get(_area(t) or "", 0) > LAYER_OF[mine]]
        assert not above, f"{module} (an entry point of its own process) imports {above}"
        return
    bad = []
    for target in _imports(module, MODULES[module]):
        theirs = _area(target)
        if theirs is None or theirs == mine or theirs not in LAYER_OF:
            continue  # the package root, itself, or a name imported from the root
        if mine in CHILD_SIDE_MAY_IMPORT:
            if theirs not in CHILD_SIDE_MAY_IMPORT[mine]:
                bad.append(f"{target} (the child side records only: it imports knowledge only)")
            continue
        if LAYER_OF[theirs] > LAYER_OF[mine]:
            bad.append(f"{target} (layer {LAYER_OF[theirs]} above {mine}'s {LAYER_OF[mine]})")
        elif LAYER_OF[theirs] == LAYER_OF[mine] and mine in FACES:
            bad.append(f"{target} (a face importing another face: compose them in mpdoctor/diagnosis)")
        elif LAYER_OF[theirs] == LAYER_OF[mine] and theirs != mine and mine not in FACES:
            pass  # compositions may use one another (a job's ranks are runs' logs)
    assert not bad, f"{module} imports " + "; ".join(bad)


def test_the_contract_sees_a_violation(tmp_path):
    """The checker itself catches an upward and a sideways import (it can fail)."""
    bad = tmp_path / "diagnose.py"
    bad.write_text("from ..env.judge import judge\n\ndef f():\n    from ..commands import COMMANDS\n")
    found = _imports("mpdoctor.run.diagnose", bad)
    assert found == ["mpdoctor.env.judge", "mpdoctor.commands"]
