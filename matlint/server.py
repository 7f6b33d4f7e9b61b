"""`matlint server`: the language server (LSP over stdio, pygls).

Lints open Python documents with the same engine and `[tool.matlint]` settings as the CLI,
publishes diagnostics (UTF-16 ranges, rule code and doc link), answers hovers with the rule's
docs, offers the rules' fixes, `# noqa` and fix-all as code actions, and shows the findings of
the runtime guard's JSON report at their source lines.

pygls is the `server` extra; it is imported only when the server starts.
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional
from urllib.parse import unquote

from . import __version__
from . import config as matlint_config
from .diagnostics import Finding, rule_url
from .engine import NOQA_RE, apply_noqa
from .source import parse_quietly, split_lines
from .fixes import apply_fixes, fix_until_stable
from .registry import get_rule, severity_of

SOURCE = "matlint"
RUNTIME_SOURCE = "matlint (runtime)"
FIX_ALL_KIND = "source.fixAll.matlint"
CHECK_WORKSPACE_COMMAND = "matlint.server.checkWorkspace"
DEFAULT_RUNTIME_REPORT = ".matlint/runtime.json"
# Documents longer than this (characters) are not linted live: minutes of linting per edit of a
# generated multi-megabyte file would hold up every other document. `matlint check` still lints them.
DEFAULT_MAX_DOCUMENT_SIZE = 2_000_000
MAX_MESSAGE_BYTES = 1 << 30  # a Content-Length above this is taken as garbage, not waited for
INSTALL_HINT = 'pip install "matlint[server]"'

log = logging.getLogger("matlint.server")
lsp = None  # lsprotocol.types, bound by _load_pygls()


def _load_pygls():
    """Imports pygls and returns the pygls server class matlint runs."""
    global lsp
    try:
        from lsprotocol import types
        from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
        from pygls.lsp.server import LanguageServer
        from pygls.protocol import LanguageServerProtocol
    except ImportError as exc:
        raise SystemExit(
            f"matlint server needs pygls and lsprotocol ({exc.name} is missing in {sys.executable}); "
            f"install them with: {INSTALL_HINT}") from None
    lsp = types

    class Protocol(LanguageServerProtocol):
        def structure_message(self, data):
            if "jsonrpc" in data and "method" in data and not isinstance(data["method"], str):
                if isinstance(data.get("id"), (int, str)):
                    self._send_response(data["id"], error=types.ResponseError(
                        code=types.ErrorCodes.InvalidRequest, message="the method must be a string"))
                raise JsonRpcInvalidRequest()
            if "jsonrpc" in data and "method" in data and "params" not in data:
                # JSON-RPC makes params optional; pygls's generic message types require it, so
                # an unknown method without params got an internal error, not MethodNotFound
                data = {**data, "params": None}
            try:
                return super().structure_message(data)
            except JsonRpcException as exc:
                # pygls drops a request whose params do not fit its type, leaving the client
                # waiting for ever: answer it with the error instead.
                if "method" in data and isinstance(data.get("id"), (int, str)):
                    self._send_response(data["id"], error=types.ResponseError(
                        code=exc.code, message=f"invalid params for {data['method']}: {exc.__cause__ or exc}"))
                raise

        def handle_message(self, message):
            if isinstance(message, dict):  # JSON, but no JSON-RPC message (no "jsonrpc" member)
                log.error("ignored a message that is not JSON-RPC 2.0: %.200s", message)
                if isinstance(message.get("id"), (int, str)) and "method" in message:
                    self._send_response(message["id"], error=types.ResponseError(
                        code=types.ErrorCodes.InvalidRequest, message="not a JSON-RPC 2.0 request"))
                return
            if not hasattr(message, "jsonrpc"):  # an array or a scalar
                log.error("ignored a message that is not a JSON object: %.200r", message)
                return
            return super().handle_message(message)

    class Server(LanguageServer):
        def start_io(self, stdin=None, stdout=None):
            return super().start_io(FramingRepair(stdin or sys.stdin.buffer), stdout)

        def report_server_error(self, error, source):
            # Into the log, not a pop-up per bad message.
            self.window_log_message(types.LogMessageParams(
                type=types.MessageType.Error, message=f"matlint server: {type(error).__name__}: {error}"))

    return Server, Protocol


class FramingRepair:
    """stdin as pygls reads it (header lines with readline, bodies with read), with the
    headers made robust. pygls accepts only a line that is exactly `Content-Length: N\\r\\n`:
    after one message whose Content-Length was wrong, the rest of its body and the next header
    arrive as one line, and every later message is lost the same way. Here a line that ends in
    a Content-Length header is that header (any case, any spacing), so reading resynchronises
    at the next message; a length too large to be real is dropped rather than waited for."""

    HEADER = re.compile(rb"content-length:[ \t]*(\d{1,12})[ \t]*\r?\n\Z", re.IGNORECASE)

    def __init__(self, stream):
        self.stream = stream

    def readline(self) -> bytes:
        line = self.stream.readline()
        match = self.HEADER.search(line)
        if match is None:
            return line
        length = int(match.group(1))
        if length > MAX_MESSAGE_BYTES:
            log.error("ignored a Content-Length of %d bytes", length)
            return b"X-Ignored-Content-Length: too large\r\n"
        if match.start() > 0:
            log.error("skipped %d bytes of garbage before a message header", match.start())
        return b"Content-Length: %d\r\n" % length

    def read(self, size: int = -1) -> bytes:
        return self.stream.read(size)


def _lint_text(source: str, path: str, settings) -> list:
    from .api import lint_text

    return lint_text(source, path, settings)


# -- positions ------------------------------------------------------------------------------
# Findings count 1-based rows and code-point columns; LSP counts 0-based lines and UTF-16 units
# (or what the client negotiated). Lines are split as Python splits them (\r\n, \r, \n), not
# with str.splitlines, which also breaks at \x0c and \u2028.

def to_position(lines, codec, row: int, column: int):
    row = min(max(row, 1), len(lines))
    line = lines[row - 1]
    column = min(max(column, 1), len(line) + 1)
    return lsp.Position(line=row - 1, character=codec.client_num_units(line[:column - 1]))


def to_range(lines, codec, row, column, end_row, end_column):
    start = to_position(lines, codec, row, column)
    end = to_position(lines, codec, end_row, end_column)
    if (end.line, end.character) < (start.line, start.character):
        end = start
    return lsp.Range(start=start, end=end)


def from_position(lines, codec, position) -> tuple:
    """(row, column), 1-based code points, of a client position."""
    if not lines or position.line >= len(lines):
        return len(lines) + 1, 1
    server = codec.position_from_client_units(
        lines, lsp.Position(line=position.line, character=position.character))
    return server.line + 1, server.character + 1


def _contains(finding: Finding, row: int, column: int) -> bool:
    start, end = (finding.row, finding.column), (finding.end_row, finding.end_column)
    if start == end:  # a point finding (syntax error) covers its line
        return row == finding.row
    return start <= (row, column) <= end


def _overlaps(finding: Finding, start: tuple, end: tuple) -> bool:
    if (finding.row, finding.column) == (finding.end_row, finding.end_column):
        return start[0] <= finding.row <= end[0]
    return (finding.row, finding.column) <= end and start <= (finding.end_row, finding.end_column)


# -- client settings ---------------------------------------------------------------------------

SEVERITIES = ("error", "warning", "information", "hint")


@dataclass
class ClientSettings:
    """The `matlint.*` settings of VS Code (or any client), for one workspace folder."""

    enable: bool = True
    severity: dict = field(default_factory=dict)
    runtime_report: str = DEFAULT_RUNTIME_REPORT
    max_document_size: int = DEFAULT_MAX_DOCUMENT_SIZE

    @classmethod
    def parse(cls, raw) -> "ClientSettings":
        raw = raw if isinstance(raw, dict) else {}
        severity = raw.get("severity")
        report = raw.get("runtimeReport")
        max_size = raw.get("maxDocumentSize")
        return cls(
            enable=raw.get("enable", True) is not False,
            severity={str(k).upper(): v for k, v in severity.items() if v in SEVERITIES}
            if isinstance(severity, dict) else {},
            runtime_report=report if isinstance(report, str) and report.strip() else DEFAULT_RUNTIME_REPORT,
            max_document_size=max_size if isinstance(max_size, int) and not isinstance(max_size, bool)
            and max_size > 0 else DEFAULT_MAX_DOCUMENT_SIZE,
        )

    def severity_of(self, code: str):
        matches = [k for k in self.severity if code.startswith(k)]
        if matches:
            name = self.severity[max(matches, key=len)]
        else:
            name = severity_of(code)
        return getattr(lsp.DiagnosticSeverity, name.capitalize())


# -- runtime report ---------------------------------------------------------------------------

def load_runtime_report(path: Path, base: Path) -> dict:
    """{resolved source path: [Finding]} from the guard's JSON report (a list of findings, or
    an object with a `findings` list). Raises ValueError naming what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    entries = data.get("findings") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of findings or an object with a `findings` list")
    by_file: dict = {}
    skipped = 0
    for entry in entries:
        try:
            if "end_location" not in entry:
                entry = dict(entry, end_location=entry["location"])
            finding = Finding.from_json(entry)
            if not isinstance(finding.row, int) or not isinstance(finding.column, int):
                raise TypeError("location must hold integers")
        except (KeyError, TypeError, AttributeError, ValueError):
            skipped += 1
            continue
        source = Path(finding.filename)
        if not source.is_absolute():
            source = base / source
        by_file.setdefault(_path_key(source), []).append(finding)
    if skipped:
        log.warning("%s: skipped %d malformed finding(s)", path, skipped)
    return by_file


