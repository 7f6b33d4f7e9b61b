// The notebook UI test: opens a .ipynb in code-server's built-in notebook editor (no kernel)
// with the packaged extension installed, and prints what a user sees as JSON;
// tests/test_vscode_e2e.py asserts.
// Usage: node notebook.mjs <spec.json>  (url, file, cells: how many cells the notebook has,
// clean: the index of a code cell without findings, loop and fix: {index (the cell's, from 0),
// code, line, column (1-based, in the cell)}, docs: [title, summary] of the loop's rule,
// fixed_line, shots)
//
// Cells are found by their index in the notebook (the list row's data-index), not by their
// order on screen: the notebook list renders only the cells in view. Each step waits for the
// content it reads, never for a time.
import { readFileSync } from "node:fs";
import { RETRY, TIMEOUT, launch, quickFixMenu, snapper, until as poll } from "./driver.mjs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf-8"));
const seen = { steps: [], open_attempts: 0 };
const { browser, page } = await launch();
const snap = snapper(page, spec.shots, seen);
const until = (what, read, done, timeout = TIMEOUT) => poll(page, what, read, done, timeout);

// The notebook editor widget is an overlay, not inside the editor group's `.notebook-editor` element.
const notebook = page.locator(".notebookOverlay:visible").first();
const cell = (index) => notebook.locator(`.cell-list-container .monaco-list-row[data-index="${index}"]`);
const cellText = async (index) =>
  (await cell(index).count()) ? (await cell(index).locator(".view-lines").innerText()).replace(/\u00a0/g, " ") : "";
const squiggles = (index) => cell(index).locator(".squiggly-warning");
const rows = page.locator(".markers-panel .monaco-list-row");
const problemRow = (finding) => rows.filter({ hasText: finding.code }).filter({ hasText: `[Ln ${finding.line}, Col ${finding.column}]` });
const statusCell = async () =>
  (await page.locator(".statusbar-item").allInnerTexts()).find((text) => /^Cell \d+ of \d+$/.test(text.trim()))?.trim() ?? "";
const menu = page.locator(".action-widget:not(.action-list-submenu-panel)").first();

// Puts the cursor on a finding: the Problems panel reveals its cell, then a click on the squiggle.
async function goTo(finding) {
  await problemRow(finding).first().click();
  await until(`cell ${finding.index + 1} revealed`, statusCell, (text) => text === `Cell ${finding.index + 1} of ${spec.cells}`);
  const squiggle = squiggles(finding.index).first();
  await squiggle.scrollIntoViewIfNeeded();
  const box = await squiggle.boundingBox();
  await page.mouse.click(box.x + 2, box.y + box.height / 2);
}

// Opens the quick fix menu until it holds a row that `wanted` accepts, and clicks that row.
async function quickFix(what, wanted) {
  const actions = await quickFixMenu(page, menu, what, wanted);
  await snap(`menu-${what.split(" ")[0]}`);
  const texts = await menu.locator(".monaco-list-row").allInnerTexts();
  await menu.locator(".monaco-list-row").nth(texts.findIndex(wanted)).click();
  return actions;
}

