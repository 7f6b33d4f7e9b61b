"""The functions of a file and where the file calls them, so that what a caller passes can
flow into a function's parameters and what a function does can count where it is called.

A module-level `def f` is called as `f(...)` anywhere in the file; a method `def m(self, ...)`
of class `C` as `self.m(...)` from C's other methods. Built once per file, on first use.
"""
from __future__ import annotations

import ast
from typing import NamedTuple, Optional

from .tree import child_nodes

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_BRANCHES = (ast.If, ast.IfExp, ast.ExceptHandler)


class CallSite(NamedTuple):
    call: ast.Call
    functions: tuple          # the functions around the call, outermost first
    cls: Optional[ast.ClassDef]  # the class whose method holds the call
    bound: bool               # `self.m(...)`: the first parameter is bound, not passed
    loops: tuple              # the loops around the call in its function, outermost first
    conditional: bool         # under an `if` or in a `try` handler of its function: not every call runs it


class FileCalls:
    def __init__(self, tree: ast.Module):
        self.module_functions: dict = {}   # name -> FunctionDef, for names bound once at module level
        self.methods: dict = {}            # id(ClassDef) -> {name: FunctionDef}
        self.class_of: dict = {}           # id(FunctionDef) -> its ClassDef, for methods
        self.sites: dict = {}              # id(FunctionDef) -> [CallSite]
        rebound: set = set()
        for stmt in tree.body:
            if isinstance(stmt, _FUNCTIONS):
                if stmt.name in self.module_functions:
                    rebound.add(stmt.name)
                self.module_functions[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                table = self.methods[id(stmt)] = {}
                for item in stmt.body:
                    if isinstance(item, _FUNCTIONS):
                        table[item.name] = item
                        self.class_of[id(item)] = stmt
        for name in rebound:
            del self.module_functions[name]
        self.functions: list = []          # every function of the file
        self._walk(tree, (), None, (), False)

    def _walk(self, node: ast.AST, functions: tuple, cls: Optional[ast.ClassDef], loops: tuple,
              conditional: bool) -> None:
        for child in child_nodes(node):
            if isinstance(child, _FUNCTIONS):
                self.functions.append(child)
                self._walk(child, functions + (child,), cls, (), False)
                continue
            if isinstance(child, ast.ClassDef):
                self._walk(child, functions, child, (), False)
                continue
            if isinstance(child, ast.Call):
                self._record(child, functions, cls, loops, conditional)
            self._walk(child, functions, cls, loops + (child,) if isinstance(child, _LOOPS) else loops,
                       conditional or isinstance(child, _BRANCHES))

    def _record(self, call: ast.Call, functions: tuple, cls: Optional[ast.ClassDef], loops: tuple,
                conditional: bool) -> None:
        func = call.func
        if isinstance(func, ast.Name):
            target = self.module_functions.get(func.id)
            if target is not None:
                self.sites.setdefault(id(target), []).append(CallSite(call, functions, cls, False, loops, conditional))
        elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and cls is not None
              and functions and _first_parameter(functions[-1]) == func.value.id):
            target = self.methods.get(id(cls), {}).get(func.attr)
            if target is not None:
                self.sites.setdefault(id(target), []).append(CallSite(call, functions, cls, True, loops, conditional))

    def call_sites(self, function: ast.AST) -> list:
        return self.sites.get(id(function), [])


def _first_parameter(function: ast.AST) -> Optional[str]:
    args = function.args
    params = args.posonlyargs + args.args
    return params[0].arg if params else None


def file_calls(ctx) -> FileCalls:
    found = ctx.shared.get("file_calls")
    if found is None:
        found = ctx.shared["file_calls"] = FileCalls(ctx.tree)
    return found


def argument_for(site: CallSite, function: ast.AST, name: str):
    """The expression `site` passes for parameter `name` of `function`; the parameter's
    default where the call leaves it out; None where it cannot be told (`*args`, `**kwargs`)."""
    args = function.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if site.bound:
        positional = positional[1:]
    call = site.call
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if name in positional:
        index = positional.index(name)
        if index < len(call.args):
            return call.args[index]
        defaults = args.defaults
        first_default = len(positional) - len(defaults)
        return defaults[index - first_default] if index >= first_default else None
    kwonly = [a.arg for a in args.kwonlyargs]
    if name in kwonly:
        return args.kw_defaults[kwonly.index(name)]
    return None
