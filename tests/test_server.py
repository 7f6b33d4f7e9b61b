"""The language server end to end: a pytest-lsp client with VS Code's capabilities talks to
`python -m matlint.server` over stdio."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pygls")
pytest_lsp = pytest.importorskip("pytest_lsp")

from lsprotocol import types as t  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402

from pygls.protocol import default_converter  # noqa: E402

from matlint.diagnostics import rule_url  # noqa: E402
from matlint.registry import all_rules, get_rule  # noqa: E402


SERVER = [sys.executable, "-m", "matlint.server"]

# One MAT101 finding (a matmul per loop item) on line 6, after two characters that UTF-16
# counts differently from code points (an astral emoji is 2 units, é is 1).
LOOP = textwrap.dedent("""\
    import torch
    x = torch.randn(4, 3, 3)
    w = torch.randn(3, 3)
    ys = []
    for i in range(4):
        t = "😀é"; ys.append(x[i] @ w)
    """)


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def write_project(root: Path, table: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f"[project]\nname = 'p'\n\n[tool.matlint]\n{table}\n", encoding="utf-8")
    return root


@pytest.fixture
def workspace(tmp_path):
    """Two workspace folders with their own [tool.matlint]: `a` has the defaults, `b` ignores MAT101."""
    write_project(tmp_path / "a")
    write_project(tmp_path / "b", 'ignore = ["MAT101"]')
    return tmp_path


def make_client() -> LanguageClient:
    """pytest-lsp's client, also recording the version of published diagnostics and the
    server's dynamic registrations."""
    from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

    client = LanguageClient(converter_factory=default_converter)
    client.versions, client.publish_counts, client.registrations = {}, {}, []

    def publish_diagnostics(client: LanguageClient, params: t.PublishDiagnosticsParams):
        client.diagnostics[params.uri] = params.diagnostics
        client.versions[params.uri] = params.version
        client.publish_counts[params.uri] = client.publish_counts.get(params.uri, 0) + 1

    def register_capability(client: LanguageClient, params: t.RegistrationParams):
        client.registrations.extend(params.registrations)

    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES,
                                   t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: publish_diagnostics,
                                   t.CLIENT_REGISTER_CAPABILITY: register_capability})
    return client


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER, client_factory=make_client))
async def client(lsp_client: LanguageClient, workspace):
    lsp_client.set_configuration({"matlint": {"severity": {"MAT5": "information"}}})
    lsp_client.set_configuration({"matlint": {"severity": {"MAT1": "error"}}},
                                 scope_uri=(workspace / "b").as_uri())
    await lsp_client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=workspace.as_uri(),
        workspace_folders=[t.WorkspaceFolder(uri=(workspace / n).as_uri(), name=n) for n in ("a", "b")],
    ))
    yield
    await lsp_client.shutdown_session()


# -- a little editor ----------------------------------------------------------------------------

class _AppliesEdits:
    """Applies a workspace edit as VS Code does (checking the document version) and sends it with
    the editor's `change`."""

    def apply(self, edit: t.WorkspaceEdit) -> str:
        (change,) = edit.document_changes
        uri = change.text_document.uri
        assert change.text_document.version == self.versions[uri]
        text = apply_text_edits(self.texts[uri], change.edits)
        self.change(uri, text)
        return text


class Editor(_AppliesEdits):
    """Keeps the client-side text of documents and sends the notifications VS Code sends."""

    def __init__(self, client: LanguageClient):
        self.client = client
        self.texts: dict = {}
        self.versions: dict = {}
        self.seen: dict = {}  # uri -> number of publications already returned

    def open(self, path: Path, text: str) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        uri = path.as_uri()
        self.texts[uri], self.versions[uri] = text, 1
        self.client.text_document_did_open(t.DidOpenTextDocumentParams(
            text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        return uri

    def change(self, uri: str, text: str) -> int:
        self.versions[uri] += 1
        self.texts[uri] = text
        self.client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
            content_changes=[t.TextDocumentContentChangeWholeDocument(text=text)]))
        return self.versions[uri]

    async def diagnostics(self, uri: str, version=None, timeout: float = 10.0) -> list:
        """The next diagnostics published for `uri` (for `version` when given) that this
        editor has not returned yet."""
        def ready():
            count = self.client.publish_counts.get(uri, 0)
            if count > self.seen.get(uri, 0) and (version is None or self.client.versions.get(uri) == version):
                self.seen[uri] = count
                return True
            return False

        async def wait():
            while not ready():
                await self.client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
            return list(self.client.diagnostics[uri])
        return await asyncio.wait_for(wait(), timeout)


