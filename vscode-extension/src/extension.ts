// The matlint VS Code extension: a thin client that runs `python -m matlint server` (LSP over
// stdio) with the interpreter the user chose, and adds a few commands around it.
import { execFile } from "child_process";
import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
} from "vscode-languageclient/node";

const SERVER_CHECK_COMMAND = "matlint.server.checkWorkspace";
const PYTHON_EXTENSION = "ms-python.python";

export interface Interpreter {
  command: string;
  source: "setting" | "python extension" | "default";
}

export type Probe =
  | { ok: true; version: string }
  | { ok: false; reason: string; fix?: string };

/** What the extension is doing; returned by activate() so the editor tests can read it. */
export interface MatlintApi {
  readonly state: "stopped" | "starting" | "running" | "disabled" | "unavailable";
  readonly interpreter?: Interpreter;
  /** The last problem shown to the user (interpreter missing, matlint not installed). */
  readonly problem?: string;
  readonly client?: LanguageClient;
  restart(): Promise<void>;
}

let client: LanguageClient | undefined;
let output: vscode.LogOutputChannel;
const status: {
  state: MatlintApi["state"];
  interpreter?: Interpreter;
  problem?: string;
} = { state: "stopped" };

export async function activate(context: vscode.ExtensionContext): Promise<MatlintApi> {
  output = vscode.window.createOutputChannel("matlint", { log: true });
  context.subscriptions.push(
    output,
    vscode.commands.registerCommand("matlint.restart", restart),
    vscode.commands.registerCommand("matlint.showLogs", () => output.show()),
    vscode.commands.registerCommand("matlint.checkWorkspace", checkWorkspace),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (["matlint.enable", "matlint.interpreter", "matlint.args"].some((s) => event.affectsConfiguration(s))) {
        void restart();
      }
    }),
  );
  await watchPythonExtension(context);
  await start();
  return {
    get state() {
      return status.state;
    },
    get interpreter() {
      return status.interpreter;
    },
    get problem() {
      return status.problem;
    },
    get client() {
      return client;
    },
    restart,
  };
}

export async function deactivate(): Promise<void> {
  await stop();
}

function settings(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration("matlint", vscode.workspace.workspaceFolders?.[0]?.uri);
}

async function start(): Promise<void> {
  if (!settings().get<boolean>("enable", true)) {
    status.state = "disabled";
    output.info("matlint is disabled (matlint.enable)");
    return;
  }
  status.state = "starting";
  const interpreter = await resolveInterpreter();
  status.interpreter = interpreter;
  output.info(`interpreter: ${interpreter.command} (from the ${interpreter.source})`);
  const probe = await probeInterpreter(interpreter.command);
  if (!probe.ok) {
    status.state = "unavailable";
    void reportProblem(probe);
    return;
  }
  status.problem = undefined;
  output.info(`matlint ${probe.version}`);

  const args = ["-m", "matlint", "server", ...settings().get<string[]>("args", [])];
  const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  const serverOptions: ServerOptions = { command: interpreter.command, args, options: { cwd } };
  const clientOptions: LanguageClientOptions = {
    // Notebook cells too: the server syncs whole notebooks (LSP notebook sync) and answers for their cells.
    documentSelector: [{ scheme: "file", language: "python" }, { scheme: "vscode-notebook-cell", language: "python" }],
    outputChannel: output,
    revealOutputChannelOn: RevealOutputChannelOn.Never,
    initializationOptions: {
      enable: settings().get("enable"),
      severity: settings().get("severity"),
      runtimeReport: settings().get("runtimeReport"),
      maxDocumentSize: settings().get("maxDocumentSize"),
    },
    // Settings changes reach the server as workspace/didChangeConfiguration; it pulls the
    // values per workspace folder with workspace/configuration.
    synchronize: { configurationSection: "matlint" },
  };
  client = new LanguageClient("matlint", "matlint", serverOptions, clientOptions);
  try {
    await client.start();
    status.state = "running";
  } catch (error) {
    status.state = "unavailable";
    output.error(`the server did not start: ${error}`);
    void vscode.window.showErrorMessage(`matlint: the language server did not start (${error}).`, "Show Logs")
      .then((choice) => choice && output.show());
  }
}

async function stop(): Promise<void> {
  const running = client;
  client = undefined;
  status.state = "stopped";
  if (running) {
    try {
      await running.stop();
    } catch (error) {
      output.warn(`stopping the server: ${error}`);
    }
  }
}

async function restart(): Promise<void> {
  output.info("restarting");
  await stop();
  await start();
}

async function checkWorkspace(): Promise<void> {
  if (!client || status.state !== "running") {
    void vscode.window.showWarningMessage("matlint: the language server is not running.", "Show Logs")
      .then((choice) => choice && output.show());
    return;
  }
  const result = (await client.sendRequest(ExecuteCommandRequest.type, {
    command: SERVER_CHECK_COMMAND,
    arguments: [],
  })) as { files: number; findings: number } | null;
  await vscode.commands.executeCommand("workbench.actions.view.problems");
  if (result) {
    void vscode.window.showInformationMessage(`matlint: ${result.findings} finding(s) in ${result.files} file(s).`);
  }
}

