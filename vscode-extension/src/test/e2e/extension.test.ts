// Runs inside the real extension host of code-server against the packaged extension.
// tests/test_vscode_e2e.py prepares the workspace and writes what to expect (computed from
// matlint itself) to $MATLINT_E2E_EXPECT.
import * as assert from "assert";
import * as fs from "fs";
import * as path from "path";
import * as vscode from "vscode";
import type { MatlintApi } from "../../extension";

interface Expect {
  workspace: string;
  loop: { file: string; line: number; start: number; end: number; url: string; summary: string };
  fix: { file: string; code: string; fixed: string };
  runtime: { report: string; file: string; line: number };
  closed_file: string;
  notebook: { file: string; define: number; use: number; code: string; line: number; model: string; other: string };
  bare_python: string;
  python: string;
}

const expect: Expect = JSON.parse(fs.readFileSync(process.env.MATLINT_E2E_EXPECT!, "utf-8"));

// Polls `probe` until it gives a value: a test waits for what it asserts, not for a time. On
// timeout the error names what it waited for, and what `seen` says was there instead.
async function waitFor<T>(
  what: string, probe: () => T | undefined | false | Promise<T | undefined | false>,
  seen: () => string = () => "", timeout = 60000,
): Promise<T> {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await probe();
    if (value) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what} ${seen()}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

function fileUri(name: string): vscode.Uri {
  return vscode.Uri.file(path.join(expect.workspace, name));
}

function matlintDiagnostics(uri: vscode.Uri, source = "matlint"): vscode.Diagnostic[] {
  return vscode.languages.getDiagnostics(uri).filter((d) => d.source === source);
}

function codeOf(d: vscode.Diagnostic): string | undefined {
  return typeof d.code === "object" ? String(d.code.value) : d.code === undefined ? undefined : String(d.code);
}

function quickFixes(uri: vscode.Uri, range: vscode.Range): Thenable<vscode.CodeAction[]> {
  return vscode.commands.executeCommand<vscode.CodeAction[]>(
    "vscode.executeCodeActionProvider", uri, range, vscode.CodeActionKind.QuickFix.value);
}

async function open(name: string): Promise<vscode.TextEditor> {
  const document = await vscode.workspace.openTextDocument(fileUri(name));
  return vscode.window.showTextDocument(document);
}

let api: MatlintApi;