def offset_of(text: str, position: t.Position) -> int:
    """Character offset of a UTF-16 position (lines split at \\r\\n, \\r, \\n as LSP does)."""
    import re

    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    start = starts[position.line]
    units = 0
    index = start
    while units < position.character:
        units += utf16(text[index])
        index += 1
    return index


def apply_text_edits(text: str, edits) -> str:
    spans = sorted(((offset_of(text, e.range.start), offset_of(text, e.range.end), e.new_text) for e in edits),
                   reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


@pytest.fixture
def editor(client):
    return Editor(client)


def by_code(diagnostics, code):
    return [d for d in diagnostics if d.code == code]


async def code_actions(client, uri, diagnostic=None, only=None, rng=None):
    rng = rng or diagnostic.range
    return await client.text_document_code_action_async(t.CodeActionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), range=rng,
        context=t.CodeActionContext(diagnostics=[diagnostic] if diagnostic else [], only=only)))


# -- diagnostics ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_diagnostics_have_utf16_ranges_code_link_and_source(client, editor, workspace):
    uri = editor.open(workspace / "a" / "model.py", LOOP)
    diagnostics = await editor.diagnostics(uri, version=1)
    (d,) = by_code(diagnostics, "MAT101")
    line = LOOP.splitlines()[5]
    start = line.index("x[i] @ w")
    assert d.range.start == t.Position(line=5, character=utf16(line[:start]))
    assert d.range.end == t.Position(line=5, character=utf16(line[:start + len("x[i] @ w")]))
    assert utf16(line[:start]) == start + 1  # the emoji really shifts the UTF-16 column
    assert d.source == "matlint"
    assert d.code_description.href == rule_url("MAT101")
    assert d.severity == t.DiagnosticSeverity.Warning
    assert "once per iteration" in d.message


@pytest.mark.asyncio
async def test_syntax_error_is_an_error_diagnostic_and_clears_when_fixed(client, editor, workspace):
    broken = "import torch\ndef f(x)\n    return x @ x\n"
    uri = editor.open(workspace / "a" / "broken.py", broken)
    (d,) = await editor.diagnostics(uri, version=1)
    assert (d.code, d.severity, d.range.start.line) == ("MAT001", t.DiagnosticSeverity.Error, 1)
    version = editor.change(uri, broken.replace("(x)", "(x):"))
    assert await editor.diagnostics(uri, version=version) == []


@pytest.mark.asyncio
async def test_last_edit_of_a_burst_is_published(client, editor, workspace):
    uri = editor.open(workspace / "a" / "burst.py", "import torch\n")
    await editor.diagnostics(uri, version=1)
    for n in range(8):
        version = editor.change(uri, LOOP + "#" * n + "\n")
    diagnostics = await editor.diagnostics(uri, version=version)
    assert [d.code for d in diagnostics] == ["MAT101"]


@pytest.mark.asyncio
async def test_an_edit_is_answered_quickly_then_confirmed_by_a_full_lint(client, editor, workspace):
    """After an edit, the definitions that did not change keep their findings and only the
    edited one is linted again (a first, quick publication); a full lint follows."""
    from matlint.api import lint_text

    example = get_rule("MAT101").examples[0].code
    assert example.startswith("import torch\ndef f(")
    body = example[len("import torch\n"):]
    source = "import torch\n" + "\n".join(body.replace("def f(", f"def f{n}(") for n in range(4))
    uri = editor.open(workspace / "a" / "multi.py", source)
    first = await editor.diagnostics(uri, version=1)
    assert len(by_code(first, "MAT101")) == 4

    lines = source.split("\n")
    row = lines.index("def f2(x, w, B):") + 1
    lines[row] += "  # edited"
    edited = "\n".join(lines)
    version = editor.change(uri, edited)
    expected = sorted((f.code, f.row - 1, f.message) for f in lint_text(edited, str(workspace / "a" / "multi.py")))
    quick = await editor.diagnostics(uri, version=version)
    assert sorted((d.code, d.range.start.line, d.message) for d in quick) == expected
    full = await editor.diagnostics(uri, version=version)
    assert sorted((d.code, d.range.start.line, d.message) for d in full) == expected


@pytest.mark.asyncio
async def test_config_is_per_workspace_folder_and_reloaded(client, editor, workspace):
    uri_a = editor.open(workspace / "a" / "m.py", LOOP)
    uri_b = editor.open(workspace / "b" / "pkg" / "m.py", LOOP)
    assert [d.code for d in await editor.diagnostics(uri_a, version=1)] == ["MAT101"]
    assert await editor.diagnostics(uri_b, version=1) == []
    for _ in range(50):  # the registration is an asynchronous request of the server's
        if client.registrations:
            break
        await asyncio.sleep(0.1)
    (watch,) = [r for r in client.registrations if r.method == t.WORKSPACE_DID_CHANGE_WATCHED_FILES]
    globs = [w["globPattern"] for w in watch.register_options["watchers"]]
    assert "**/pyproject.toml" in globs

    write_project(workspace / "b", "")
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[
        t.FileEvent(uri=(workspace / "b" / "pyproject.toml").as_uri(), type=t.FileChangeType.Changed)]))
    (d,) = await editor.diagnostics(uri_b, version=1)
    assert d.code == "MAT101"
    assert d.severity == t.DiagnosticSeverity.Error  # folder b's client setting: MAT1 -> error


