"""The guard's report: a rich table at exit (stderr) and a ruff-shaped JSON file."""
from __future__ import annotations

import json
import os

from .cells import where
from .checks import rule_name


def findings_json(findings) -> list:
    """Ruff's fields plus the guard's; in a report merged from several ranks, each finding's
    `ranks` (the ranks that made it) and `estimated_savings_ms_by_rank`."""
    out = []
    for f in findings:
        data = f.to_json()
        if "ranks" in f.extra:
            data["ranks"] = f.extra["ranks"]
        if "savings_by_rank" in f.extra:
            data["estimated_savings_ms_by_rank"] = {str(r): ms for r, ms in f.extra["savings_by_rank"].items()}
        out.append(data)
    return out


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


def _per_step(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value or "")


def print_report(guard, console=None) -> None:
    from rich.console import Console
    from rich.text import Text

    from matlint.listing import Entry, print_hanging, print_listing

    from .ranks import merge_lines, rank_label

    if console is None:
        console = Console(stderr=True)
    rec = guard.recorder.rec
    merged, ranks = getattr(guard, "merged", None), getattr(guard, "ranks", None)
    ops = sum(s.count for s in rec.ops.values())
    sliced = getattr(guard, "sliced_into", 0)
    how = f" (after the warm-up step, each in {sliced} slices)" if sliced else ""
    summary = f"matlint guard: {rec.steps} step(s) observed{how}, {ops} ops"
    if merged is not None:
        summary = (f"matlint guard, {merged.world_size} ranks: "
                   + "; ".join(f"rank {r.rank}: {r.steps} step(s) observed, {r.ops} ops"
                               + (" (left with an exception)" if r.raised else "") for r in merged.reports))
    elif ranks is not None:
        summary = f"matlint guard, rank {ranks.rank} of {ranks.world_size}: {rec.steps} step(s) observed, {ops} ops"
    if rec.profiled:
        summary += f", {rec.kernels_total} CUDA kernels ({rec.triton_kernels} Triton)"
    compiled = sum(s.compiled for s in rec.ops.values())
    if compiled:
        summary += f", {compiled} ops from compiled regions"
    print_hanging(console, "", summary, 0)
    if guard.findings:
        rows, entries = [], []
        for f in guard.findings:
            ev = f.evidence or {}
            name, place = rule_name(f.code), where(f)
            module, per_step, share, saving = ev.get("module") or "", _per_step(ev.get("per_step")), "-", _saving(f)
            if ev.get("share_of_kernel_time") is not None:
                share = f"{ev['share_of_kernel_time']:.1%}"
            row = (f"{f.code}\n{name}", place, module, per_step, share, saving, _fix_line(f.message))
            # The list has room for the whole message, and says the numbers in words.
            facts = [module] if module else []
            if merged is not None:
                label = rank_label(f.extra.get("ranks", ()))
                row = row[:1] + (label.split(" ", 1)[1],) + row[1:]
                facts.insert(0, label)
            if per_step:
                facts.append(f"{per_step} per step")
            if share != "-":
                facts.append(f"{share} of kernel time")
            if saving != "-":
                facts.append("saving unsure" if saving == "unsure" else f"saves {saving} ms/step")
            rows.append(row)
            entries.append(Entry(f.code, Text.assemble((name, "bold"), "  ", place),
                                 (Text(", ".join(facts), "dim"), f.message)))
        headers = ("code", "where", "module", "per step", "share", "saves ms/step", "fix")
        if merged is not None:
            headers = headers[:1] + ("ranks",) + headers[1:]
        print_listing(console, headers, rows, entries)
    else:
        console.print("no findings")
    if merged is not None:
        notes = merge_lines(merged.reports, "notes")
        notes += [f"rank {r} sent no report within {merged.waited_s:g} s (it failed, or did not reach this "
                  f"guard's exit): its findings are missing" for r in merged.missing]
        errors, error_count = merge_lines(merged.reports, "errors"), sum(r.error_count for r in merged.reports)
    else:
        notes, errors, error_count = list(guard.notes), rec.errors, rec.error_count
    if rec.dropped_keys:
        notes.append(f"{rec.dropped_keys} ops not aggregated (distinct-key limit reached)")
    for note in notes:
        print_hanging(console, "note:", note, 6)
    if error_count:
        error = f"matlint guard: {error_count} internal error(s); the guarded code was not affected"
        print_hanging(console, "", Text(error, "red"), 0)
        for err in errors:
            print_hanging(console, "", err, 2)
    path = getattr(guard, "report_path", guard.json_path)
    if path:
        print_hanging(console, "JSON report:", path, 13)