describe("matlint extension", () => {
  before(async () => {
    const extension = vscode.extensions.getExtension<MatlintApi>("matlint.matlint");
    assert.ok(extension, "the matlint extension is installed");
    await open(expect.loop.file); // a Python file activates it
    api = await extension.activate();
    await waitFor("the server to run", () => api.state === "running" || api.state === "unavailable");
    assert.strictEqual(api.state, "running", api.problem);
  });

  it("activates with the interpreter from matlint.interpreter", () => {
    assert.deepStrictEqual(api.interpreter, { command: expect.python, source: "setting" });
  });

  it("shows findings with their range, code and rule link", async () => {
    const uri = fileUri(expect.loop.file);
    const [d] = await waitFor("MAT101", () => {
      const found = matlintDiagnostics(uri).filter((x) => codeOf(x) === "MAT101");
      return found.length ? found : undefined;
    });
    assert.deepStrictEqual(
      [d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character],
      [expect.loop.line, expect.loop.start, expect.loop.line, expect.loop.end],
    );
    assert.strictEqual(typeof d.code === "object" && d.code.target.toString(true), expect.loop.url);
    assert.strictEqual(d.severity, vscode.DiagnosticSeverity.Warning);
  });

  it("takes severities from matlint.severity", async () => {
    const uri = fileUri(expect.loop.file);
    const config = vscode.workspace.getConfiguration("matlint");
    await config.update("severity", { MAT1: "error" }, vscode.ConfigurationTarget.Workspace);
    await waitFor("MAT101 as an error", () =>
      matlintDiagnostics(uri).find((x) => codeOf(x) === "MAT101" && x.severity === vscode.DiagnosticSeverity.Error));
    await config.update("severity", undefined, vscode.ConfigurationTarget.Workspace);
    await waitFor("MAT101 as a warning again", () =>
      matlintDiagnostics(uri).find((x) => codeOf(x) === "MAT101" && x.severity === vscode.DiagnosticSeverity.Warning));
  });

  it("shows the rule's docs on hover", async () => {
    const uri = fileUri(expect.loop.file);
    const position = new vscode.Position(expect.loop.line, expect.loop.start + 1);
    let text = "";
    await waitFor("the rule's summary in the hover", async () => {
      const hovers = await vscode.commands.executeCommand<vscode.Hover[]>("vscode.executeHoverProvider", uri, position);
      text = hovers
        .flatMap((h) => h.contents)
        .map((c) => (typeof c === "string" ? c : "value" in c ? c.value : ""))
        .join("\n");
      return text.includes(expect.loop.summary);
    }, () => `(the hover: ${text})`);
  });

  it("applies a rule's fix from the quick fix menu and re-lints", async () => {
    const editor = await open(expect.fix.file);
    const uri = editor.document.uri;
    const [d] = await waitFor(expect.fix.code, () => {
      const found = matlintDiagnostics(uri).filter((x) => codeOf(x) === expect.fix.code);
      return found.length ? found : undefined;
    });
    let titles: string[] = [];
    const fix = await waitFor("the rule's fix among the quick fixes", async () => {
      const actions = await quickFixes(uri, d.range);
      titles = actions.map((a) => a.title);
      return actions.find((a) => a.title.includes(expect.fix.code) && !a.title.includes("noqa") && a.edit);
    }, () => `(the quick fixes: ${titles})`);
    assert.ok(await vscode.workspace.applyEdit(fix.edit!));
    assert.strictEqual(editor.document.getText(), expect.fix.fixed);
    await waitFor("the fixed finding to go", () =>
      !matlintDiagnostics(uri).some((x) => codeOf(x) === expect.fix.code && x.range.isEqual(d.range)));
  });

  it("adds `# noqa` from the quick fix menu", async () => {
    const editor = await open(expect.loop.file);
    const uri = editor.document.uri;
    const [d] = await waitFor("MAT101", () => {
      const found = matlintDiagnostics(uri).filter((x) => codeOf(x) === "MAT101");
      return found.length ? found : undefined;
    });
    let titles: string[] = [];
    const noqa = await waitFor("`# noqa` among the quick fixes", async () => {
      const actions = await quickFixes(uri, d.range);
      titles = actions.map((a) => a.title);
      return actions.find((a) => a.title.includes("noqa") && a.edit);
    }, () => `(the quick fixes: ${titles})`);
    assert.ok(await vscode.workspace.applyEdit(noqa.edit!));
    assert.ok(editor.document.lineAt(expect.loop.line).text.endsWith("# noqa: MAT101"));
    await waitFor("MAT101 to be silenced", () => !matlintDiagnostics(uri).some((x) => codeOf(x) === "MAT101"));
    await vscode.commands.executeCommand("undo");
    await waitFor("MAT101 back after undo", () => matlintDiagnostics(uri).some((x) => codeOf(x) === "MAT101"));
  });

  it("follows edits across notebook cells", async () => {
    // A model defined in one cell and called per item in another: the finding is in the cell
    // that calls it, and goes when the model's own cell makes it something that is not a GEMM.
    const nb = expect.notebook;
    const notebook = await vscode.workspace.openNotebookDocument(fileUri(nb.file));
    await vscode.window.showNotebookDocument(notebook);
    const defining = notebook.cellAt(nb.define).document;
    const using = notebook.cellAt(nb.use).document;
    assert.strictEqual(using.uri.scheme, "vscode-notebook-cell");
    const finding = () => matlintDiagnostics(using.uri).find((x) => codeOf(x) === nb.code && x.range.start.line === nb.line);
    const seen = () => `(the using cell: ${JSON.stringify(matlintDiagnostics(using.uri).map((x) => [codeOf(x), x.range.start.line]))})`;
    await waitFor(`${nb.code} in the cell that uses the model`, finding, seen);
    assert.deepStrictEqual(matlintDiagnostics(defining.uri), []);
    const swap = async (from: string, to: string) => {
      const start = defining.getText().indexOf(from);
      assert.ok(start >= 0, `${from} in ${defining.getText()}`);
      const edit = new vscode.WorkspaceEdit();
      edit.replace(defining.uri, new vscode.Range(defining.positionAt(start), defining.positionAt(start + from.length)), to);
      assert.ok(await vscode.workspace.applyEdit(edit));
    };
    await swap(nb.model, nb.other);
    await waitFor(`${nb.code} to go after the model's cell changed`, () => !finding(), seen);
    await swap(nb.other, nb.model);
    await waitFor(`${nb.code} back when the model is a linear layer again`, finding, seen);
  });

  it("shows the runtime guard's findings and follows the report file", async () => {
    const uri = fileUri(expect.runtime.file);
    fs.mkdirSync(path.dirname(expect.runtime.report), { recursive: true });
    fs.writeFileSync(expect.runtime.report, fs.readFileSync(`${expect.runtime.report}.pending`));
    const d = await waitFor("a runtime finding", () =>
      matlintDiagnostics(uri, "matlint (runtime)").find((x) => x.range.start.line === expect.runtime.line));
    assert.ok(d.message.includes("measured at run time"), d.message);
    fs.unlinkSync(expect.runtime.report);
    await waitFor("the runtime finding to go", () => matlintDiagnostics(uri, "matlint (runtime)").length === 0);
  });

  it("runs on the whole workspace", async () => {
    const uri = fileUri(expect.closed_file);
    assert.strictEqual(matlintDiagnostics(uri).length, 0);
    await vscode.commands.executeCommand("matlint.checkWorkspace");
    await waitFor("findings of a file that is not open", () => matlintDiagnostics(uri).length > 0);
  });

  it("says how to install matlint when the interpreter lacks it, and recovers", async () => {
    const config = vscode.workspace.getConfiguration("matlint");
    await config.update("interpreter", expect.bare_python, vscode.ConfigurationTarget.Workspace);
    await waitFor("the server to stop", () => api.state === "unavailable");
    assert.ok(api.problem?.includes(`${expect.bare_python} -m pip install "matlint[server]"`), api.problem);
    await config.update("interpreter", expect.python, vscode.ConfigurationTarget.Workspace);
    await waitFor("the server to run again", () => api.state === "running");
  });

  it("restarts on command and lints again", async () => {
    await vscode.commands.executeCommand("matlint.restart");
    await waitFor("the server to run after the restart", () => api.state === "running", () => `(state: ${api.state})`);
    const document = (await open(expect.loop.file)).document;
    await waitFor("findings after the restart", () => matlintDiagnostics(document.uri).length > 0);
  });
});
