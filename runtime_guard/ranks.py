"""Guards on several ranks (torch.distributed, launched by `torchrun` or `mp.spawn`).

Each rank's guard observes its own steps and runs the checks on its own recording. At report time
(the guard's exit, or the decorator's last observed call) every rank sends what it found to rank 0
through the key-value store of the default process group, and rank 0 prints one report: a finding
that every rank made once, labelled `ranks 0-1`, and a finding that only some ranks made (or made
with other numbers) with the ranks that made it. The JSON report is rank 0's, each finding with its
`ranks`. The other ranks print and write nothing.

Why the store and not a collective (`gather_object`): a collective is reached by every rank or
hangs, and a guard's exit is not reached by every rank at once. A rank that raises inside the
window leaves through the guard's exit while the others wait in the step's own collectives (DDP's
gradient all-reduce) for it; a gather there would wait for them forever. A store key is written
without waiting for anyone: a rank sets its report and goes on, and only rank 0 waits, for at most
`rank_timeout_s` (a few seconds when rank 0 itself is leaving with an exception), then reports what
came and names the ranks whose report did not. No collective is issued, so nothing is added to the
collectives' order that the ranks must agree on.

The reports of one guard meet under a key made of the line that created it and how many reports
guards of that line made before on this rank: the same guard on every rank, as when every rank runs
the same script. A guard that only some ranks enter (`if rank == 0:`) wants `ranks="each"`: every
rank prints its own report, labelled with its rank, and writes its own JSON (`runtime.rank1.json`).
"""
from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

KEY_PREFIX = "matlint.guard"
RAISED_WAIT_S = 2.0     # rank 0 left with an exception: the others may be waiting for it
POLL_S = 0.005       # how often rank 0 looks for the reports it waits for
MODES = ("merged", "each")

_reports_by_line: dict = {}  # the line that created a guard -> reports made by guards of that line


@dataclass
class RankReport:
    """What one rank's guard found: its findings (checked, estimated and located on that rank) and
    what its report says besides them."""

    rank: int
    steps: int
    ops: int
    findings: list
    notes: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    error_count: int = 0
    raised: bool = False   # the guarded code left the window with an exception on this rank


@dataclass
class Merged:
    """Rank 0's view of all ranks' reports."""

    world_size: int
    reports: list          # RankReport per rank that sent one, by rank
    missing: list          # ranks whose report did not come
    waited_s: float = 0.0  # how long rank 0 would wait for them


class Ranks:
    """The rank, world size and store of the default process group, as a guard saw them."""

    def __init__(self, rank: int, world_size: int, store):
        self.rank, self.world_size, self.store = rank, world_size, store

    @classmethod
    def detect(cls) -> Optional["Ranks"]:
        """The default process group of more than one rank, or None (not distributed, one rank, or
        a group without a store)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        world_size = dist.get_world_size()
        if world_size < 2:
            return None
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
        except Exception:
            store = None
        return cls(dist.get_rank(), world_size, store)

    def key(self, line: str, count: int, rank: int) -> str:
        return f"{KEY_PREFIX}/{line}/{count}/rank{rank}"

    def exchange(self, report: RankReport, line: str, timeout_s: float) -> Optional[Merged]:
        """Send this rank's report; on rank 0 also wait for the others' (at most `timeout_s`, or
        RAISED_WAIT_S when rank 0 itself raised) and return them all. Raises where the store fails
        (the caller reports on its own then)."""
        count = _reports_by_line.get(line, 0)
        _reports_by_line[line] = count + 1
        if self.rank != 0:
            self.store.set(self.key(line, count, self.rank), pickle.dumps(report))
            return None
        reports, waiting = [report], set(range(1, self.world_size))
        wait_s = min(timeout_s, RAISED_WAIT_S) if report.raised else timeout_s
        deadline = time.monotonic() + wait_s
        while True:
            for rank in sorted(waiting):
                key = self.key(line, count, rank)
                if self.store.check([key]):
                    reports.append(pickle.loads(self.store.get(key)))
                    self.store.delete_key(key)
                    waiting.discard(rank)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        reports.sort(key=lambda r: r.rank)
        return Merged(self.world_size, reports, sorted(waiting), wait_s)


def creation_line() -> str:
    """`path:line` of the first frame outside matlint: where the guard was created."""
    package = sys.modules["matlint"]  # imported before any of its subpackages
    own = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
           os.path.dirname(os.path.abspath(package.__file__)) + os.sep, "<frozen")
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.abspath(frame.f_code.co_filename)}:{frame.f_lineno}"


def rank_label(ranks, world_size: Optional[int] = None) -> str:
    """`rank 1`, `ranks 0-1`, `ranks 0,2-3`: consecutive ranks as ranges."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def _identity(f) -> tuple:
    """Findings of two ranks are the same finding when the rule, the place and the message (with
    its counts) are the same; the measured savings may differ a little and are not compared."""
    return (f.code, f.filename, f.cell, f.row, f.column, f.message)


def merge_findings(reports: list) -> list:
    """One finding per identity, the lowest rank's, with `extra["ranks"]` the ranks that made it
    and `extra["savings_by_rank"]` their savings where any was estimated."""
    merged: dict = {}
    for report in reports:
        for f in report.findings:
            entry = merged.get(_identity(f))
            if entry is None:
                entry = merged[_identity(f)] = (f, [], {})
            entry[1].append(report.rank)
            if f.estimated_savings_ms is not None:
                entry[2][report.rank] = f.estimated_savings_ms
    findings = []
    for f, ranks, savings in merged.values():
        f.extra["ranks"] = ranks
        if savings:
            f.extra["savings_by_rank"] = savings
        findings.append(f)
    findings.sort(key=lambda f: (f.code, f.filename, f.row, f.extra["ranks"]))
    return findings


def merge_lines(reports: list, which: str) -> list:
    """The notes (or errors) of all ranks: one that every rank has, once; the rest with their ranks."""
    lines: dict = {}
    for report in reports:
        for line in getattr(report, which):
            lines.setdefault(line, []).append(report.rank)
    everyone = len(reports)
    return [line if len(ranks) == everyone else f"{rank_label(ranks)}: {line}" for line, ranks in lines.items()]


def rank_json_path(path: str, rank: int) -> str:
    """`runtime.json` -> `runtime.rank1.json`."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"
