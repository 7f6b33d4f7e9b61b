"""`%load_ext matlint` in IPython or Jupyter.

`%%matlint [options]` runs the cell under the guard; `%matlint [options] statement` runs one
statement under it. The options are `matlint run`'s (`--select MAT1`, `--window 3`,
`--no-estimate`, ...). The report renders in the cell's output (rich renders HTML in a notebook,
text in a terminal) and its findings point at notebook cells (`cells.py`); the JSON report goes
where `--json` says, as with `matlint run`.
"""
from __future__ import annotations

import argparse
import shlex

from . import cells


REPORT_WIDTH = 100  # columns of the report in a cell: its list layout (the table needs more)


class MagicUsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise MagicUsageError(f"{self.prog}: {message}")


def _parser(line_form: bool) -> argparse.ArgumentParser:
    from .cli import add_guard_options

    parser = add_guard_options(_Parser(prog="%matlint" if line_form else "%%matlint", add_help=False))
    if line_form:
        parser.add_argument("statement", nargs=argparse.REMAINDER)
    return parser


def run_guarded(shell, line: str, cell=None):
    """The magic: runs the cell (or the line's statement) under the guard, then shows the report."""
    from .cli import guard_options
    from .session import Guard

    try:
        opts = _parser(cell is None).parse_args(shlex.split(line))
    except MagicUsageError as exc:
        print(exc)
        return None
    source = cell if cell is not None else " ".join(opts.statement)
    if not source.strip():
        print("%matlint: nothing to run: give a statement (`%matlint train_step()`) or use `%%matlint` on a cell")
        return None
    code = shell.transform_cell(source)
    name = shell.compile.cache(code, cells.running_count(shell), raw_code=source)
    guard = Guard(**guard_options(opts), report=False)
    with guard:
        exec(compile(code, name, "exec"), shell.user_ns)
    show_report(guard)
    return None


def show_report(guard, width: int = REPORT_WIDTH) -> None:
    """The report as the cell's output: HTML for a notebook, plain text (no terminal escapes) for
    a frontend that shows text, as one display."""
    import io

    from IPython.display import display
    from rich.console import Console

    from .report import print_report

    console = Console(record=True, file=io.StringIO(), width=width, force_terminal=True, force_jupyter=False)
    print_report(guard, console=console)
    display({"text/plain": console.export_text(clear=False), "text/html": console.export_html(inline_styles=True)},
            raw=True)


def load(shell) -> None:
    shell.register_magic_function(lambda line, cell=None: run_guarded(shell, line, cell),
                                  magic_kind="line_cell", magic_name="matlint")
    shell.events.register("pre_run_cell", cells.cell_started)
    shell.events.register("post_run_cell", cells.cell_finished)
