"""The guard's report: a rich table at exit (stderr) and a ruff-shaped JSON file."""
from __future__ import annotations

import json
import os

from .cells import where
from .checks import rule_title


def findings_json(findings) -> list:
    return [f.to_json() for f in findings]


def write_json(guard, path: str) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(findings_json(guard.findings), fh, indent=2, default=str)
    os.replace(tmp, path)


def _fix_line(message: str) -> str:
    return message.split(": ", 1)[1] if ": " in message else message


def _saving(f) -> str:
    """The table's saving: the number, or "unsure" where the estimate was not reliable (its
    interval too wide or reaching 0; the JSON report keeps it, labelled)."""
    if f.estimated_savings_ms is None:
        return "-"
    if (f.evidence or {}).get("estimate_reliable") is False:
        return "unsure"
    return f"{f.estimated_savings_ms:.3f}"


def print_report(guard, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(stderr=True)
        if not console.is_terminal:
            console = Console(stderr=True, width=160)
    rec = guard.recorder.rec
    ops = sum(s.count for s in rec.ops.values())
    summary = f"matlint guard: {rec.steps} step(s) observed, {ops} ops"
    if rec.profiled:
        summary += f", {rec.kernels_total} CUDA kernels ({rec.triton_kernels} Triton)"
    compiled = sum(s.compiled for s in rec.ops.values())
    if compiled:
        summary += f", {compiled} ops from compiled regions"
    console.print(summary)
    if guard.findings:
        table = Table(show_lines=False)
        for col in ("code", "where", "module", "per step", "share", "saves ms/step", "fix"):
            table.add_column(col, overflow="fold")
        for f in guard.findings:
            ev = f.evidence or {}
            share = ev.get("share_of_kernel_time")
            table.add_row(
                f"{f.code}\n{rule_title(f.code)[0]}",
                where(f),
                ev.get("module", "") or "",
                f"{ev.get('per_step', '')}",
                f"{share:.1%}" if share is not None else "-",
                _saving(f),
                _fix_line(f.message),
            )
        console.print(table)
    else:
        console.print("no findings")
    for note in guard.notes:
        console.print(f"note: {note}")
    if rec.dropped_keys:
        console.print(f"note: {rec.dropped_keys} ops not aggregated (distinct-key limit reached)")
    if rec.error_count:
        console.print(f"[red]matlint guard: {rec.error_count} internal error(s); the guarded code was not affected[/red]")
        for err in rec.errors:
            console.print(f"  {err}")
    if guard.json_path:
        console.print(f"JSON report: {guard.json_path}")
