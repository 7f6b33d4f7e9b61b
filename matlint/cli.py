"""The `matlint` command line: check, rule, server, run.

Exit status: 0 no findings, 1 findings, 2 usage or configuration error. No Python traceback
reaches the user: `main` turns every failure into one line on stderr.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tokenize
from typing import Optional

from .config import ConfigError, load_settings
from .files import UsageError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
# Below this many files the run is over before a progress bar would be read.
PROGRESS_MIN_FILES = 100

OPTIONAL_COMMANDS = {
    # command: (module, extra that installs what it needs)
    "server": ("matlint.server", "server"),
    "run": ("matlint.runtime_guard.cli", "guard"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit is 2 too; keep the one-line message
        self.print_usage(sys.stderr)
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .reporters import FORMATS

    parser = _Parser(prog="matlint", description="A linter for PyTorch model code.")
    parser.add_argument("--version", action="version", version=f"matlint {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = commands.add_parser("check", help="lint files and directories (default: .)")
    check.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to lint")
    for name, what in (("select", "enable (replaces the config's selection)"), ("ignore", "disable"),
                       ("extend-select", "enable in addition"), ("extend-ignore", "disable in addition")):
        check.add_argument(f"--{name}", action="append", metavar="CODES",
                           help=f"comma-separated rule codes or prefixes (ALL, MAT, MAT1, MAT101) to {what}")
    check.add_argument("--format", choices=FORMATS, default="full", help="output format (default: full)")
    check.add_argument("--output-format", dest="format", choices=FORMATS, help=argparse.SUPPRESS)
    check.add_argument("--output-file", "-o", metavar="FILE", help="write the report to FILE")
    check.add_argument("--statistics", action="store_true", help="print the number of findings per rule")
    check.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    check.add_argument("--jobs", "-j", type=int, metavar="N", help="worker processes (default: all cores)")
    check.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    check.add_argument("--config", metavar="FILE", help="use this config file instead of the nearest pyproject.toml")
    check.add_argument("--fix", action="store_true", help="apply safe fixes and write the files")
    check.add_argument("--unsafe-fixes", action="store_true", help="also apply (or offer) unsafe fixes")
    check.add_argument("--diff", action="store_true", help="print the fixes as a diff; change nothing")
    check.add_argument("--quiet", "-q", action="store_true", help="print findings only, no summary or progress")

    rule = commands.add_parser("rule", help="list the rules, or show one rule's docs")
    rule.add_argument("code", nargs="?", metavar="CODE", help="a rule code or name, e.g. MAT101")

    commands.add_parser("server", help="run the language server (LSP over stdio)", add_help=False)
    commands.add_parser("run", help="run a script under the runtime guard", add_help=False)
    return parser


# -- check ----------------------------------------------------------------------------

class Output:
    """Where the report goes: a file, or stdout (colored when it is a terminal)."""

    def __init__(self, output_file: Optional[str]):
        try:
            self.file = open(output_file, "w", encoding="utf-8") if output_file else None
        except OSError as exc:
            raise UsageError(f"cannot write --output-file {output_file}: {exc.strerror or exc}") from None
        self.stream = self.file or sys.stdout
        self.color = self.file is None and _is_terminal(sys.stdout)
        self._console = None

    def write(self, text: str) -> None:
        self.stream.write(text)

    def lines(self, lines) -> None:
        from .reporters import plain

        if not self.color:
            self.stream.write(plain(lines))
            return
        from rich.text import Text

        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False, soft_wrap=True)
        for line in lines:
            self._console.print(Text.assemble(*line) if line else "")

    def close(self) -> None:
        if self.file:
            self.file.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _lint(found, settings, args):
    from .runner import lint_discovered

    files = found.files
    show_progress = not args.quiet and len(files) >= PROGRESS_MIN_FILES and _is_terminal(sys.stderr)
    if not show_progress:
        return lint_discovered(found, settings, use_cache=not args.no_cache, jobs=args.jobs)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("Linting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task("lint", total=len(files))
        return lint_discovered(found, settings, use_cache=not args.no_cache, jobs=args.jobs,
                               on_progress=lambda n: progress.advance(task, n))


def _read_for_fix(path: str):
    """(source, encoding) of a file that fixes may rewrite, or None when it cannot be read back exactly."""
    from .source import decode

    try:
        with open(path, "rb") as handle:
            data = handle.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except (OSError, SyntaxError):
        return None
    source, problem = decode(data, path)
    return None if problem else (source, encoding)


def _fix(findings: list, settings, args, out: Output):
    """Apply fixes file by file (with --diff, print them instead). Returns (remaining findings, number fixed)."""
    from .api import lint_text
    from .fixes import fix_until_stable, unified_diff
    from .notebook import NOTEBOOK_SUFFIX

    unsafe = args.unsafe_fixes
    fixable_files = sorted({f.filename for f in findings if f.fix and (f.fix.safe or unsafe)})
    by_file: dict = {}
    for finding in findings:
        by_file.setdefault(finding.filename, []).append(finding)
    fixed_total = 0
    for path in fixable_files:
        read = _read_for_fix(path)
        if read is None:
            continue
        source, encoding = read
        if path.endswith(NOTEBOOK_SUFFIX):
            new_source, fixed, remaining, diff = _fix_notebook(source, path, settings, unsafe)
        else:
            new_source, fixed, remaining = fix_until_stable(source, lambda text: lint_text(text, path, settings), unsafe)
            diff = unified_diff(source, new_source, path)
        if not fixed or new_source == source:
            continue
        fixed_total += fixed
        if args.diff:
            out.write(diff)
            continue
        try:
            with open(path, "wb") as handle:
                handle.write(new_source.encode(encoding))
        except OSError as exc:
            raise UsageError(f"cannot write fixes to {path}: {exc.strerror or exc}") from None
        by_file[path] = remaining
    remaining = [f for path in by_file for f in by_file[path]]
    return remaining, fixed_total


def _fix_notebook(text: str, path: str, settings, unsafe: bool):
    """(new text, fixes applied, findings left, diff of the changed cells) for a notebook: only
    the `source` of the cells that changed is rewritten."""
    from . import engine, notebook
    from .fixes import unified_diff
    from .runner import finalize

    book, error = engine.read_notebook(text, path)
    if error:
        return text, 0, [error], ""

    def lint(program):
        return finalize(engine.lint_program(program, path, settings.enabled_rules(), settings.rule_options),
                        path, settings)

    changed, fixed, remaining = notebook.fix(book, path, lint, unsafe)
    diff = "".join(unified_diff(book.cell(number).source, source, f"{path}:cell {number}")
                   for number, source in sorted(changed.items()))
    return book.with_sources(changed), fixed, remaining, diff


def _report(findings: list, args, out: Output) -> None:
    from . import reporters

    if args.statistics:
        if args.format == "json":
            out.write(reporters.statistics_json(findings, args.unsafe_fixes))
        else:
            out.lines(reporters.statistics_lines(findings, args.unsafe_fixes))
        return
    if args.format == "full":
        out.lines(reporters.full_lines(findings, args.unsafe_fixes))
    elif args.format == "concise":
        out.lines(reporters.concise_lines(findings, args.unsafe_fixes))
    elif args.format == "json":
        out.write(reporters.to_json(findings))
    elif args.format == "sarif":
        out.write(reporters.to_sarif(findings))
    elif args.format == "github":
        out.write(reporters.to_github(findings))


def _summary(lines, args, out: Output) -> None:
    """Summaries go with a human-readable report, and to stderr beside a machine-readable one."""
    from .reporters import plain

    if args.quiet:
        return
    if args.format in ("full", "concise") or args.statistics and args.format != "json":
        out.lines(lines)
    else:
        sys.stderr.write(plain(lines))


def run_check(args) -> int:
    from .files import find_files
    from .reporters import plural, summary_lines

    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    paths = args.paths or ["."]
    overrides = {key: getattr(args, key) for key in ("select", "ignore", "extend_select", "extend_ignore")}
    settings = load_settings(paths[0], config_file=args.config, cli_overrides=overrides)
    found = find_files(paths, settings)
    if not found.files and not found.problems and not args.quiet:
        sys.stderr.write("matlint: warning: no Python files found under the given paths\n")
    findings = _lint(found, settings, args)

    out = Output(args.output_file)
    try:
        fixed = 0
        if args.diff or args.fix:
            findings, fixed = _fix(findings, settings, args, out)
            if args.diff:
                if not args.quiet:
                    sys.stderr.write(f"Would fix {plural(fixed)}.\n" if fixed else "No findings would be fixed.\n")
                return EXIT_FINDINGS if fixed and not args.exit_zero else EXIT_OK
        _report(findings, args, out)
        lines = list(summary_lines(findings, args.unsafe_fixes))
        if fixed:
            lines.insert(0, [(f"Fixed {plural(fixed)}.", "")])
        _summary(lines, args, out)
    finally:
        out.close()
    return EXIT_FINDINGS if findings and not args.exit_zero else EXIT_OK


# -- rule -----------------------------------------------------------------------------

def run_rule(args) -> int:
    from rich.console import Console

    from .registry import all_rules, get_rule

    terminal = _is_terminal(sys.stdout)
    console = Console(highlight=False)
    if args.code:
        cls = get_rule(args.code)
        if cls is None:
            raise UsageError(f"unknown rule {args.code!r} (`matlint rule` lists them)")
        if terminal:
            from rich.markdown import Markdown

            console.print(Markdown(cls.rendered_docs()))
        else:
            sys.stdout.write(cls.rendered_docs())
        return EXIT_OK
    from rich.text import Text

    from .listing import Entry, print_listing

    rows, entries = [], []
    for cls in all_rules():
        default, fix = "on" if cls.default_enabled else "off", cls.fix_kind()
        if rows and rows[-1][2] != cls.family():
            entries.append(None)  # a blank line between families
        rows.append((cls.code, cls.name, cls.family(), cls.level(), default, fix, cls.summary))
        facts = ", ".join(filter(None, [cls.family(), cls.level(), fix and f"{fix} fix",
                                        default == "off" and "off by default"]))
        entries.append(Entry(cls.code, Text.assemble((cls.name, "bold"), "  ", (facts, "dim")), (cls.summary,)))
    print_listing(console, ("code", "name", "family", "severity", "default", "fix", "summary"), rows, entries,
                  title="matlint rules")
    return EXIT_OK


# -- server / run ------------------------------------------------------------------------

def run_optional(command: str, argv: list) -> int:
    import importlib

    module_name, extra = OPTIONAL_COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        sys.stderr.write(f"matlint {command}: needs extra packages ({exc}); "
                         f"install them with: pip install 'matlint[{extra}]'\n")
        return EXIT_USAGE
    result = module.main(argv)
    return result if isinstance(result, int) else EXIT_OK


# -- main -------------------------------------------------------------------------------

def _dispatch(argv: list) -> int:
    if argv and argv[0] in OPTIONAL_COMMANDS:
        return run_optional(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check":
        return run_check(args)
    if args.command == "rule":
        return run_rule(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def run() -> None:
    """The `matlint` command: `main`, then the process ends at once, its output flushed. Freeing
    what a run built (the parsed modules of every file it read) would take the interpreter
    seconds on a large tree, and nothing is left to read it."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away, or the stream is closed
            pass
    os._exit(code)


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _dispatch(argv)
    except (UsageError, ConfigError) as exc:
        sys.stderr.write(f"matlint: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("matlint: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`matlint check | head`): say nothing more.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_FINDINGS
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    except Exception as exc:  # the last line of defence: one line, never a traceback
        sys.stderr.write(f"matlint: internal error: {type(exc).__name__}: {exc} (please report this)\n")
        return EXIT_USAGE
