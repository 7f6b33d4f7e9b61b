// Entry point the extension host calls (`extensionTestsPath`): runs the mocha suite and writes
// a JSON summary to $MATLINT_E2E_RESULTS, which tests/test_vscode_e2e.py reads.
import * as fs from "fs";
import * as path from "path";
import Mocha from "mocha";

interface Outcome {
  title: string;
  state: "passed" | "failed" | "skipped";
  error?: string;
}

export function run(): Promise<void> {
  const mocha = new Mocha({ ui: "bdd", timeout: 180000, color: false }); // a test waits up to 60 s a step
  mocha.addFile(path.join(__dirname, "extension.test.js"));
  const outcomes: Outcome[] = [];
  const resultsFile = process.env.MATLINT_E2E_RESULTS;
  return new Promise((resolve, reject) => {
    const runner = mocha.run((failures) => {
      if (resultsFile) {
        fs.writeFileSync(resultsFile, JSON.stringify({ failures, outcomes }, null, 2));
      }
      if (failures) {
        reject(new Error(`${failures} editor test(s) failed`));
      } else {
        resolve();
      }
    });
    runner.on("pass", (test) => outcomes.push({ title: test.fullTitle(), state: "passed" }));
    runner.on("pending", (test) => outcomes.push({ title: test.fullTitle(), state: "skipped" }));
    runner.on("fail", (test, error) =>
      outcomes.push({ title: test.fullTitle(), state: "failed", error: String(error?.stack ?? error) }));
  });
}
