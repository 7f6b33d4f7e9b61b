"""The layers, read from the imports: every module of matlint/, matlint/semantic/, rules/ and
runtime_guard/ is parsed (never imported) and its imports resolved to matlint's own modules.

- The engine and the semantic model import nothing from the rules; the semantic model imports
  neither the engine nor the rules (it sits below both, see matlint/semantic/__init__.py).
- matlint's own modules import one another without cycles, counting the imports inside
  functions as well as those at module level (a lazy import still ties the two modules
  together; it only hides the cycle until the function runs). `ALLOWED_CYCLES` would list a
  cycle kept on purpose, with why; there is none. Leaf modules hold what several layers share:
  `matlint/source.py` (decoding, line splitting, parsing) below the engine, notebooks and fixes;
  `semantic/tree.py` below the semantic model's loops, flow, kinds and calls.
- Only the runtime guard imports torch at module level: `import matlint`, the linter and every
  rule load without it (the guard is the `guard` extra).

What the reading does not see: `importlib.import_module` (the registry loads every rule that
way, which is the direction the layers allow) and the implicit import of a package's
`__init__` before its submodule (matlint's, matlint.semantic's and matlint.rules' import
nothing at module level, so no edge is lost).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple, Optional

REPO = Path(__file__).resolve().parents[1]

# Where each installed package's files are in the checkout (pyproject.toml's package-dir).
_PACKAGE_DIRS = {"matlint": REPO / "matlint", "matlint.rules": REPO / "rules",
                 "matlint.runtime_guard": REPO / "runtime_guard"}
# Data, not code: the rules' examples (they import torch as the code they show does).
_NOT_CODE = (REPO / "rules" / "fixtures",)

# Cycles kept, as the sorted tuple of their modules, with why. A new cycle is a layering mistake
# to fix, or an entry here with its reason; an entry whose cycle is gone fails the test too.
ALLOWED_CYCLES: dict = {}


class Import(NamedTuple):
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function: runs when the function runs, not at import


def _module_files() -> dict:
    """Module name -> file, for every module of matlint's packages (rules' packages included)."""
    found = {}
    for package, root in _PACKAGE_DIRS.items():
        for path in sorted(root.rglob("*.py")):
            if any(path.is_relative_to(skip) for skip in _NOT_CODE) or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _module_files()


def _resolve(importer: str, is_package: bool, node: ast.AST) -> list:
    """The full names a statement imports: for `from x import y`, `x.y` where that is a module
    of matlint's, else `x`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = importer.split(".")
        if not is_package:
            parts.pop()
        if node.level > 1:
            parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    names = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        names.append(sub if sub in MODULES else base)
    return names


def _imports(name: str) -> list:
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def walk(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for imported in _resolve(name, path.name == "__init__.py", child):
                    found.append(Import(name, imported, child.lineno, lazy))
            walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


IMPORTS = {name: _imports(name) for name in MODULES}


def _own(imported: str) -> Optional[str]:
    """The module of matlint's that an imported name is (or lies in), or None."""
    while imported:
        if imported in MODULES:
            return imported
        imported = imported.rpartition(".")[0]
    return None


def _is_rules(imported: str) -> bool:
    return imported == "matlint.rules" or imported.startswith("matlint.rules.") \
        or imported == "rules" or imported.startswith("rules.")


def _is_engine(imported: str) -> bool:
    return imported == "matlint.engine" or imported.startswith("matlint.engine.")


def test_every_module_is_read():
    assert "matlint.engine" in MODULES and "matlint.semantic.steps" in MODULES
    assert "matlint.rules.mat503_tensor_creation_in_loop" in MODULES
    assert "matlint.rules.mat503_tensor_creation_in_loop.advice" in MODULES
    assert "matlint.runtime_guard.session" in MODULES
    assert not any(".fixtures" in name for name in MODULES)


def test_engine_imports_nothing_from_the_rules():
    wrong = [i for i in IMPORTS["matlint.engine"] if _is_rules(i.imported)]
    assert not wrong, wrong


def test_semantic_model_imports_neither_engine_nor_rules():
    wrong = [i for name, imports in IMPORTS.items() if name == "matlint.semantic" or name.startswith("matlint.semantic.")
             for i in imports if _is_rules(i.imported) or _is_engine(i.imported)]
    assert not wrong, wrong


def _graph() -> dict:
    graph = {name: {} for name in MODULES}
    for name, imports in IMPORTS.items():
        for i in imports:
            target = _own(i.imported)
            if target is not None and target != name:
                graph[name].setdefault(target, i)
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each as a sorted tuple."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(component: tuple, graph: dict) -> str:
    edges = [f"{a} -> {b} (line {i.line}{', in a function' if i.lazy else ''})"
             for a in component for b, i in sorted(graph[a].items()) if b in component]
    return "\n  ".join([" / ".join(component), *edges])


def test_no_import_cycles():
    graph = _graph()
    cycles = [c for c in _cycles(graph) if c not in ALLOWED_CYCLES]
    assert not cycles, "import cycles among matlint's modules:\n" + "\n".join(_describe(c, graph) for c in cycles)
    stale = [c for c in ALLOWED_CYCLES if c not in _cycles(graph)]
    assert not stale, f"ALLOWED_CYCLES lists cycles that are gone: {stale}"


def test_cycle_finder_finds_a_lazy_cycle():
    graph = {"a": {"b": Import("a", "b", 1, False)}, "b": {"c": Import("b", "c", 2, False)},
             "c": {"a": Import("c", "a", 3, True)}, "d": {"a": Import("d", "a", 4, False)}}
    assert _cycles(graph) == [("a", "b", "c")]


def _runtime_half(name: str) -> bool:
    """A rule's runtime half (`matlint.rules.<rule>.runtime`): only the guard imports it."""
    return name.startswith("matlint.rules.") and name.rsplit(".", 1)[-1] == "runtime"


def test_only_the_guard_imports_torch_at_module_level():
    wrong = [f"{i.importer} (line {i.line})" for name, imports in sorted(IMPORTS.items())
             if not name.startswith("matlint.runtime_guard") and not _runtime_half(name) for i in imports
             if not i.lazy and (i.imported == "torch" or i.imported.startswith("torch."))]
    assert not wrong, f"only the runtime guard and the rules' runtime halves may import torch at module level: {wrong}"
    # Nothing but the guard (its registry loads them by name) imports a rule's runtime half.
    importers = [f"{i.importer} (line {i.line})" for name, imports in sorted(IMPORTS.items())
                 if not name.startswith("matlint.runtime_guard") and not _runtime_half(name) for i in imports
                 if _runtime_half(i.imported)]
    assert not importers, f"a rule's runtime half imported outside the guard: {importers}"
    assert any(not i.lazy and i.imported == "torch" for i in IMPORTS["matlint.runtime_guard.session"])
