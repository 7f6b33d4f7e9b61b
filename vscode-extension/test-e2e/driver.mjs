// What the UI tests share: headless Chromium driving code-server, numbered screenshots, and
// `until`, which polls for the content a step asserts (never a fixed sleep: on a loaded machine
// the language server and the workbench answer late).
import { createRequire } from "node:module";

const require = createRequire(`${process.env.MATLINT_EDITOR_PREFIX}/`);
const { chromium } = require("playwright-core");

export const TIMEOUT = 90000; // generous: what a step waits for comes in seconds, later on a busy machine
export const RETRY = 5000; // a hover or menu not shown this long after asking is asked for again

export async function launch() {
  const browser = await chromium.launch({
    executablePath: process.env.MATLINT_CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.setDefaultTimeout(TIMEOUT);
  return { browser, page };
}

/** snap(name) saves `<shots>/NN-name.png` and records the step's name in seen.steps. */
export function snapper(page, shots, seen) {
  let shot = 0;
  return async (name) => {
    shot += 1;
    await page.screenshot({ path: `${shots}/${String(shot).padStart(2, "0")}-${name}.png` });
    seen.steps.push(name);
  };
}

/** Reads with `read` until `done` holds of what it read; after `timeout` ms, fails with the last read. */
export async function until(page, what, read, done, timeout = TIMEOUT) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await read();
    if (done(value)) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`no ${what} after ${timeout} ms; last seen: ${JSON.stringify(value)?.slice(0, 2000)}`);
    }
    await page.waitForTimeout(250);
  }
}

/** Opens the quick fix menu (Ctrl+.) until it lists a row that `wanted` accepts (a menu opened
 * before the server's actions came is closed and asked for again); returns the rows' texts. */
export async function quickFixMenu(page, menu, what, wanted, timeout = TIMEOUT) {
  const fits = (texts) => texts.some(wanted);
  let asked = 0;
  return until(page, what, async () => {
    if (await menu.isVisible()) {
      const texts = await menu.locator(".monaco-list-row").allInnerTexts();
      if (!fits(texts)) {
        await page.keyboard.press("Escape");
      }
      return texts;
    }
    if (Date.now() - asked > RETRY) {
      await page.keyboard.press("Control+.");
      asked = Date.now();
    }
    return [];
  }, fits, timeout);
}
