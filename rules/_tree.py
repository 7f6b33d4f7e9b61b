"""`ast.iter_child_nodes` and `ast.walk`, yielding the same nodes in the same order, faster.

The stdlib versions stack two generators per node (iter_fields inside iter_child_nodes); the
shared analyses walk most of every file's tree, where that was a tenth of matlint's time.
"""
from __future__ import annotations

import ast

_AST = ast.AST


def child_nodes(node: ast.AST) -> list:
    """The direct children of `node`, as `list(ast.iter_child_nodes(node))`."""
    found = []
    for name in node._fields:
        value = getattr(node, name, None)
        if type(value) is list:
            for item in value:
                if isinstance(item, _AST):
                    found.append(item)
        elif isinstance(value, _AST):
            found.append(value)
    return found


def walk(node: ast.AST):
    """Every node under `node`, itself first, breadth first, as `ast.walk(node)`."""
    queue = [node]
    index = 0
    while index < len(queue):
        current = queue[index]
        index += 1
        queue.extend(child_nodes(current))
        yield current