@pytest.mark.asyncio
async def test_bad_config_is_reported_and_linting_goes_on(client, editor, workspace):
    write_project(workspace / "c", 'select = ["NOPE"]')
    uri = editor.open(workspace / "c" / "m.py", LOOP)
    diagnostics = await editor.diagnostics(uri, version=1)
    assert [d.code for d in diagnostics] == ["MAT101"]  # linted with the defaults
    (message,) = [m for m in client.messages if m.type == t.MessageType.Error]
    assert "select" in message.message and str(workspace / "c" / "pyproject.toml") in message.message


@pytest.mark.asyncio
async def test_client_severity_setting(client, editor, workspace):
    source = textwrap.dedent(get_rule("MAT502").examples[0].code)
    uri = editor.open(workspace / "a" / "train.py", source)
    diagnostics = await editor.diagnostics(uri, version=1)
    assert diagnostics and {d.severity for d in by_code(diagnostics, "MAT502")} == {t.DiagnosticSeverity.Information}


# -- hover --------------------------------------------------------------------------------------

async def hover(client, uri, line, character):
    return await client.text_document_hover_async(t.HoverParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line, character=character)))


@pytest.mark.asyncio
async def test_hover_on_a_finding_shows_the_rule_docs(client, editor, workspace):
    uri = editor.open(workspace / "a" / "m.py", LOOP)
    (d,) = await editor.diagnostics(uri, version=1)
    result = await hover(client, uri, d.range.start.line, d.range.start.character + 2)
    rule = get_rule("MAT101")
    assert result.contents.kind == t.MarkupKind.Markdown
    assert rule.summary in result.contents.value
    assert "## Use instead" in result.contents.value
    assert d.message in result.contents.value
    assert await hover(client, uri, 1, 2) is None  # `x = torch.randn`: no finding there


@pytest.mark.asyncio
async def test_hover_on_a_noqa_comment_shows_the_named_rules(client, editor, workspace):
    source = "import torch\nx = 1  # noqa: MAT502, MAT101\n"
    uri = editor.open(workspace / "a" / "n.py", source)
    await editor.diagnostics(uri, version=1)
    line = source.splitlines()[1]
    on_502 = await hover(client, uri, 1, line.index("MAT502") + 3)
    assert get_rule("MAT502").summary in on_502.contents.value
    assert get_rule("MAT101").summary not in on_502.contents.value
    on_noqa = await hover(client, uri, 1, line.index("noqa"))
    assert get_rule("MAT502").summary in on_noqa.contents.value
    assert get_rule("MAT101").summary in on_noqa.contents.value


# -- code actions -----------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_noqa_action_silences_the_finding(client, editor, workspace):
    uri = editor.open(workspace / "a" / "m.py", LOOP)
    (d,) = await editor.diagnostics(uri, version=1)
    actions = await code_actions(client, uri, d)
    (noqa,) = [a for a in actions if "noqa" in a.title]
    assert noqa.kind == t.CodeActionKind.QuickFix
    text = editor.apply(noqa.edit)
    assert text.splitlines()[5].endswith("  # noqa: MAT101")
    assert await editor.diagnostics(uri, version=editor.versions[uri]) == []


def _examples_with_fix(safe: bool):
    for rule in all_rules():
        for example in rule.examples:
            if example.fixed is not None and example.unsafe != safe and len(example.expect) == 1:
                yield rule, example


async def _check_fix_action(client, editor, workspace, safe: bool):
    cases = list(_examples_with_fix(safe))
    if not cases:
        pytest.skip(f"no rule has an example with a single {'safe' if safe else 'unsafe'} fix yet")
    for n, (rule, example) in enumerate(cases):
        uri = editor.open(workspace / "a" / f"fix_{n}.py", example.code)
        diagnostics = by_code(await editor.diagnostics(uri, version=1), rule.code)
        (d,) = diagnostics
        actions = [a for a in await code_actions(client, uri, d, only=[t.CodeActionKind.QuickFix])
                   if "noqa" not in a.title]
        (action,) = actions
        assert action.kind == t.CodeActionKind.QuickFix
        assert bool(action.is_preferred) == safe
        assert ("unsafe" in action.title) != safe
        assert editor.apply(action.edit) == example.fixed_code
        after = await editor.diagnostics(uri, version=editor.versions[uri])
        assert not [x for x in by_code(after, rule.code) if x.range == d.range]