try {
  await page.goto(spec.url);
  await page.locator(".monaco-workbench").waitFor();
  await page.locator(".explorer-folders-view, .explorer-viewlet").first().waitFor();
  await snap("workbench");

  // Open the notebook from the Explorer. A click that comes before the workbench has registered
  // the built-in ipynb notebook type opens the JSON as text: close that editor and click again.
  const entry = page.locator(".explorer-folders-view .monaco-list-row", { hasText: spec.file }).first();
  const textTab = page.locator(".tabs-container .tab", { hasText: spec.file });
  let clicked = 0;
  await until("notebook editor", async () => {
    if (await notebook.isVisible()) {
      return true;
    }
    if (await page.locator(".editor-instance .monaco-editor .view-lines", { hasText: '"cells"' }).count()) {
      seen.opened_as_text = (seen.opened_as_text ?? 0) + 1;
      await textTab.first().locator(".tab-actions .action-label").first().click();
      await textTab.first().waitFor({ state: "detached" });
      clicked = 0;
    } else if (Date.now() - clicked > RETRY) {
      await entry.click();
      seen.open_attempts += 1;
      clicked = Date.now();
    }
    return false;
  }, Boolean);

  // Squiggles in the cells that hold findings, none in the cell that defines the tensors.
  const perCell = async () => Object.fromEntries(await Promise.all(
    [spec.clean, spec.loop.index, spec.fix.index].map(async (i) => [i, await squiggles(i).count()])));
  seen.squiggles = await until("squiggles in the cells with findings", perCell,
    (counts) => counts[spec.loop.index] > 0 && counts[spec.fix.index] > 0);
  seen.cell_texts = Object.fromEntries(await Promise.all(
    [spec.clean, spec.loop.index, spec.fix.index].map(async (i) => [i, await cellText(i)])));
  await snap("notebook-squiggles");

  // Problems panel: the notebook, and each finding with its line in the cell.
  await page.keyboard.press("Control+Shift+M");
  seen.problems = await until("both findings in the Problems panel", () => rows.allInnerTexts(),
    (texts) => [spec.loop, spec.fix].every((f) => texts.some((t) => t.includes(f.code) && t.includes(`[Ln ${f.line}, Col ${f.column}]`))));
  await snap("problems");

  // A problem leads to its cell; the hover over its squiggle shows the rule's docs.
  await problemRow(spec.loop).first().click();
  seen.loop_cell = await until("the loop's cell revealed", statusCell, (text) => text === `Cell ${spec.loop.index + 1} of ${spec.cells}`);
  const hover = page.locator(".monaco-hover:visible").first();
  let hovered = 0;
  seen.hover = await until("rule docs in the hover", async () => {
    if (await hover.count()) {
      return hover.innerText();
    }
    if (Date.now() - hovered > RETRY) {
      const squiggle = squiggles(spec.loop.index).first();
      await squiggle.scrollIntoViewIfNeeded();
      const box = await squiggle.boundingBox();
      await page.mouse.move(5, 5);
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
      hovered = Date.now();
    }
    return "";
  }, (text) => spec.docs.every((part) => text.includes(part)));
  await snap("hover");
  await page.mouse.move(5, 5);
  await page.keyboard.press("Escape");

  // The rule's fix, in the cell whose code depends on an earlier cell's imports.
  await goTo(spec.fix);
  seen.fix_actions = await quickFix("fix in the quick fix menu", (t) => t.includes(spec.fix.code) && !t.includes("noqa"));
  const fixed = await until("the fixed line in its cell and its finding gone", async () => ({
    text: await cellText(spec.fix.index), problems: await rows.allInnerTexts(), squiggles: await squiggles(spec.fix.index).count(),
  }), ({ text, problems, squiggles: n }) => text.includes(spec.fixed_line) && n === 0 && !problems.some((t) => t.includes(spec.fix.code)));
  seen.text_after_fix = fixed.text;
  seen.problems_after_fix = fixed.problems;
  await snap("fixed");

  // `# noqa` on the loop's finding, which has no fix.
  await goTo(spec.loop);
  seen.noqa_actions = await quickFix("noqa in the quick fix menu", (t) => t.includes("noqa") && t.includes(spec.loop.code));
  const silenced = await until("`# noqa` in the loop's cell and its finding gone", async () => ({
    text: await cellText(spec.loop.index), problems: await rows.allInnerTexts(), squiggles: await squiggles(spec.loop.index).count(),
  }), ({ text, problems, squiggles: n }) => text.includes(`# noqa: ${spec.loop.code}`) && n === 0 && !problems.some((t) => t.includes(spec.loop.code)));
  seen.text_after_noqa = silenced.text;
  seen.problems_after_noqa = silenced.problems;
  await snap("noqa");

  // Undo in the cell: the comment goes and the finding comes back (the server applies the
  // cell's edits, which the client sends as ranges, to the cell's whole text).
  await page.keyboard.press("Control+z");
  const undone = await until("the loop's finding back after undo", async () => ({
    text: await cellText(spec.loop.index), problems: await rows.allInnerTexts(), squiggles: await squiggles(spec.loop.index).count(),
  }), ({ text, problems, squiggles: n }) => !text.includes("# noqa") && n > 0 && problems.some((t) => t.includes(spec.loop.code)));
  seen.text_after_undo = undone.text;
  seen.problems_after_undo = undone.problems;
  await snap("undo");
} catch (error) {
  seen.error = String(error?.stack ?? error);
  await snap("error").catch(() => {});
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
