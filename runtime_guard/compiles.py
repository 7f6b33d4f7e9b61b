"""What torch.compile does while the guard watches: graph breaks and recompiles.

Dynamo counts each graph break by its reason (`torch._dynamo.utils.counters["graph_break"]`) and
keeps each guard failure that made it recompile a function
(`torch._dynamo.utils.guard_failures`, keyed by the function's code). The watch takes both at
the start of the window and again at its end: what changed happened inside it. The line of each
break comes from dynamo's own `graph_breaks` log records ("Graph break in user code at
file:line"), which the watch listens to inside the window without printing them (the loggers'
level and propagation are restored when it stops).

Breaks and recompiles from before the window (a model compiled and warmed up first) have no
line the watch could see; the watch counts them for a note.
"""
from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from typing import Optional

from .capture import Site

_BREAK_LOGGERS = ("torch._dynamo.symbolic_convert.__graph_breaks", "torch._dynamo.convert_frame.__graph_breaks")
_AT = re.compile(r"Graph break.*? in user code at (?P<file>.+):(?P<line>\d+)\s*$")


@dataclass
class GraphBreak:
    title: str                   # dynamo's name for the reason ("Data-dependent branching")
    explanation: str = ""        # its first sentence of explanation
    hint: str = ""               # its first hint


@dataclass
class CompileEvents:
    """Graph breaks and recompiles inside the window, and how many came before it."""
    breaks: dict = field(default_factory=dict)      # (Site, GraphBreak.title) -> (GraphBreak, count)
    recompiles: dict = field(default_factory=dict)  # Site of the function -> (name, [guard failures])
    breaks_before: int = 0       # distinct reasons dynamo had broken graphs for before the window
    recompiles_before: int = 0


def parse_break(message: str) -> Optional[tuple]:
    """(Site, GraphBreak) from one of dynamo's graph-break log messages, else None."""
    lines = message.splitlines()
    if not lines:
        return None
    at = _AT.match(lines[0])
    if at is None:
        return None
    title, explanation, hint = "", "", ""
    for i, line in enumerate(lines[1:], 1):
        text = line.strip()
        if text.startswith("Graph Break Reason:"):
            title = text[len("Graph Break Reason:"):].strip()
            if title.startswith("Encountered graph break when attempting to trace"):
                title = next((n.strip() for n in lines[i + 1:] if n.strip()), title)  # the call's own reason
        elif text.startswith("Explanation:") and not explanation:
            explanation = text[len("Explanation:"):].strip()
        elif text.startswith("Hint:") and not hint:
            hint = text[len("Hint:"):].strip()
    site = Site(at.group("file"), int(at.group("line")), "")
    return site, GraphBreak(title or "graph break", explanation, hint)


class _Listener(logging.Handler):
    def __init__(self, watch: "CompileWatch"):
        super().__init__(logging.DEBUG)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        try:
            parsed = parse_break(record.getMessage())
        except Exception:
            return
        if parsed is not None:
            self.watch.located.append(parsed)


class CompileWatch:
    def __init__(self):
        self.active = False
        self.located: list = []       # (Site, GraphBreak) in the order dynamo logged them
        self._breaks_at_start: dict = {}
        self._failures_at_start: dict = {}
        self._loggers: list = []      # (logger, level, propagate) to restore
        self._listener = _Listener(self)

    def start(self) -> None:
        """Watches from now on. Dynamo is not imported for it (a seconds-long import): where
        nothing imported it yet, nothing was compiled, and the loggers, made by name, are the ones
        dynamo logs to once the first torch.compile call imports it."""
        if self.active:
            return
        counters, failures = _dynamo_state()
        if counters is not None:
            self._breaks_at_start = _break_counts(counters)
            self._failures_at_start = {code: len(reasons) for code, reasons in failures.items()}
        for name in _BREAK_LOGGERS:
            logger = logging.getLogger(name)
            self._loggers.append((logger, logger.level, logger.propagate))
            logger.addHandler(self._listener)
            if not logger.isEnabledFor(logging.DEBUG):
                logger.setLevel(logging.DEBUG)
                logger.propagate = False  # the user's handlers see only what they asked torch to log
        self.active = True

    def stop(self) -> Optional[CompileEvents]:
        """What happened since start (None when the watch never started)."""
        if not self.active:
            return None
        self.active = False
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._listener)
            logger.setLevel(level)
            logger.propagate = propagate
        self._loggers = []
        counters, failures = _dynamo_state()
        events = CompileEvents()
        if counters is None:
            return events
        new_breaks = sum(n > self._breaks_at_start.get(reason, 0) for reason, n in _break_counts(counters).items())
        events.breaks_before = len(self._breaks_at_start)
        for site, brk in self.located:
            key = (site, brk.title)
            known = events.breaks.get(key)
            events.breaks[key] = (brk, (known[1] if known else 0) + 1)
        if new_breaks and not events.breaks:
            events.breaks_before += new_breaks  # counted, but no line was logged for them
        for code, reasons in failures.items():
            before = self._failures_at_start.get(code, 0)
            if len(reasons) > before:
                site = Site(code.co_filename, code.co_firstlineno, code.co_name)
                events.recompiles[site] = (_function_name(code.co_name), [str(r) for r in reasons[before:]])
            else:
                events.recompiles_before += before
        return events


def _break_counts(counters) -> dict:
    """reason -> times, over dynamo's two tallies of what ended a graph: `graph_break` (a break
    inside a traced function) and `unimplemented` (one that restarted the frame's tracing, such as
    a branch on a tensor's value)."""
    counts = dict(counters["graph_break"])
    for reason, n in counters["unimplemented"].items():
        counts[reason] = counts.get(reason, 0) + n
    return counts


def _dynamo_state():
    """(counters, guard_failures) of torch._dynamo, or (None, None) where it was not imported."""
    if "torch._dynamo" not in sys.modules:
        return None, None
    try:
        from torch._dynamo.utils import counters, guard_failures
    except Exception:
        return None, None
    return counters, guard_failures


def _function_name(code_name: str) -> str:
    """`forward` for dynamo's `torch_dynamo_resume_in_forward_at_15` (the rest of a function after a break)."""
    found = re.match(r"torch_dynamo_resume_in_(.+)_at_\d+$", code_name)
    return found.group(1) if found else code_name