@pytest.mark.asyncio
async def test_unsafe_fix_is_labelled_and_applies(client, editor, workspace):
    await _check_fix_action(client, editor, workspace, safe=False)


@pytest.mark.asyncio
async def test_safe_fix_is_preferred_and_applies(client, editor, workspace):
    await _check_fix_action(client, editor, workspace, safe=True)


@pytest.mark.asyncio
async def test_fix_all_applies_every_safe_fix(client, editor, workspace):
    from matlint.api import lint_text
    from matlint.fixes import fix_until_stable

    cases = list(_examples_with_fix(True))
    if not cases:
        pytest.skip("no rule has a safe fix yet")
    source = cases[0][1].code
    uri = editor.open(workspace / "a" / "fixall.py", source)
    await editor.diagnostics(uri, version=1)
    actions = await code_actions(client, uri, rng=t.Range(start=t.Position(line=0, character=0),
                                                           end=t.Position(line=0, character=0)),
                                 only=["source.fixAll"])
    (action,) = actions
    assert action.kind == "source.fixAll.matlint"
    whole = t.Range(start=t.Position(line=0, character=0), end=t.Position(line=len(source.splitlines()), character=0))
    unasked = await code_actions(client, uri, rng=whole)
    assert unasked and not [a for a in unasked if a.kind == "source.fixAll.matlint"]
    expected, _, _ = fix_until_stable(source, lambda s: lint_text(s, "fixall.py"))
    assert editor.apply(action.edit) == expected
    after = await editor.diagnostics(uri, version=editor.versions[uri])
    assert not [d for d in after if d.code == cases[0][0].code]


@pytest.mark.asyncio
async def test_no_fix_all_without_safe_fixes(client, editor, workspace):
    uri = editor.open(workspace / "a" / "m.py", LOOP)
    await editor.diagnostics(uri, version=1)
    actions = await code_actions(client, uri, rng=t.Range(start=t.Position(line=0, character=0),
                                                           end=t.Position(line=6, character=0)),
                                 only=["source.fixAll"])
    assert list(actions) == []


# -- runtime report ---------------------------------------------------------------------------

def runtime_finding(filename, row, message="`aten::mm` ran 64 times per step", savings=12.5, **evidence):
    return {
        "code": "MAT101", "message": message, "filename": filename,
        "location": {"row": row, "column": 5}, "end_location": {"row": row, "column": 20},
        "fix": None, "url": rule_url("MAT101"), "noqa_row": row,
        "evidence": evidence or {"launches_per_step": 64, "shapes": "[3, 3] @ [3, 3]"},
        "estimated_savings_ms": savings,
    }


@pytest.mark.asyncio
async def test_runtime_report_is_shown_and_reloaded(client, editor, workspace):
    report = workspace / "a" / ".matlint" / "runtime.json"
    report.parent.mkdir()
    report.write_text(json.dumps([runtime_finding("train.py", 3)]), encoding="utf-8")
    source = "import os\nfor step in range(10):\n    out = step * 2\n"
    uri = editor.open(workspace / "a" / "train.py", source)
    (d,) = await editor.diagnostics(uri, version=1)
    assert d.source == "matlint (runtime)"
    assert d.range.start == t.Position(line=2, character=4)
    assert "measured at run time" in d.message
    assert "launches_per_step: 64" in d.message and "12.5 ms" in d.message
    assert d.code == "MAT101" and d.code_description.href == rule_url("MAT101")

    hover_text = (await hover(client, uri, 2, 6)).contents.value
    assert "launches_per_step: 64" in hover_text and get_rule("MAT101").summary in hover_text

    # The guard ran again: the report is an object now, with another finding.
    report.write_text(json.dumps({"version": 1, "findings": [
        runtime_finding(str(workspace / "a" / "train.py"), 2, message="per-step launches", savings=None,
                        launches_per_step=9)]}), encoding="utf-8")
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[
        t.FileEvent(uri=report.as_uri(), type=t.FileChangeType.Changed)]))
    (d,) = await editor.diagnostics(uri, version=1)
    assert d.range.start.line == 1 and "per-step launches" in d.message and "launches_per_step: 9" in d.message
    assert " ms" not in d.message

    # Deleted: its findings go away.
    report.unlink()
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[
        t.FileEvent(uri=report.as_uri(), type=t.FileChangeType.Deleted)]))
    assert await editor.diagnostics(uri, version=1) == []


