// The UI test: drives code-server (with the packaged extension installed) from headless
// Chromium like a user would, and prints what it saw as JSON; tests/test_vscode_e2e.py asserts.
// Usage: node ui.mjs <spec.json>  (url, file, fix_line, fix_column, fix_code, shots)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(`${process.env.MATLINT_EDITOR_PREFIX}/`);
const { chromium } = require("playwright-core");
const spec = JSON.parse(readFileSync(process.argv[2], "utf-8"));
const seen = { steps: [] };

const browser = await chromium.launch({
  executablePath: process.env.MATLINT_CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
let shot = 0;
async function snap(name) {
  shot += 1;
  const path = `${spec.shots}/${String(shot).padStart(2, "0")}-${name}.png`;
  await page.screenshot({ path });
  seen.steps.push(name);
}
const editorText = async () =>
  (await page.locator(".monaco-editor .view-lines").first().innerText()).replace(/\u00a0/g, " ");

try {
  await page.goto(spec.url);
  await page.locator(".monaco-workbench").waitFor({ timeout: 60000 });
  await page.locator(".explorer-folders-view, .explorer-viewlet").first().waitFor({ timeout: 60000 });
  await snap("workbench");

  // Open the model file from the Explorer.
  await page.locator(".explorer-folders-view .monaco-list-row", { hasText: spec.file }).first().click();
  await page.locator(".monaco-editor .view-lines", { hasText: "import" }).first().waitFor();

  // Squiggles.
  await page.locator(".squiggly-warning").first().waitFor({ timeout: 60000 });
  seen.squiggles = await page.locator(".squiggly-warning").count();
  await snap("squiggles");

  // Problems panel.
  await page.keyboard.press("Control+Shift+M");
  const rows = page.locator(".markers-panel .monaco-list-row");
  await rows.first().waitFor();
  await page.waitForTimeout(500);
  seen.problems = await rows.allInnerTexts();
  await snap("problems");

  // Hover over the first squiggle.
  const box = await page.locator(".squiggly-warning").first().boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  const hover = page.locator(".monaco-hover:visible").first();
  await hover.waitFor({ timeout: 20000 });
  await page.waitForTimeout(300);
  seen.hover = await hover.innerText();
  await snap("hover");
  await page.mouse.move(5, 5);
  await page.keyboard.press("Escape");

  // Quick fix: go to the finding that has a fix, Ctrl+. and pick it.
  await page.locator(".monaco-editor textarea").first().focus();
  await page.keyboard.press("Control+G");
  await page.locator(".quick-input-widget input").waitFor();
  await page.keyboard.type(`${spec.fix_line}:${spec.fix_column}`);
  await page.keyboard.press("Enter");
  await page.waitForTimeout(300);
  await page.keyboard.press("Control+.");
  const menu = page.locator(".action-widget:not(.action-list-submenu-panel)").first();
  await menu.waitFor({ timeout: 20000 });
  await page.waitForTimeout(300);
  seen.actions = await menu.locator(".monaco-list-row").allInnerTexts();
  await snap("quick-fix-menu");
  await menu.locator(".monaco-list-row", { hasText: spec.fix_code }).filter({ hasNotText: "noqa" }).first().click();
  await page.waitForTimeout(1500);
  seen.text_after_fix = await editorText();
  seen.problems_after_fix = await rows.allInnerTexts();
  await snap("fixed");
} catch (error) {
  seen.error = String(error?.stack ?? error);
  await snap("error").catch(() => {});
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
