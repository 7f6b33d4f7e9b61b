// Opens code-server's workbench with a `payload` that makes the extension host run the
// extension tests (extensionDevelopmentPath + extensionTestsPath), and waits for their result
// file. Usage: node host.mjs <url> <results.json> <screenshot.png> <timeout-ms>
import { existsSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(`${process.env.MATLINT_EDITOR_PREFIX}/`);
const { chromium } = require("playwright-core");
const [url, results, screenshot, timeout] = process.argv.slice(2);

const browser = await chromium.launch({
  executablePath: process.env.MATLINT_CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let code = 0;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on("console", (m) => m.type() === "error" && console.error(`[browser] ${m.text()}`));
  await page.goto(url);
  const deadline = Date.now() + Number(timeout);
  while (!existsSync(results) && Date.now() < deadline) {
    await page.waitForTimeout(250);
  }
  await page.screenshot({ path: screenshot });
  if (!existsSync(results)) {
    console.error(`no test results after ${timeout} ms`);
    code = 1;
  }
} finally {
  await browser.close();
}
process.exit(code);