@pytest.mark.asyncio
async def test_runtime_report_path_setting_and_noqa(client, editor, workspace):
    client.set_configuration({"matlint": {"runtimeReport": "out/guard.json"}},
                             scope_uri=(workspace / "a").as_uri())
    report = workspace / "a" / "out" / "guard.json"
    report.parent.mkdir()
    report.write_text(json.dumps([runtime_finding("t.py", 2), runtime_finding("t.py", 3)]), encoding="utf-8")
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=None))
    uri = editor.open(workspace / "a" / "t.py", "import os\nx = 1\ny = 2  # noqa: MAT101\n")
    (d,) = await editor.diagnostics(uri, version=1)
    assert d.range.start.line == 1 and d.source == "matlint (runtime)"


@pytest.mark.asyncio
async def test_malformed_runtime_report_is_reported_and_serving_goes_on(client, editor, workspace):
    report = workspace / "a" / ".matlint" / "runtime.json"
    report.parent.mkdir()
    report.write_text("{not json", encoding="utf-8")
    uri = editor.open(workspace / "a" / "m.py", LOOP)
    assert [d.code for d in await editor.diagnostics(uri, version=1)] == ["MAT101"]
    assert any("runtime report" in m.message and "not valid JSON" in m.message for m in client.messages)

    # Entries with missing fields are skipped, good ones shown.
    report.write_text(json.dumps([{"code": "MAT101"}, runtime_finding("m.py", 2)]), encoding="utf-8")
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[
        t.FileEvent(uri=report.as_uri(), type=t.FileChangeType.Changed)]))
    diagnostics = await editor.diagnostics(uri, version=1)
    assert sorted(d.source for d in diagnostics) == ["matlint", "matlint (runtime)"]


# -- robustness and commands ------------------------------------------------------------------

@pytest.mark.asyncio
async def test_odd_requests_and_broken_text_are_survived(client, editor, workspace):
    uri = editor.open(workspace / "a" / "m.py", LOOP)
    await editor.diagnostics(uri, version=1)
    # A document the server never saw, and a position past the end of the file.
    missing = (workspace / "a" / "never_opened.py").as_uri()
    assert await hover(client, missing, 0, 0) is None
    assert await hover(client, uri, 999, 999) is None
    # Garbage text (NUL bytes, lone surrogates cannot travel in JSON; NUL can).
    version = editor.change(uri, "import torch\n\x00\x00 def (((\n")
    (d,) = await editor.diagnostics(uri, version=version)
    assert d.code == "MAT001"
    version = editor.change(uri, LOOP)
    assert [d.code for d in await editor.diagnostics(uri, version=version)] == ["MAT101"]


@pytest.mark.asyncio
async def test_check_workspace_command_publishes_closed_files(client, editor, workspace):
    (workspace / "a" / "closed.py").write_text(LOOP, encoding="utf-8")
    (workspace / "a" / "clean.py").write_text("import torch\n", encoding="utf-8")
    (workspace / "b" / "closed.py").write_text(LOOP, encoding="utf-8")  # folder b ignores MAT101
    uri = editor.open(workspace / "a" / "open.py", LOOP)
    await editor.diagnostics(uri, version=1)
    version = editor.change(uri, "import torch\n")  # its live text has no finding; the file on disk has one
    assert await editor.diagnostics(uri, version=version) == []
    result = await client.workspace_execute_command_async(t.ExecuteCommandParams(
        command="matlint.server.checkWorkspace", arguments=[]))
    assert result == {"files": 2, "findings": 2}  # a/closed.py and a/open.py, as `matlint check` says
    assert [d.code for d in client.diagnostics[(workspace / "a" / "closed.py").as_uri()]] == ["MAT101"]
    assert (workspace / "b" / "closed.py").as_uri() not in client.diagnostics
    assert (workspace / "a" / "clean.py").as_uri() not in client.diagnostics
    assert list(client.diagnostics[uri]) == []  # the open document keeps its live diagnostics


# -- abuse over raw stdio (benchmarks/server_stress.py's client and scenarios, at CI size) -------------

