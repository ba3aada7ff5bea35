"""The one direction of flow, checked so that it can fail.

Layers, lowest first: errors -> format -> storage -> store -> runtime -> maintenance, replication
-> config -> cli. `integrations` sits beside the stack: it may use format, storage and store, and
nothing below the cli imports it except by name through the namespace plug-in table
(`ckptfs.format.keys.NAMESPACE_PLUGINS`), which maintenance and replication resolve at run time.

What counts as an import: `import a.b`, `from a import b` (absolute or relative, at any depth,
inside functions and `TYPE_CHECKING` blocks too), `importlib.import_module("a.b")` and
`__import__`, and any string constant naming a ckptfs module (a table of module names handed to
`import_module` is an import). Imports through the package facade (`from ckptfs import X`) are
refused inside the package: the facade re-exports the top layer, so it would hide an upward edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "ckptfs"

LAYER = {
    "errors": 0,
    "format": 1,
    "storage": 2,
    "store": 3,
    "integrations": 3.5,
    "runtime": 4,
    "maintenance": 5,
    "replication": 5,
    "config": 6,
    "cli": 7,
}

# Edges between different packages of one layer, each a decision: replication reads what
# maintenance's verify says of a staged restore before publishing it.
SAME_LAYER_PACKAGE_EDGES = {("replication", "maintenance")}

# Who may resolve a plug-in by name (the string table in format/keys.py), and what it may name.
PLUGIN_RESOLVERS = {"ckptfs.format.keys"}

# Third-party storage clients belong to the storage layer's backends alone.
CLIENT_LIBS = {"fsspec": {"storage"}, "s3fs": {"storage"}, "botocore": {"storage"},
               "aiobotocore": {"storage"}, "boto3": set()}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve_relative(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _edges(module: str, path: Path) -> list[tuple[str, str, int]]:
    """(target module, what was imported from it or '', line) for every import in a module."""
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((a.name, "", node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = (_resolve_relative(module, is_pkg, node.level, node.module) if node.level
                      else node.module or "")
            for a in node.names:
                sub = f"{target}.{a.name}"
                # `from ckptfs.format import codec` imports the module ckptfs.format.codec
                out.append((sub, "", node.lineno) if sub in MODULES else (target, a.name, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":")[0]
            if name.startswith("ckptfs.") and name in MODULES:
                out.append((name, "", node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((str(node.args[0].value), "", node.lineno))
    return out


def _internal_edges() -> list[tuple[str, str, str, int]]:
    edges = []
    for mod, path in MODULES.items():
        for target, name, line in _edges(mod, path):
            if target == "ckptfs" or target.startswith("ckptfs."):
                edges.append((mod, target, name, line))
    return edges


def test_every_package_has_a_layer() -> None:
    pkgs = {_package_of(m) for m in MODULES} - {"__init__", "__main__", "py"}
    assert pkgs <= set(LAYER), f"give these a layer: {sorted(pkgs - set(LAYER))}"


def test_no_import_through_the_facade() -> None:
    bad = [f"{m}:{line} imports {name or 'ckptfs'} from the facade"
           for m, target, name, line in _internal_edges()
           if target == "ckptfs" and m != "ckptfs" and name != "__version__"]  # a constant, no edge
    assert not bad, bad


def test_no_module_imports_a_higher_layer() -> None:
    bad = []
    for mod, target, _name, line in _internal_edges():
        src, dst = _package_of(mod), _package_of(target)
        if src in ("__init__", "__main__") or dst == "__init__":
            continue
        if dst == "integrations" and src != "integrations":
            if LAYER[src] < LAYER["cli"] and not (mod in PLUGIN_RESOLVERS and _is_name_only(mod, target)):
                bad.append(f"{mod}:{line} imports the integration {target} (find it by name instead)")
        elif LAYER[dst] > LAYER[src]:
            bad.append(f"{mod}:{line} imports {target}")
    assert not bad, bad


def _is_name_only(mod: str, target: str) -> bool:
    """True when `target` appears in `mod` only as a string (a plug-in resolved by name)."""
    tree = ast.parse(MODULES[mod].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n.startswith(target) for n in names):
                return False
    return True


def test_same_layer_packages_only_by_decision() -> None:
    bad = []
    for mod, target, _name, line in _internal_edges():
        src, dst = _package_of(mod), _package_of(target)
        if src != dst and src in LAYER and dst in LAYER and LAYER[src] == LAYER[dst] \
                and (src, dst) not in SAME_LAYER_PACKAGE_EDGES:
            bad.append(f"{mod}:{line} imports {target}: same layer, not in SAME_LAYER_PACKAGE_EDGES")
    assert not bad, bad


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, target, _name, _line in _internal_edges():
        plugin = mod in PLUGIN_RESOLVERS and _is_name_only(mod, target)  # resolved at run time
        if target in MODULES and target != mod and mod != "ckptfs" and not plugin \
                and not _is_package_parent(target, mod):
            graph[mod].add(target)
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                cycles.append(" -> ".join([*stack[stack.index(d):], d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, cycles


def _is_package_parent(target: str, mod: str) -> bool:
    return mod.startswith(target + ".") and MODULES[target].name == "__init__.py"


def test_no_private_names_across_modules() -> None:
    bad = []
    for mod, target, name, line in _internal_edges():
        if name.startswith("_") and not name.startswith("__") and target != mod:
            bad.append(f"{mod}:{line} imports {target}.{name}")
    for mod, path in MODULES.items():
        imported = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("ckptfs"):
                        imported[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptfs"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        imported[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(path.read_text())):
            private = isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__")
            if private and isinstance(node.value, ast.Name) and node.value.id in imported:
                bad.append(f"{mod}:{node.lineno} uses {imported[node.value.id]}.{node.attr}")
    assert not bad, bad


def test_storage_clients_only_in_the_storage_layer() -> None:
    bad = []
    for mod, path in MODULES.items():
        for target, _name, line in _edges(mod, path):
            lib = target.split(".")[0]
            if lib in CLIENT_LIBS and _package_of(mod) not in CLIENT_LIBS[lib]:
                bad.append(f"{mod}:{line} imports {target}")
    assert not bad, bad


# ---- the checker itself must see what it claims to see

def test_the_checker_sees_relative_imports_importlib_and_private_names(tmp_path: Path) -> None:
    src = (
        "from __future__ import annotations\n"
        "import importlib\n"
        "from ..runtime import agent\n"
        "from .codec import _private\n"
        "def f():\n"
        "    importlib.import_module('ckptfs.cli')\n"
    )
    path = tmp_path / "x.py"
    path.write_text(src)
    targets = {t for t, _n, _l in _edges("ckptfs.format.x", path)}
    assert "ckptfs.runtime.agent" in targets
    assert "ckptfs.format.codec" in targets
    assert "ckptfs.cli" in targets
    names = {(t, n) for t, n, _l in _edges("ckptfs.format.x", path)}
    assert ("ckptfs.format.codec", "_private") in names