// -- interpreter -----------------------------------------------------------------------------

function expand(value: string, folder?: vscode.WorkspaceFolder): string {
  const home = process.env.HOME ?? process.env.USERPROFILE ?? "";
  return value
    .replace(/\$\{workspaceFolder\}/g, folder?.uri.fsPath ?? "")
    .replace(/\$\{userHome\}/g, home)
    .replace(/^~(?=\/|$)/, home);
}

/** The `matlint.interpreter` setting, else the Python extension's active interpreter (when
 * that extension is installed; it is never required), else `python3`. */
export async function resolveInterpreter(): Promise<Interpreter> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  const configured = settings().get<string>("interpreter", "").trim();
  if (configured) {
    return { command: expand(configured, folder), source: "setting" };
  }
  const python = vscode.extensions.getExtension(PYTHON_EXTENSION);
  if (python) {
    try {
      const api = python.isActive ? python.exports : await python.activate();
      const details = api?.settings?.getExecutionDetails?.(folder?.uri);
      const command = details?.execCommand?.[0] ?? api?.environments?.getActiveEnvironmentPath?.(folder?.uri)?.path;
      if (command) {
        return { command, source: "python extension" };
      }
    } catch (error) {
      output.warn(`could not ask the Python extension for its interpreter: ${error}`);
    }
  }
  return { command: "python3", source: "default" };
}

async function watchPythonExtension(context: vscode.ExtensionContext): Promise<void> {
  const python = vscode.extensions.getExtension(PYTHON_EXTENSION);
  if (!python) {
    return;
  }
  try {
    const api = python.isActive ? python.exports : await python.activate();
    const event = api?.environments?.onDidChangeActiveEnvironmentPath ?? api?.settings?.onDidChangeExecutionDetails;
    if (event) {
      context.subscriptions.push(event(() => {
        if (!settings().get<string>("interpreter", "").trim()) {
          void restart();
        }
      }));
    }
  } catch (error) {
    output.warn(`could not watch the Python extension's interpreter: ${error}`);
  }
}

const PROBE = [
  "import importlib.util, json",
  "mods = ('matlint', 'pygls', 'lsprotocol')",
  "found = {m: importlib.util.find_spec(m) is not None for m in mods}",
  "v = __import__('matlint').__version__ if found['matlint'] else None",
  "print(json.dumps({'found': found, 'version': v}))",
].join("\n");

/** Whether `python` can run `matlint server`, and the command that fixes it when not. */
export function probeInterpreter(python: string): Promise<Probe> {
  return new Promise((resolve) => {
    execFile(python, ["-c", PROBE], { timeout: 30000 }, (error, stdout, stderr) => {
      if (error && (error as NodeJS.ErrnoException).code === "ENOENT") {
        resolve({ ok: false, reason: `the Python interpreter \`${python}\` was not found. Set \`matlint.interpreter\` to a Python that has matlint installed.` });
        return;
      }
      let report: { found: Record<string, boolean>; version: string | null };
      try {
        report = JSON.parse(stdout.trim().split("\n").pop() ?? "");
      } catch {
        resolve({ ok: false, reason: `\`${python}\` could not be run (${(stderr || String(error)).trim()}).` });
        return;
      }
      const fix = `${quote(python)} -m pip install "matlint[server]"`;
      if (!report.found.matlint) {
        resolve({ ok: false, reason: `matlint is not installed in ${python}.`, fix });
      } else if (!report.found.pygls || !report.found.lsprotocol) {
        resolve({ ok: false, reason: `matlint's language server needs pygls and lsprotocol, which are not installed in ${python}.`, fix });
      } else {
        resolve({ ok: true, version: report.version ?? "?" });
      }
    });
  });
}

function quote(path: string): string {
  return /^[\w@%+=:,./-]+$/.test(path) ? path : `"${path.replace(/(["\\$`])/g, "\\$1")}"`;
}

async function reportProblem(probe: Extract<Probe, { ok: false }>): Promise<void> {
  const message = probe.fix ? `${probe.reason} Install it with: ${probe.fix}` : probe.reason;
  status.problem = message;
  output.error(message);
  const actions = probe.fix ? ["Copy Command", "Select Interpreter", "Show Logs"] : ["Select Interpreter", "Show Logs"];
  const choice = await vscode.window.showErrorMessage(`matlint: ${message}`, ...actions);
  if (choice === "Copy Command" && probe.fix) {
    await vscode.env.clipboard.writeText(probe.fix);
  } else if (choice === "Select Interpreter") {
    await vscode.commands.executeCommand("workbench.action.openSettings", "matlint.interpreter");
  } else if (choice === "Show Logs") {
    output.show();
  }
}