def runtime_message(finding: Finding) -> str:
    measured = []
    if isinstance(finding.evidence, dict) and finding.evidence:
        measured.append(", ".join(f"{k}: {v}" for k, v in finding.evidence.items()))
    if isinstance(finding.estimated_savings_ms, (int, float)):
        measured.append(f"estimated saving {finding.estimated_savings_ms:.3g} ms")
    suffix = f" ({'; '.join(measured)})" if measured else ""
    return f"{finding.message} [measured at run time{suffix}]"


def _path_key(path) -> str:
    return os.path.normcase(os.path.realpath(os.fspath(path)))


# -- noqa ---------------------------------------------------------------------------------------

def noqa_edit(lines, row: int, code: str) -> Optional[tuple]:
    """(row, column, end_column, text) inserting `code` into the line's `# noqa` comment, or
    None where a comment cannot be added (the line continues with a backslash)."""
    if not 0 < row <= len(lines):
        return None
    line = lines[row - 1]
    match = NOQA_RE.search(line)
    if match and match.group("codes"):
        end = match.end("codes")
        return row, end + 1, end + 1, f", {code}"
    if match:  # a blanket noqa already silences everything
        return None
    stripped = line.rstrip()
    if stripped.endswith("\\"):
        return None
    return row, len(stripped) + 1, len(line) + 1, f"  # noqa: {code}"