def _load_stress():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "server_stress.py"
    spec = importlib.util.spec_from_file_location("matlint_bench_server_stress", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stress = _load_stress()


@pytest.fixture
def raw_server(tmp_path):
    write_project(tmp_path)
    client = stress.LspProcess(tmp_path)
    yield client
    assert client.close() == 0


BODY = b'{"jsonrpc": "2.0", "id": 900, "method": "matlint/noSuchMethod", "params": {}}'
NOT_JSON_RPC = b'{"id": 901, "method": "textDocument/hover", "params": {}}'

# (what is sent, the error code it must get as response 900 or 901 when it is answered)
MALFORMED = {
    "not json": (b"Content-Length: 17\r\n\r\n{this is not json", None),
    "invalid utf-8": (stress.frame(b'{"jsonrpc": "2.0", "method": "\xff\xfe"}'), None),
    "a json array": (stress.frame(b"[1, 2, 3]"), None),
    "content-length too short": (b"Content-Length: 5\r\n\r\n" + BODY, None),
    "no content-length": (BODY + b"\r\n\r\n", None),
    "non-numeric content-length": (b"Content-Length: many\r\n\r\n" + BODY, None),
    "absurd content-length": (b"Content-Length: 99999999999\r\n\r\n" + BODY, None),
    "lower-case header": (b"content-length: %d\r\n\r\n" % len(BODY) + BODY, -32601),
    "no jsonrpc member": (stress.frame(NOT_JSON_RPC), -32600),
    "method of the wrong type": (stress.frame({"jsonrpc": "2.0", "id": 900, "method": 5}), -32600),
    "unknown request without params": (stress.frame({"jsonrpc": "2.0", "id": 900, "method": "matlint/x"}), -32601),
    "unknown notification": (stress.frame({"jsonrpc": "2.0", "method": "matlint/x", "params": {}}), None),
    "unknown $/ notification": (stress.frame({"jsonrpc": "2.0", "method": "$/x", "params": {"v": 1}}), None),
    "response to no request": (stress.frame({"jsonrpc": "2.0", "id": 777, "result": None}), None),
    "hover with ill-typed params": (stress.frame({"jsonrpc": "2.0", "id": 900, "method": "textDocument/hover",
                                                 "params": {"textDocument": 42, "position": "top"}}), -32602),
    "code action without params": (stress.frame({"jsonrpc": "2.0", "id": 900, "method": "textDocument/codeAction"}),
                                   -32602),
    "didOpen missing fields": (stress.frame({"jsonrpc": "2.0", "method": "textDocument/didOpen",
                                            "params": {"textDocument": {"uri": "file:///x.py"}}}), None),
    "didChange with ill-typed params": (stress.frame({"jsonrpc": "2.0", "method": "textDocument/didChange",
                                                     "params": {"textDocument": 5, "contentChanges": "x"}}), None),
    "didChange of a document never opened": (stress.frame({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
        "textDocument": {"uri": "file:///never.py", "version": 2}, "contentChanges": [{"text": "x"}]}}), None),
}


def test_malformed_messages_get_errors_and_the_server_keeps_serving(raw_server, tmp_path):
    """Each malformed message is followed by a real request: every real request is answered,
    requests that can be answered get their JSON-RPC error, nothing else gets a response."""
    raw_server.initialize()
    uri = raw_server.open(tmp_path / "m.py", LOOP)
    raw_server.diagnostics(uri, 1)
    hover = {"textDocument": {"uri": uri}, "position": {"line": 5, "character": 27}}
    for name, (data, error) in MALFORMED.items():
        raw_server.responses.pop(900, None), raw_server.responses.pop(901, None)
        raw_server.send_bytes(data)
        answer = raw_server.call("textDocument/hover", hover, timeout=30)
        assert get_rule("MAT101").summary in answer["result"]["contents"]["value"], name
        got = raw_server.responses.get(900) or raw_server.responses.get(901)
        assert (got["error"]["code"] if got else None) == error, (name, got)
    assert set(raw_server.responses) <= set(range(1, raw_server._next_id + 1)) | {900, 901}
    stress.still_serving(raw_server)


