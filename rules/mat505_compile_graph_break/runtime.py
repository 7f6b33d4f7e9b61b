"""MAT505 at run time: the graph breaks and recompiles torch.compile made while the guard watched
(runtime_guard/compiles.py). Imported only by the guard (needs torch)."""
from __future__ import annotations

import re

from matlint.runtime_guard.checks import finding
from matlint.runtime_guard.registry import runtime_check

_SIZE = re.compile(r"size mismatch|stride mismatch|dimension mismatch|ndim", re.IGNORECASE)
_VALUE = re.compile(r"==|!=|ID_MATCH|id mismatch|___check_obj_id|TYPE_MATCH|type mismatch|___check_type_id",
                    re.IGNORECASE)


def recompile_advice(failures: list) -> str:
    """What to change, read off dynamo's guard failures."""
    text = "\n".join(failures)
    if _SIZE.search(text):
        return ("the input shapes change between calls: mark the dim that varies dynamic "
                "(`torch._dynamo.mark_dynamic(x, 0)`), compile with `dynamic=True`, or pad or bucket the "
                "inputs to a few fixed sizes")
    if _VALUE.search(text):
        return ("a Python value or object the function reads changes between calls (each value is compiled "
                "for): pass it as a tensor, or keep it fixed")
    return "make what the failing guard checks the same on every call"


@runtime_check("MAT505")
def check_compiles(rec, steps, ctx):
    events = rec.compile_events
    if events is None:
        return
    for (site, title), (brk, count) in events.breaks.items():
        detail = f": {brk.explanation}" if brk.explanation else ""
        hint = f"; {brk.hint}" if brk.hint else ""
        msg = (f"torch.compile breaks the graph here ({title}{detail}): the compiled code ends its graph at this "
               f"line, runs it in Python and resumes in a new graph on every call{hint}")
        ev = {"reason": title, "compiles_seen": count, "explanation": brk.explanation, "hint": brk.hint}
        yield finding("MAT505", site, msg, ev)
    for site, (name, failures) in events.recompiles.items():
        first = failures[0].split(": ", 1)[-1] if failures else "a guard failed"
        msg = (f"torch.compile recompiled `{name}` {len(failures)}x while the guard watched ({first}): each "
               f"recompile costs a compilation, and past the recompile limit the function runs eagerly; "
               f"{recompile_advice(failures)}")
        ev = {"recompiles": len(failures), "guard_failures": failures[:8], "function": name}
        yield finding("MAT505", site, msg, ev)
