"""The one direction of flow: a module never imports one from a higher layer.

models -> codec -> storage -> store -> agent/tools -> integrity/mirror -> cli.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "ckptfs"

LAYER = {
    "errors": 0,
    "models": 1,
    "codec": 2, "layout": 2, "changes": 2, "chain": 3,
    "storage": 3, "retry": 3, "logstore": 3,
    "logfile": 3,
    "artifacts": 4, "leases": 4, "store": 4,
    "policy": 5, "tools": 5, "agent": 5, "resume": 5, "worker": 5, "integrations": 5,
    "integrity": 6, "prune": 6, "mirror": 6, "config": 6,
    "cli": 7,
}


def _module_of(path: Path) -> str:
    return path.relative_to(PKG).parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptfs"):
            parts = node.module.split(".")
            if len(parts) > 1:
                out.add(parts[1])
            else:  # from ckptfs import codec
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ckptfs."):
                    out.add(a.name.split(".")[1])
    return out


def test_every_module_has_a_layer() -> None:
    mods = {_module_of(p) for p in PKG.rglob("*.py")} - {"__init__"}
    assert mods <= set(LAYER), f"give these modules a layer: {sorted(mods - set(LAYER))}"


def test_no_module_imports_a_higher_layer() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        mod = _module_of(path)
        if mod == "__init__":
            continue  # the package facade re-exports everything
        for dep in _imports(path):
            if dep in LAYER and LAYER[dep] > LAYER[mod]:
                bad.append(f"{path.relative_to(PKG)} imports ckptfs.{dep}")
    assert not bad, bad


def test_only_storage_imports_fsspec() -> None:
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "storage.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("fsspec", "s3fs") for n in names):
                offenders.append(str(path.relative_to(PKG)))
    assert not offenders, offenders