def test_a_too_long_content_length_loses_only_the_next_message(raw_server):
    """The server waits for the bytes it was promised, taking them from the next message; the
    one after that is read again (pygls alone stays out of step for good)."""
    raw_server.initialize()
    raw_server.send_bytes(b"Content-Length: %d\r\n\r\n" % (len(BODY) + 40) + BODY)
    swallowed = raw_server.request("textDocument/hover", {"textDocument": {"uri": "file:///x.py"},
                                                          "position": {"line": 0, "character": 0}})
    assert "result" in raw_server.call("textDocument/hover", {
        "textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 0}})
    assert swallowed not in raw_server.responses
    stress.still_serving(raw_server)


def test_huge_documents_and_a_million_character_line(raw_server):
    raw_server.initialize()
    from matlint.server import DEFAULT_MAX_DOCUMENT_SIZE

    huge = stress.big_module(DEFAULT_MAX_DOCUMENT_SIZE + 1000)
    result = stress.huge_document(raw_server, huge, "huge.py")
    assert result["count"] == 1 and result["messages"][0].startswith("matlint: not linted in the editor:")
    assert "above matlint.maxDocumentSize (2,000,000)" in result["messages"][0]
    long_string = stress.huge_document(raw_server, "import torch\ntext = '" + "a" * 1_000_000 + "'\n" + LOOP, "long.py")
    assert long_string["codes"] == ["MAT101"]  # linted: under the limit
    long_list = stress.huge_document(raw_server, "import torch\nx = [" + "0, " * 333_333 + "]\n", "list.py")
    assert long_list["count"] == 0
    stress.still_serving(raw_server)


def test_max_document_size_setting(raw_server, tmp_path):
    raw_server.initialize({"maxDocumentSize": 50})
    uri = raw_server.open(tmp_path / "m.py", LOOP)
    [notice] = raw_server.diagnostics(uri, 1)
    assert f"{len(LOOP):,} characters, above matlint.maxDocumentSize (50)" in notice["message"]
    assert notice["severity"] == 3  # information
    version_2 = "import torch\n"
    raw_server.change(uri, 2, version_2)
    assert raw_server.diagnostics(uri, 2) == []  # small enough again: linted


def test_a_burst_of_edits_ends_with_the_last_version(raw_server):
    raw_server.initialize()
    result = stress.burst(raw_server, 300)  # asserts the last version's diagnostics and their order
    assert result["publications"] < 300  # edits already superseded are not linted
    stress.still_serving(raw_server)


def test_missing_pygls_gives_the_install_command(tmp_path):
    """With pygls hidden, `python -m matlint.server` exits with the pip command to fix it."""
    (tmp_path / "pygls").mkdir()
    (tmp_path / "pygls" / "__init__.py").write_text("raise ImportError('hidden', name='pygls')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(SERVER, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert 'pip install "matlint[server]"' in proc.stderr


# -- notebooks --------------------------------------------------------------------------------

TRAIN_CELL = textwrap.dedent("""\
    def train(model, loader, optimizer):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = (model(x) - y).pow(2).mean()
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            print(loss.item())
    """)


class NotebookEditor(_AppliesEdits):
    """Sends the notebook notifications VS Code sends for an open .ipynb (LSP notebook sync)."""

    def __init__(self, client: LanguageClient, path: Path, cells: list):
        self.client, self.uri, self.version = client, path.as_uri(), 1
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}", encoding="utf-8")
        self.cells = [(f"vscode-notebook-cell:{path}#W{i}sZmlsZQ%3D%3D", kind, text) for i, (kind, text) in enumerate(cells)]
        self.texts = {uri: text for uri, _, text in self.cells}
        self.versions = {uri: 1 for uri, _, _ in self.cells}
        client.notebook_document_did_open(t.DidOpenNotebookDocumentParams(
            notebook_document=t.NotebookDocument(
                uri=self.uri, notebook_type="jupyter-notebook", version=1,
                cells=[t.NotebookCell(kind=kind, document=uri) for uri, kind, _ in self.cells]),
            cell_text_documents=[t.TextDocumentItem(uri=uri, language_id="python" if kind == t.NotebookCellKind.Code
                                                    else "markdown", version=1, text=text)
                                 for uri, kind, text in self.cells]))

    def cell(self, index: int) -> str:
        return self.cells[index][0]

    def change(self, uri: str, text: str) -> None:
        self.version += 1
        self.versions[uri] += 1
        self.texts[uri] = text
        self.client.notebook_document_did_change(t.DidChangeNotebookDocumentParams(
            notebook_document=t.VersionedNotebookDocumentIdentifier(version=self.version, uri=self.uri),
            change=t.NotebookDocumentChangeEvent(cells=t.NotebookDocumentCellChanges(text_content=[
                t.NotebookDocumentCellContentChanges(
                    document=t.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                    changes=[t.TextDocumentContentChangeWholeDocument(text=text)])]))))

    def edit(self, uri: str, range_: t.Range, text: str) -> None:
        """An edit as VS Code's client sends a cell's edits: a range and its new text, whatever
        text sync kind the server asked for."""
        self.version += 1
        self.versions[uri] += 1
        self.texts[uri] = apply_text_edits(self.texts[uri], [t.TextEdit(range=range_, new_text=text)])
        self.client.notebook_document_did_change(t.DidChangeNotebookDocumentParams(
            notebook_document=t.VersionedNotebookDocumentIdentifier(version=self.version, uri=self.uri),
            change=t.NotebookDocumentChangeEvent(cells=t.NotebookDocumentCellChanges(text_content=[
                t.NotebookDocumentCellContentChanges(
                    document=t.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                    changes=[t.TextDocumentContentChangePartial(range=range_, text=text)])]))))


async def _published(client, uri, version, timeout=15.0):
    async def wait():
        while client.versions.get(uri) != version:
            await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        return list(client.diagnostics[uri])
    return await asyncio.wait_for(wait(), timeout)


@pytest.mark.asyncio
async def test_a_notebook_is_one_program_and_diagnostics_follow_edits_across_cells(client, workspace):
    book = NotebookEditor(client, workspace / "a" / "train.ipynb", [
        (t.NotebookCellKind.Markup, "# Training"),
        (t.NotebookCellKind.Code, 'import torch\ndevice = "cuda"\n'),
        (t.NotebookCellKind.Code, TRAIN_CELL)])
    diagnostics = await _published(client, book.cell(2), 1)
    (sync,) = by_code(diagnostics, "MAT502")
    assert sync.range.start.line == 5 and sync.source == "matlint"
    assert await _published(client, book.cell(1), 1) == []
    # The model's device is set in another cell: a CPU program has no host sync to report.
    book.change(book.cell(1), 'import torch\ndevice = "cpu"\n')
    diagnostics = await _published(client, book.cell(1), 2)
    await asyncio.sleep(0.5)
    assert by_code(client.diagnostics[book.cell(2)], "MAT502") == []


@pytest.mark.asyncio
async def test_a_notebook_cell_takes_the_ranged_edits_vscode_sends(client, workspace):
    """VS Code's language client sends the edits of a notebook cell as ranges even to a server
    that syncs text documents in full; the server applies them to the cell's text (it took the
    inserted text for the whole cell: a typed line emptied the cell of its findings)."""
    book = NotebookEditor(client, workspace / "a" / "typed.ipynb", [
        (t.NotebookCellKind.Code, 'import torch\ndevice = "cuda"\n'),
        (t.NotebookCellKind.Code, TRAIN_CELL)])
    (sync,) = by_code(await _published(client, book.cell(1), 1), "MAT502")
    start = t.Position(line=0, character=0)
    book.edit(book.cell(1), t.Range(start=start, end=start), "# one step per batch\n")
    (moved,) = by_code(await _published(client, book.cell(1), 2), "MAT502")
    assert moved.range.start.line == sync.range.start.line + 1
    # An edit of the other cell leaves the rest of that cell: `device` is still "cuda".
    client.versions.pop(book.cell(1))  # wait for the publication that follows this edit
    book.edit(book.cell(0), t.Range(start=start, end=start), "# setup\n")
    await _published(client, book.cell(0), 2)
    (still,) = by_code(await _published(client, book.cell(1), 2), "MAT502")
    assert still.range == moved.range
    # Undoing the typed line brings the finding back to where it was.
    book.edit(book.cell(1), t.Range(start=start, end=t.Position(line=1, character=0)), "")
    (back,) = by_code(await _published(client, book.cell(1), 3), "MAT502")
    assert back.range == sync.range


@pytest.mark.asyncio
async def test_hover_quick_fix_and_noqa_in_a_notebook_cell(client, workspace):
    rule, example = next((r, e) for r in all_rules() for e in r.examples
                         if e.fixed_code is not None and not e.unsafe and e.expect and r.code == "MAT601")
    source = "%matplotlib inline\n" + example.code
    book = NotebookEditor(client, workspace / "a" / "attn.ipynb", [(t.NotebookCellKind.Code, source)])
    uri = book.cell(0)
    (d,) = by_code(await _published(client, uri, 1), rule.code)
    assert d.range.start.line == example.expect[0][0]  # one line below its place in the example
    result = await hover(client, uri, d.range.start.line, d.range.start.character + 1)
    assert rule.summary in result.contents.value
    actions = await code_actions(client, uri, d)
    (noqa,) = [a for a in actions if "noqa" in a.title]
    assert noqa.edit.document_changes[0].text_document.uri == uri
    (fix,) = [a for a in actions if a.is_preferred]
    text = book.apply(fix.edit)
    assert text == "%matplotlib inline\n" + example.fixed_code
    assert by_code(await _published(client, uri, 2), rule.code) == []


@pytest.mark.asyncio
async def test_runtime_findings_of_a_notebook_show_in_their_cell(client, workspace):
    """The guard's JSON names the notebook and the cell (`%%matlint` in a kernel that knows it)."""
    report = workspace / "a" / ".matlint" / "runtime.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps([{**runtime_finding("run.ipynb", 2), "cell": 3}]), encoding="utf-8")
    book = NotebookEditor(client, workspace / "a" / "run.ipynb", [
        (t.NotebookCellKind.Markup, "# Run"),
        (t.NotebookCellKind.Code, "import torch\nx = 1\n"),
        (t.NotebookCellKind.Code, "for step in range(10):\n    out = step * 2\n")])
    (d,) = await _published(client, book.cell(2), 1)
    assert d.source == "matlint (runtime)" and d.range.start == t.Position(line=1, character=4)
    assert await _published(client, book.cell(1), 1) == []