def noqa_codes_at(line: str, column: int) -> Optional[list]:
    """The codes of the `# noqa: ...` comment under 1-based `column`: the one code under the
    cursor, or all of them when the cursor is on `# noqa`."""
    match = NOQA_RE.search(line)
    if not match or not match.group("codes") or not match.start() < column <= match.end():
        return None
    offset = match.start("codes")
    codes = []
    for part in match.group("codes").replace(",", " ").split(" "):
        if part:
            start = line.index(part, offset)
            if start < column <= start + len(part):
                return [part.upper()]
            codes.append(part.upper())
            offset = start + len(part)
    return codes


def rule_hover(code: str, messages=()) -> Optional[str]:
    rule = get_rule(code)
    if rule is None:
        return None
    parts = [f"**{code}** {m}" for m in messages]
    parts.append(rule.rendered_docs())
    parts.append(f"[{code} documentation]({rule_url(code)})")
    return "\n\n".join(parts)


# -- incremental linting ------------------------------------------------------------------------
# A full lint of a long file takes longer than typing allows. After an edit, the server first
# lints only what changed: the top-level functions and classes whose text differs from the last
# full lint are linted together with the module-level statements (imports, globals), the
# unchanged ones are blanked out (same line numbers) and their findings reused. A full lint in a
# worker process follows and replaces the result.

MAX_CHANGED_DEFINITIONS = 3
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _definition_spans(tree: ast.Module) -> list:
    """(first row, last row) of each top-level function or class, decorators included."""
    spans = []
    for node in tree.body:
        if isinstance(node, _DEFINITIONS):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.append((first, node.end_lineno))
    return spans


def _shift(finding: Finding, delta: int) -> Finding:
    fix = finding.fix
    if fix is not None:
        fix = replace(fix, edits=tuple(replace(e, row=e.row + delta, end_row=e.end_row + delta) for e in fix.edits))
    return replace(finding, row=finding.row + delta, end_row=finding.end_row + delta, fix=fix,
                   noqa_row=finding.noqa_row + delta if finding.noqa_row else None)


