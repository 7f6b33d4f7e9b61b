// The UI test: drives code-server (with the packaged extension installed) from headless
// Chromium like a user would, and prints what it saw as JSON; tests/test_vscode_e2e.py asserts.
// Usage: node ui.mjs <spec.json>  (url, file, codes, docs: [title, summary] of each rule found,
// fix_line, fix_column, fix_code, fixed_line, shots)
//
// Each step waits for the content it reads (every expected code in the Problems panel, the
// rule's docs in the hover, the fix in the menu, the fixed line and fewer problems after it),
// never for a time: on a loaded machine the language server answers late.
import { readFileSync } from "node:fs";
import { RETRY, TIMEOUT, launch, quickFixMenu, snapper, until as poll } from "./driver.mjs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf-8"));
const seen = { steps: [] };
const { browser, page } = await launch();
const snap = snapper(page, spec.shots, seen);
const editorText = async () =>
  (await page.locator(".monaco-editor .view-lines").first().innerText()).replace(/\u00a0/g, " ");
const until = (what, read, done, timeout = TIMEOUT) => poll(page, what, read, done, timeout);

try {
  await page.goto(spec.url);
  await page.locator(".monaco-workbench").waitFor();
  await page.locator(".explorer-folders-view, .explorer-viewlet").first().waitFor();
  await snap("workbench");

  // Open the model file from the Explorer.
  await page.locator(".explorer-folders-view .monaco-list-row", { hasText: spec.file }).first().click();
  await page.locator(".monaco-editor .view-lines", { hasText: "import" }).first().waitFor();

  // Squiggles.
  await page.locator(".squiggly-warning").first().waitFor();
  seen.squiggles = await page.locator(".squiggly-warning").count();
  await snap("squiggles");

  // Problems panel: every code the linter finds in the file.
  await page.keyboard.press("Control+Shift+M");
  const rows = page.locator(".markers-panel .monaco-list-row");
  seen.problems = await until("problem for each expected code", () => rows.allInnerTexts(),
    (texts) => spec.codes.every((code) => texts.some((text) => text.includes(code))));
  await snap("problems");

  // Hover over the first squiggle until the server's rule docs are in it (the problem's own
  // message shows first); a hover that has not shown for a while is asked for again.
  const squiggle = page.locator(".squiggly-warning").first();
  const hover = page.locator(".monaco-hover:visible").first();
  let hovered = 0;
  seen.hover = await until("rule docs in the hover", async () => {
    if (await hover.count()) {
      return hover.innerText();
    }
    if (Date.now() - hovered > RETRY) {
      const box = await squiggle.boundingBox();
      await page.mouse.move(5, 5);
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
      hovered = Date.now();
    }
    return "";
  }, (text) => spec.docs.some((doc) => doc.every((part) => text.includes(part)))); // a rule's title and summary
  await snap("hover");
  await page.mouse.move(5, 5);
  await page.keyboard.press("Escape");

  // Quick fix: go to the finding that has a fix, Ctrl+. and pick it.
  await page.locator(".monaco-editor textarea").first().focus();
  await page.keyboard.press("Control+G");
  await page.locator(".quick-input-widget input").waitFor();
  await page.keyboard.type(`${spec.fix_line}:${spec.fix_column}`);
  await page.keyboard.press("Enter");
  await page.locator(".statusbar-item", { hasText: `Ln ${spec.fix_line}, Col ${spec.fix_column}` }).first().waitFor();
  const menu = page.locator(".action-widget:not(.action-list-submenu-panel)").first();
  seen.actions = await quickFixMenu(page, menu, "fix in the quick fix menu", (text) => text.includes(spec.fix_code) && !text.includes("noqa"));
  await snap("quick-fix-menu");
  await menu.locator(".monaco-list-row", { hasText: spec.fix_code }).filter({ hasNotText: "noqa" }).first().click();
  const after = await until("fixed line and fewer problems",
    async () => ({ text: await editorText(), problems: await rows.allInnerTexts() }),
    ({ text, problems }) => text.includes(spec.fixed_line) && problems.length < seen.problems.length);
  seen.text_after_fix = after.text;
  seen.problems_after_fix = after.problems;
  await snap("fixed");
} catch (error) {
  seen.error = String(error?.stack ?? error);
  await snap("error").catch(() => {});
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
