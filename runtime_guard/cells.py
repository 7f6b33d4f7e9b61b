"""Findings in code that IPython ran, located in the notebook cell that holds it.

IPython compiles each cell under a name of its own (`<ipython-input-5-…>` in a terminal,
`/tmp/ipykernel_…/….py` in a Jupyter kernel) and remembers its execution count
(`shell.compile._filename_map`, which its tracebacks read for "Cell In[5]"). Frontends send the
cell's id with each execution (`pre_run_cell`'s `info.cell_id`); where the kernel knows its
notebook (VS Code's `__vsc_ipynb_file__`, Jupyter Server's `JPY_SESSION_NAME`) and the saved file
has cell ids, the finding gets the notebook's path and the cell's number in it (counting every
cell, as `matlint check` does); otherwise it keeps IPython's name and says `Cell In[5]`.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional


# Execution count -> the id of the cell that ran it, for the cells that have run.
_CELL_IDS: dict = {}
# The id of the cell running now (it has no execution count of its own until it has run).
_running_id: Optional[str] = None


def cell_started(info) -> None:
    """IPython's pre_run_cell callback (registered by `%load_ext matlint`)."""
    global _running_id
    _running_id = getattr(info, "cell_id", None)


def cell_finished(result) -> None:
    """IPython's post_run_cell callback."""
    cell_id = getattr(getattr(result, "info", None), "cell_id", None)
    if cell_id and getattr(result, "execution_count", None) is not None:
        _CELL_IDS[result.execution_count] = cell_id


def running_count(shell) -> int:
    """The execution count of the cell running now: the last one IPython compiled."""
    names = getattr(shell.compile, "_filename_map", None) or {}
    return max(names.values(), default=shell.execution_count)


def short_path(filename: str) -> str:
    """`filename` relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def running_shell():
    """The IPython shell this process runs in, if any (IPython is never imported here)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:
        return None


def _notebook_path(shell) -> Optional[str]:
    for candidate in (shell.user_ns.get("__vsc_ipynb_file__"), os.environ.get("JPY_SESSION_NAME")):
        if isinstance(candidate, str) and candidate.endswith(".ipynb") and os.path.isfile(candidate):
            return candidate
    return None


def _cell_numbers(path: str) -> dict:
    """{cell id: 1-based number of the cell in the saved notebook}."""
    try:
        with open(path, encoding="utf-8") as handle:
            cells = json.load(handle).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {cell["id"]: i + 1 for i, cell in enumerate(cells) if isinstance(cell, dict) and cell.get("id")}


def locate(findings: list) -> None:
    """Puts each finding of code that IPython ran in its cell (in place); does nothing outside
    IPython."""
    shell = running_shell()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None) if shell is not None else None
    if not names:
        return
    path = numbers = None
    running = running_count(shell)
    for f in findings:
        count = names.get(f.filename)
        if count is None:
            continue
        cell = {"execution_count": count}
        cell_id = _CELL_IDS.get(count) or (_running_id if count == running else None)
        if cell_id:
            cell["cell_id"] = cell_id
            if numbers is None:
                path = _notebook_path(shell)
                numbers = _cell_numbers(path) if path else {}
            if cell_id in numbers:
                f.filename, f.cell = short_path(path), numbers[cell_id]
        f.evidence = {**(f.evidence or {}), "cell": cell}


def where(finding) -> str:
    """`path:row`, `notebook.ipynb:cell 4:row`, or `Cell In[5]:row` as IPython's tracebacks say."""
    if finding.cell is not None:
        return f"{short_path(finding.filename)}:cell {finding.cell}:{finding.row}"
    cell = (finding.evidence or {}).get("cell")
    if cell:
        return f"Cell In[{cell['execution_count']}]:{finding.row}"
    return f"{short_path(finding.filename)}:{finding.row}"