def definition_cache(source: str, findings: list) -> dict:
    """{text of a top-level definition: its findings, rows relative to the definition}."""
    try:
        tree = parse_quietly(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    lines = split_lines(source)
    cache = {}
    for first, last in _definition_spans(tree):
        inside = [f for f in findings if first <= f.row and f.end_row <= last
                  and (f.fix is None or all(first <= e.row and e.end_row <= last for e in f.fix.edits))]
        cache["\n".join(lines[first - 1:last])] = [_shift(f, 1 - first) for f in inside]
    return cache


_DEFINITION_START = re.compile(r"(?:async\s+def|def|class)\b")


def _definition_spans_text(lines) -> list:
    """`_definition_spans` read from the text alone (no parse: it must be cheaper than linting).
    Where it misreads (text at column 0 inside a multi-line string) the spans miss the cache and
    are linted, so a misreading costs time, not correctness."""
    spans, start, last_code, decorating = [], None, 0, False
    for row, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or line[0] in " \t#)]}":
            if stripped and not stripped.startswith("#"):
                last_code = row
            continue
        if start is not None and not decorating:
            spans.append((start, last_code))
            start = None
        decorating = line.startswith("@")
        if start is None and (decorating or _DEFINITION_START.match(line)):
            start = row
        last_code = row
    if start is not None:
        spans.append((start, last_code))
    return spans


def quick_lint(source: str, path: str, settings, cache: dict):
    """(findings, complete) linting only the definitions not in `cache`; None when that is not
    worth it (many definitions changed, a syntax error). `complete`: nothing was reused."""
    lines = split_lines(source)
    reused, blanked, changed = [], [], 0
    for first, last in _definition_spans_text(lines):
        cached = cache.get("\n".join(lines[first - 1:last]))
        if cached is None:
            changed += 1
        else:
            reused.extend(_shift(f, first - 1) for f in cached)
            blanked.append((first, last))
    if changed > MAX_CHANGED_DEFINITIONS:
        return None
    if blanked:
        lines = list(lines)
        for first, last in blanked:
            lines[first - 1:last] = [""] * (last - first + 1)
        source = "\n".join(lines)
    findings = _lint_text(source, path, settings)
    if any(f.code in ("MAT001", "MAT002") for f in findings):
        return None  # a syntax error is the full lint's to report (it is quick to find)
    findings += reused
    findings.sort(key=Finding.sort_key)
    return findings, not blanked


def full_lint(source: str, path: str, settings) -> tuple:
    """(findings, definition_cache): what the worker process computes."""
    findings = _lint_text(source, path, settings)
    return findings, definition_cache(source, findings)


def notebook_lint(cells: list, path: str, settings) -> list:
    """Findings of a notebook's code cells, [(cell number, text)] in notebook order, located in
    their cells: what the worker process computes for an open notebook."""
    from . import engine, notebook
    from .runner import finalize

    program, problems = notebook.program_of(cells, path)
    findings = engine.lint_program(program, path, settings.enabled_rules(), settings.rule_options)
    return finalize(problems + findings, path, settings)


def _warm_up():
    """Initializes the worker process: its stdout is the editor's LSP stream, never write there."""
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from .registry import all_rules

    all_rules()


# -- the server ---------------------------------------------------------------------------------

@dataclass
class DocResult:
    version: Optional[int]
    source: str
    lines: list
    static: list
    runtime: list
    complete: bool = True  # False: a quick lint, a full one follows
    notice: Optional[str] = None  # shown as one information diagnostic on the first line
    python: Optional[str] = None  # a notebook cell's text as Python (its magics as placeholders)


class MatlintServer:
    def __init__(self):
        Server, Protocol = _load_pygls()
        self.ls = Server("matlint", __version__, protocol_cls=Protocol,
                         # Incremental: VS Code's client sends a notebook cell's edits as
                         # ranges whatever kind is asked for, and pygls applies a range
                         # as the whole text unless the kind is Incremental.
                         text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
                         notebook_document_sync=lsp.NotebookDocumentSyncOptions(notebook_selector=[
                             lsp.NotebookDocumentFilterWithCells(
                                 notebook="jupyter-notebook", cells=[lsp.NotebookCellLanguage(language="python")])],
                             save=True))
        self.init_options: dict = {}
        self.folder_settings: dict = {}   # folder uri -> ClientSettings
        self.config_cache: dict = {}      # directory -> (Settings, config mtime)
        self.reports: dict = {}           # report path -> (stat key, {path: [Finding]})
        self.results: dict = {}           # uri -> DocResult
        self.reported_problems: set = set()
        self.dirty: set = set()
        self.running: set = set()
        self.pool = None              # full lints run in a worker process: the quick path and
        self.definitions: dict = {}   # the requests never wait for the GIL; uri -> definition_cache
        self.cells: dict = {}         # cell document uri -> (notebook uri, cell number)
        self._register()

    # -- plumbing -------------------------------------------------------------------------
    def _register(self):
        ls, t = self.ls, lsp
        ls.feature(t.INITIALIZE)(_plain(self.on_initialize))
        ls.feature(t.INITIALIZED)(_plain(self.on_initialized))
        ls.feature(t.SHUTDOWN)(_plain(self.on_shutdown))
        ls.feature(t.TEXT_DOCUMENT_DID_OPEN)(_plain(self.on_open))
        ls.feature(t.TEXT_DOCUMENT_DID_CHANGE)(_plain(self.on_change))
        ls.feature(t.TEXT_DOCUMENT_DID_SAVE)(_plain(self.on_save))
        ls.feature(t.TEXT_DOCUMENT_DID_CLOSE)(_plain(self.on_close))
        ls.feature(t.NOTEBOOK_DOCUMENT_DID_OPEN)(_plain(self.on_notebook_change))
        ls.feature(t.NOTEBOOK_DOCUMENT_DID_CHANGE)(_plain(self.on_notebook_change))
        ls.feature(t.NOTEBOOK_DOCUMENT_DID_SAVE)(_plain(self.on_notebook_change))
        ls.feature(t.NOTEBOOK_DOCUMENT_DID_CLOSE)(_plain(self.on_notebook_close))
        ls.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)(_plain(self.on_configuration))
        ls.feature(t.WORKSPACE_DID_CHANGE_WATCHED_FILES)(_plain(self.on_watched_files))
        ls.feature(t.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(_plain(self.on_folders))
        ls.feature(t.TEXT_DOCUMENT_HOVER)(_plain(self.on_hover))
        ls.feature(t.TEXT_DOCUMENT_CODE_ACTION, t.CodeActionOptions(
            code_action_kinds=[t.CodeActionKind.QuickFix, FIX_ALL_KIND]))(_plain(self.on_code_action))
        ls.command(CHECK_WORKSPACE_COMMAND)(_plain(self.on_check_workspace))

    def log(self, message: str, kind=None):
        log.info(message)
        self.ls.window_log_message(lsp.LogMessageParams(type=kind or lsp.MessageType.Log, message=message))

    def problem(self, message: str):
        """A problem the user must fix (bad config, unreadable report): shown once, always logged."""
        self.log(message, lsp.MessageType.Error)
        if message not in self.reported_problems:
            self.reported_problems.add(message)
            self.ls.window_show_message(lsp.ShowMessageParams(type=lsp.MessageType.Error, message=f"matlint: {message}"))

    def folder_of(self, path: str) -> Optional[str]:
        """The uri of the workspace folder holding `path` (the innermost one)."""
        best, best_len = None, -1
        key = _path_key(path)
        for uri in self.ls.workspace.folders:
            root = _path_key(_uri_to_path(uri))
            if (key == root or key.startswith(root.rstrip(os.sep) + os.sep)) and len(root) > best_len:
                best, best_len = uri, len(root)
        return best

    def folder_root(self, folder_uri: Optional[str], path: str) -> Path:
        if folder_uri:
            return Path(_uri_to_path(folder_uri))
        if self.ls.workspace.root_path:
            return Path(self.ls.workspace.root_path)
        return Path(path).parent

    async def client_settings(self, folder_uri: Optional[str]) -> ClientSettings:
        if folder_uri in self.folder_settings:
            return self.folder_settings[folder_uri]
        settings = ClientSettings.parse(self.init_options)
        caps = self.ls.client_capabilities.workspace
        if caps is not None and caps.configuration:
            try:
                result = await self.ls.workspace_configuration_async(lsp.ConfigurationParams(
                    items=[lsp.ConfigurationItem(scope_uri=folder_uri, section="matlint")]))
                if result and isinstance(result[0], dict):
                    settings = ClientSettings.parse({**self.init_options, **result[0]})
            except Exception as exc:  # a client that fails the request: keep the initialization options
                self.log(f"workspace/configuration failed: {exc}", lsp.MessageType.Warning)
        self.folder_settings[folder_uri] = settings
        return settings

    def project_settings(self, path: str, folder_root: Path):
        """The `[tool.matlint]` settings that govern `path`, as the CLI would load them."""
        directory = os.path.dirname(path)
        cached = self.config_cache.get(directory)
        if cached is not None:
            settings, stamp = cached
            if settings.config_file is None or _stat_key(settings.config_file) == stamp:
                return settings
        try:
            settings = matlint_config.load_settings(directory)
        except matlint_config.ConfigError as exc:
            self.problem(f"{exc}; linting with the default settings until it is fixed")
            settings = matlint_config.Settings(root=str(folder_root))
            self.config_cache[directory] = (settings, None)
            return settings
        self.config_cache[directory] = (settings, _stat_key(settings.config_file) if settings.config_file else None)
        return settings

    def runtime_findings(self, path: str, folder_root: Path, client: ClientSettings, source: str) -> list:
        report = Path(os.path.expanduser(client.runtime_report))
        if not report.is_absolute():
            report = folder_root / report
        key = str(report)
        stamp = _stat_key(report)
        cached = self.reports.get(key)
        if cached is None or cached[0] != stamp:
            by_file: dict = {}
            if stamp is not None:
                try:
                    by_file = load_runtime_report(report, folder_root)
                    self.log(f"runtime report {report}: {sum(map(len, by_file.values()))} finding(s)")
                except (OSError, ValueError) as exc:
                    self.problem(f"cannot read the runtime report: {exc}")
            cached = self.reports[key] = (stamp, by_file)
        return apply_noqa(list(cached[1].get(_path_key(path), ())), source)

    # -- linting --------------------------------------------------------------------------------
    async def analyse(self, uri: str, quick: bool = False) -> Optional[DocResult]:
        doc = self.document(uri)
        if doc is None or not doc.uri.startswith("file:"):
            return None
        path = doc.path
        folder = self.folder_of(path)
        client = await self.client_settings(folder)
        if not client.enable:
            return DocResult(doc.version, doc.source, [], [], [])
        root = self.folder_root(folder, path)
        source, version = doc.source, doc.version
        if len(source) > client.max_document_size:
            notice = (f"matlint: not linted in the editor: {len(source):,} characters, above matlint.maxDocumentSize "
                      f"({client.max_document_size:,}); `matlint check` lints it")
            if self.results.get(uri) is None or self.results[uri].notice is None:
                self.log(f"{path}: {notice}", lsp.MessageType.Warning)
            return DocResult(version, source, split_lines(source), [], [], notice=notice)
        settings = self.project_settings(path, root)
        if quick:
            if uri not in self.definitions:
                return None
            outcome = quick_lint(source, path, settings, self.definitions[uri])
            if outcome is None:
                return None
            static, complete = outcome
            if complete:
                self.definitions[uri] = definition_cache(source, static)
        else:
            static, self.definitions[uri] = await self.full_lint(source, path, settings)
            complete = True
        runtime = self.runtime_findings(path, root, client, source)
        return DocResult(version, source, split_lines(source), static, runtime, complete)

    async def full_lint(self, source: str, path: str, settings) -> list:
        return await self.in_worker(full_lint, source, path, settings)

    async def in_worker(self, function, *args):
        """`function(*args)` in the worker process (here, if the worker died)."""
        loop = asyncio.get_running_loop()
        if self.pool is None:
            self.pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_warm_up)
        try:
            return await loop.run_in_executor(self.pool, function, *args)
        except BrokenProcessPool:
            self.log("the lint worker process died; starting another", lsp.MessageType.Warning)
            self.pool = None
            return function(*args)

    def diagnostics(self, result: DocResult, client: ClientSettings) -> list:
        codec = self.ls.workspace.position_codec
        out = []
        if result.notice:
            start = lsp.Position(line=0, character=0)
            out.append(lsp.Diagnostic(range=lsp.Range(start=start, end=start), message=result.notice,
                                      severity=lsp.DiagnosticSeverity.Information, source=SOURCE))
        for findings, source in ((result.static, SOURCE), (result.runtime, RUNTIME_SOURCE)):
            for f in findings:
                message = runtime_message(f) if source == RUNTIME_SOURCE else f.message
                out.append(lsp.Diagnostic(
                    range=to_range(result.lines, codec, f.row, f.column, f.end_row, f.end_column),
                    message=message,
                    severity=client.severity_of(f.code),
                    code=f.code,
                    code_description=lsp.CodeDescription(href=f.url),
                    source=source,
                    data={"fixable": f.fix is not None},
                ))
        return out

    async def lint_and_publish(self, uri: str, quick: bool = False):
        doc = self.document(uri)
        known = self.results.get(uri)
        if doc is None or (known is not None and known.complete and known.version == doc.version
                           and known.source == doc.source):
            return
        try:
            result = await self.analyse(uri, quick)
        except Exception as exc:  # never let one document take the server down
            log.exception("linting %s failed", uri)
            self.log(f"linting {uri} failed: {type(exc).__name__}: {exc}", lsp.MessageType.Error)
            return
        doc = self.document(uri)
        if result is None or doc is None or doc.version != result.version:
            return  # closed, or edited meanwhile: the next round publishes
        self.results[uri] = result
        client = await self.client_settings(self.folder_of(doc.path))
        self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=uri, version=result.version, diagnostics=self.diagnostics(result, client)))

    async def schedule(self, uri: str, lint=None):
        """Lint `uri` now (a text document, or with `lint` a notebook); edits arriving meanwhile
        are coalesced into one more round, so a burst of keystrokes costs at most two lints and
        the last version is always published."""
        lint = lint or self.lint_and_publish
        self.dirty.add(uri)
        if uri in self.running:
            return
        self.running.add(uri)
        try:
            while uri in self.dirty:
                self.dirty.discard(uri)
                await lint(uri)
        finally:
            self.running.discard(uri)

    # -- notebooks ------------------------------------------------------------------------------
    async def lint_notebook(self, notebook_uri: str):
        """Lints an open notebook's code cells as one program and publishes each cell's findings
        on that cell's document."""
        from . import notebook

        book = self.ls.workspace.get_notebook_document(notebook_uri=notebook_uri)
        if book is None or not notebook_uri.startswith("file:"):
            return
        path = _uri_to_path(notebook_uri)
        folder = self.folder_of(path)
        client = await self.client_settings(folder)
        cells = []
        for number, cell in enumerate(book.cells, 1):
            doc = self.document(cell.document)
            if cell.kind == lsp.NotebookCellKind.Code and doc is not None:
                cells.append((number, doc, cell.document))
                self.cells[doc.uri] = (notebook_uri, number)
        versions = [(doc.uri, doc.version, doc.source) for _, doc, _ in cells]
        static: list = []
        if client.enable:
            root = self.folder_root(folder, path)
            settings = self.project_settings(path, root)
            try:
                static = await self.in_worker(notebook_lint, [(n, doc.source) for n, doc, _ in cells], path, settings)
            except Exception as exc:  # never let one notebook take the server down
                log.exception("linting %s failed", notebook_uri)
                self.log(f"linting {notebook_uri} failed: {type(exc).__name__}: {exc}", lsp.MessageType.Error)
                return
            runtime = self.runtime_findings(path, root, client, "")
        else:
            runtime = []
        if versions != [(doc.uri, doc.version, doc.source) for _, doc, _ in cells]:
            return  # edited meanwhile: the next round publishes
        for number, doc, client_uri in cells:
            code = notebook.cell_code(number, doc.source)
            result = DocResult(doc.version, doc.source, split_lines(doc.source),
                               [f for f in static if f.cell == number],
                               apply_noqa([f for f in runtime if f.cell == number], doc.source),
                               python=code.text if code is not None else None)
            self.results[doc.uri] = result
            self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
                uri=client_uri, version=doc.version, diagnostics=self.diagnostics(result, client)))

    async def on_notebook_change(self, params):
        await self.schedule(params.notebook_document.uri, self.lint_notebook)

    def on_notebook_close(self, params):
        closed = {unquote(cell.uri) for cell in params.cell_text_documents}
        for uri in [uri for uri in self.cells if unquote(uri) in closed]:
            self.cells.pop(uri, None)
            self.results.pop(uri, None)
        for cell in params.cell_text_documents:
            self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[]))

    async def relint_all(self):
        self.results.clear()
        self.definitions.clear()
        notebooks = {notebook for notebook, _ in self.cells.values()}
        cells = {unquote(uri) for uri in self.cells}
        await asyncio.gather(*(self.schedule(uri) for uri in list(self.ls.workspace.text_documents) if uri not in cells),
                             *(self.schedule(uri, self.lint_notebook) for uri in notebooks))

    async def current(self, uri: str) -> Optional[DocResult]:
        """Findings for the document as it is now (lints again if an edit is not linted yet)."""
        doc = self.document(uri)
        if doc is None:
            return None
        result = self.results.get(doc.uri)
        if result is None or result.version != doc.version or result.source != doc.source:
            if doc.uri in self.cells:
                await self.lint_notebook(self.cells[doc.uri][0])
                return self.results.get(doc.uri)
            result = await self.analyse(uri, quick=True) or await self.analyse(uri)
        return result

    def document(self, uri: str):
        """The open document at `uri` (the workspace keys documents by their unquoted URI)."""
        return self.ls.workspace.text_documents.get(unquote(uri))

    # -- lifecycle and sync ---------------------------------------------------------------------
    def on_initialize(self, params):
        options = params.initialization_options
        self.init_options = options if isinstance(options, dict) else {}

    async def on_initialized(self, params):
        caps = self.ls.client_capabilities.workspace
        watch = caps.did_change_watched_files if caps else None
        if watch is None or not watch.dynamic_registration:
            return
        watchers = [lsp.FileSystemWatcher(glob_pattern="**/pyproject.toml"),
                    lsp.FileSystemWatcher(glob_pattern="**/*.json")]
        try:
            await self.ls.client_register_capability_async(lsp.RegistrationParams(registrations=[
                lsp.Registration(id="matlint-watch", method=lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                                 register_options=lsp.DidChangeWatchedFilesRegistrationOptions(watchers=watchers))]))
        except Exception as exc:
            self.log(f"could not register file watchers: {exc}", lsp.MessageType.Warning)

    def on_shutdown(self, params):
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

    async def on_open(self, params):
        await self.schedule(params.text_document.uri)

    async def on_change(self, params):
        uri = params.text_document.uri
        await asyncio.sleep(0.002)  # edits sent together are applied before any of them is linted
        doc = self.document(uri)
        if doc is None or doc.version != params.text_document.version:
            return  # a later edit came in: its own notification lints the text
        await self.lint_and_publish(uri, quick=True)
        await self.schedule(uri)

    async def on_save(self, params):
        uri = params.text_document.uri
        if uri.endswith("pyproject.toml"):
            self.config_cache.clear()
            await self.relint_all()
        else:
            await self.schedule(uri)

    def on_close(self, params):
        uri = params.text_document.uri
        self.results.pop(uri, None)
        self.definitions.pop(uri, None)
        self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    async def on_configuration(self, params):
        settings = params.settings
        if isinstance(settings, dict) and isinstance(settings.get("matlint"), dict):
            self.init_options = settings["matlint"]
        self.folder_settings.clear()
        await self.relint_all()

    async def on_watched_files(self, params):
        paths = {_path_key(_uri_to_path(c.uri)) for c in params.changes}
        config_changed = any(p.endswith("pyproject.toml") for p in paths)
        reports_changed = paths & {_path_key(p) for p in self.reports}
        if config_changed:
            self.config_cache.clear()
        if reports_changed:
            for report in [r for r in self.reports if _path_key(r) in reports_changed]:
                del self.reports[report]
        if config_changed or reports_changed:
            self.reported_problems.clear()
            await self.relint_all()

    async def on_folders(self, params):
        self.folder_settings.clear()
        self.config_cache.clear()
        await self.relint_all()

    # -- features -------------------------------------------------------------------------------
    async def on_hover(self, params):
        result = await self.current(params.text_document.uri)
        if result is None or not result.lines:
            return None
        codec = self.ls.workspace.position_codec
        row, column = from_position(result.lines, codec, params.position)
        if row > len(result.lines):
            return None
        codes = noqa_codes_at(result.lines[row - 1], column)
        if codes is not None:
            texts = [rule_hover(c) for c in codes]
        else:
            hits = [f for f in result.static + result.runtime if _contains(f, row, column)]
            by_code: dict = {}
            for f in hits:
                by_code.setdefault(f.code, []).append(
                    runtime_message(f) if f in result.runtime else f.message)
            texts = [rule_hover(code, messages) for code, messages in by_code.items()]
        texts = [t for t in texts if t]
        if not texts:
            return None
        return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value="\n\n---\n\n".join(texts)))

    async def on_code_action(self, params):
        uri = params.text_document.uri
        result = await self.current(uri)
        if result is None or not result.lines:
            return None
        doc = self.document(uri)
        codec = self.ls.workspace.position_codec
        only = params.context.only

        def wanted(kind: str) -> bool:
            return not only or any(kind == k or kind.startswith(f"{k}.") for k in only)

        start = from_position(result.lines, codec, params.range.start)
        end = from_position(result.lines, codec, params.range.end)
        path = _uri_to_path(self.cells[doc.uri][0]) if doc.uri in self.cells else doc.path
        client = await self.client_settings(self.folder_of(path))
        actions = []
        if wanted(lsp.CodeActionKind.QuickFix):
            for finding in result.static + result.runtime:
                if not _overlaps(finding, start, end):
                    continue
                diagnostic = self._diagnostic_for(result, finding, client)
                if finding.fix is not None and finding in result.static:
                    _, applied = apply_fixes(result.python or result.source, [finding], unsafe=True)
                    if applied:  # the fix leaves code that parses
                        fix = finding.fix
                        title = f"{fix.message} ({finding.code})" if fix.safe else \
                            f"{fix.message} ({finding.code}, unsafe fix: review the change)"
                        edits = [lsp.TextEdit(range=to_range(result.lines, codec, e.row, e.column, e.end_row, e.end_column),
                                              new_text=e.content) for e in fix.edits]
                        actions.append(lsp.CodeAction(
                            title=title, kind=lsp.CodeActionKind.QuickFix, diagnostics=[diagnostic],
                            is_preferred=fix.safe, edit=self._edit(doc, edits)))
                noqa = noqa_edit(result.lines, finding.noqa_row or finding.row, finding.code)
                if noqa is not None:
                    row, column, end_column, text = noqa
                    actions.append(lsp.CodeAction(
                        title=f"Disable {finding.code} for this line (# noqa: {finding.code})",
                        kind=lsp.CodeActionKind.QuickFix, diagnostics=[diagnostic],
                        edit=self._edit(doc, [lsp.TextEdit(
                            range=to_range(result.lines, codec, row, column, row, end_column), new_text=text)])))
        # Fix-all lints the file several times: only when asked for by kind (Source Action
        # menu, editor.codeActionsOnSave), not on every cursor move.
        if only and wanted(FIX_ALL_KIND) and doc.uri not in self.cells and any(
                f.fix is not None and f.fix.safe for f in result.static):
            settings = self.project_settings(doc.path, self.folder_root(self.folder_of(doc.path), doc.path))
            fixed, count, _ = fix_until_stable(result.source, lambda s: _lint_text(s, doc.path, settings))
            if count and fixed != result.source:
                whole = to_range(result.lines, codec, 1, 1, len(result.lines), len(result.lines[-1]) + 1)
                actions.append(lsp.CodeAction(
                    title=f"Fix all safe matlint findings ({count})", kind=FIX_ALL_KIND,
                    edit=self._edit(doc, [lsp.TextEdit(range=whole, new_text=fixed)])))
        return actions

    def _diagnostic_for(self, result: DocResult, finding: Finding, client: ClientSettings):
        runtime = finding in result.runtime
        return lsp.Diagnostic(
            range=to_range(result.lines, self.ls.workspace.position_codec,
                           finding.row, finding.column, finding.end_row, finding.end_column),
            message=runtime_message(finding) if runtime else finding.message,
            severity=client.severity_of(finding.code), code=finding.code,
            code_description=lsp.CodeDescription(href=finding.url),
            source=RUNTIME_SOURCE if runtime else SOURCE)

    @staticmethod
    def _edit(doc, edits):
        return lsp.WorkspaceEdit(document_changes=[lsp.TextDocumentEdit(
            text_document=lsp.OptionalVersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version),
            edits=edits)])

    async def on_check_workspace(self, *args):
        """Runs `matlint check` on every workspace folder and publishes the findings of the
        files that are not open (open ones show their live text). Returns the counts."""
        from .api import check

        open_paths = {_path_key(d.path) for d in self.ls.workspace.text_documents.values()}
        roots = [_uri_to_path(u) for u in self.ls.workspace.folders] or \
            ([self.ls.workspace.root_path] if self.ls.workspace.root_path else [])
        by_file: dict = {}
        for root in roots:
            try:
                found = await asyncio.to_thread(check, [root])
            except matlint_config.ConfigError as exc:
                self.problem(str(exc))
                continue
            for finding in found:
                # A notebook's findings are located in its cells, which are not this file's
                # rows: they are not published on the .ipynb file.
                if finding.cell is None:
                    by_file.setdefault(finding.filename, []).append(finding)
        for path, found in by_file.items():
            if _path_key(path) in open_paths:
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    source = handle.read()
            except OSError:
                source = ""
            client = await self.client_settings(self.folder_of(path))
            result = DocResult(None, source, split_lines(source), found, [])
            self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
                uri=Path(path).resolve().as_uri(), diagnostics=self.diagnostics(result, client)))
        count = sum(map(len, by_file.values()))
        self.log(f"matlint check: {count} finding(s) in {len(by_file)} file(s)")
        return {"files": len(by_file), "findings": count}


def _plain(method):
    """A function calling `method`: pygls marks handlers with attributes, which bound methods
    cannot carry."""
    if asyncio.iscoroutinefunction(method):
        async def handler(*args):
            return await method(*args)
    else:
        def handler(*args):
            return method(*args)
    return handler


def _stat_key(path) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _uri_to_path(uri: str) -> str:
    from pygls.uris import to_fs_path

    return to_fs_path(uri) or uri


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="matlint server", description="Run the matlint language server (LSP over stdio).")
    parser.add_argument("--stdio", action="store_true", help="speak LSP over stdin/stdout (the default and only transport)")
    parser.add_argument("--log-file", help="also write the server's log to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(filename=args.log_file, level=logging.INFO if args.log_file else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = MatlintServer()
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    server.ls.start_io()
    return 0


if __name__ == "__main__":
    sys.exit(main())
