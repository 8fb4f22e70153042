// Drives ComfyUI's page in headless Chromium for tests/comfyui/test_comfyui_browser.py: loads
// workflows through the page's file input, queues them with the Run shortcut, opens the Mizuoto
// panel, changes settings in the settings dialog, presses Unload Models. It prints one JSON
// object of what it saw (the test asserts on it) and saves screenshots in the output folder.
//
// usage: node drive.mjs PLAN.json   (PLAN: {url, chromium, out, demo, qwen, qwenWidgets})
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const seen = { console: [], steps: [], screenshots: {} };
const PACK = "/extensions/mizuoto/";

async function route(path) {
  const response = await fetch(plan.url + path);
  return response.json();
}

async function shot(page, name, what) {
  const path = join(plan.out, `${name}.png`);
  await page.screenshot({ path, fullPage: false });
  seen.screenshots[name] = { path, what };
}

function step(name, data = {}) {
  seen.steps.push({ name, ...data });
  process.stderr.write(`step ${name}\n`);
}

// The ComfyUI app object the extensions use (exposed for extensions in every frontend).
const APP = "(window.comfyAPI?.app?.app ?? window.app)";

async function loadWorkflow(page, file) {
  // Loaded once the canvas holds every node type the file names (whatever node ends the graph).
  const types = [...new Set(JSON.parse(readFileSync(file, "utf8")).nodes.map((n) => n.type))];
  await page.setInputFiles("#comfy-file-input", file);
  await page.waitForFunction(([types]) => {
    const app = window.comfyAPI?.app?.app ?? window.app;
    const nodes = (app.rootGraph ?? app.graph)?.nodes ?? [];
    return types.every((type) => nodes.some((n) => n.type === type));
  }, [types], { timeout: 30000 });
}

async function setWidgets(page, values) {
  // Widgets the test changes so a run is short or reruns (a seed), as a user would type them.
  await page.evaluate(([values]) => {
    const app = window.comfyAPI?.app?.app ?? window.app;
    for (const node of (app.rootGraph ?? app.graph).nodes) {
      for (const w of node.widgets ?? []) {
        if (node.type === "MizuotoTTS" && w.name in values) w.value = values[w.name];
      }
    }
    app.graph.setDirtyCanvas(true, true);
  }, [values]);
}

async function queueAndWait(page, timeoutS) {
  const before = Object.keys(await route("/history")).length;
  // The action bar's Run button ("Queue" in older frontends).
  const run = page.getByRole("button", { name: /^\s*(Run|Queue)\s*$/ }).first();
  await run.click();
  const deadline = Date.now() + timeoutS * 1000;
  while (Date.now() < deadline) {
    const history = await route("/history");
    const ids = Object.keys(history);
    if (ids.length > before) {
      const last = history[ids[ids.length - 1]];
      if (last.status?.completed || last.status?.status_str === "error") {
        const audio = Object.values(last.outputs ?? {}).flatMap((o) => o.audio ?? []);
        // The page shows the saved audio in the Save Audio node's player.
        let player = null;
        if (audio.length) {
          await page.waitForFunction(([name]) => [...document.querySelectorAll("audio")].some(
            (a) => decodeURIComponent(a.src).includes(name)), [audio[0].filename], { timeout: 30000 });
          player = audio[0].filename;
        }
        return { status: last.status, audio, player, messages: last.status?.messages ?? [] };
      }
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`no run finished within ${timeoutS} s`);
}

async function openPanel(page) {
  const open = await page.locator(".mizuoto-model, .mizuoto-models").count();
  if (!open) await page.locator(".mizuoto-runtime-tab-button").first().click();
  await page.waitForSelector(".mizuoto-models", { timeout: 20000 });
}

// The panel redraws every refresh: wait until it shows what the route says now.
async function panelMatchesRoute(page) {
  let last = null;
  for (let i = 0; i < 40; i += 1) {
    const state = await route("/mizuoto/runtime");
    const shown = await page.evaluate(() => ({
      models: [...document.querySelectorAll(".mizuoto-model")].map((box) => ({
        name: box.dataset.name,
        bars: Object.fromEntries([...box.querySelectorAll(".mizuoto-bar")].map((b) => [b.dataset.bar, Number(b.dataset.bytes)])),
      })),
      lanes: [...document.querySelectorAll(".mizuoto-timeline")].map((chart) => ({
        request: Number(chart.dataset.request),
        id: Number(chart.dataset.id),
        running: chart.dataset.running === "true",
        lanes: [...chart.querySelectorAll('[data-kind="lane"]')].map((l) => l.dataset.phase),
        bars: chart.querySelectorAll('[data-kind="bar"]').length,
        yields: [...chart.querySelectorAll('[data-kind="yield"]')].map((y) => y.dataset.for),
      })),
      device: document.querySelector(".mizuoto-device")?.textContent ?? "",
      text: document.querySelector(".mizuoto-models")?.textContent ?? "",
    }));
    last = { state, shown };
    const same = shown.models.length === state.models.length && state.models.every((m) => {
      const box = shown.models.find((s) => s.name === m.name);
      return box && box.bars.loaded === m.loaded_bytes && box.bars.streamed === m.streamed_bytes && box.bars.host === m.host_bytes;
    });
    const requests = state.requests ?? [];
    const newest = requests[requests.length - 1];
    const drawn = shown.lanes[0]; // the newest chart comes first
    const current = !newest || (drawn && drawn.id === newest.id && drawn.running === newest.running);
    if (same && current && shown.lanes.length === Math.min(3, requests.length)) return last;
    await new Promise((r) => setTimeout(r, 500));
  }
  return last;
}

// The settings dialog in every frontend the labs serve: PrimeVue's `.p-dialog` (1.27, 1.35) and
// Reka's `[role=dialog]` (1.49) both carry role=dialog; the settings one holds a search field and
// setting rows.
function settingsDialog(page) {
  return page.locator("[role=dialog]").filter({ has: page.locator("input[placeholder*='earch']") })
    .filter({ has: page.locator(".setting-item, .setting-box") });
}

async function closeSettings(page) {
  await page.keyboard.press("Escape"); // an open dropdown first
  const dialog = settingsDialog(page);
  for (let i = 0; i < 3 && await dialog.count(); i += 1) {
    const close = dialog.first()
      .locator("button[aria-label='Close dialog'], button[aria-label=Close], .p-dialog-close-button");
    if (await close.count()) await close.first().click().catch(() => page.keyboard.press("Escape"));
    else await page.keyboard.press("Escape");
    await dialog.first().waitFor({ state: "detached", timeout: 5000 }).catch(() => {});
  }
  await page.locator(".p-dialog-mask").first().waitFor({ state: "detached", timeout: 15000 }).catch(() => {});
}

async function openSettings(page) {
  await page.keyboard.press("Control+Comma"); // ComfyUI's settings shortcut
  const dialog = settingsDialog(page).first();
  await dialog.waitFor({ state: "visible", timeout: 15000 });
  return dialog;
}

async function searchSetting(page, dialog, name) {
  const search = dialog.locator("input[placeholder*='earch']").first();
  await search.fill(name);
  const row = dialog.locator(".setting-item, .setting-box").filter({ hasText: name }).first();
  await row.waitFor({ timeout: 15000 });
  return row;
}

async function chooseInDialog(page, name, option) {
  const dialog = await openSettings(page);
  const row = await searchSetting(page, dialog, name);
  await row.locator(".p-select, .p-dropdown").first().click();
  await page.locator(`li[role=option]`).filter({ hasText: new RegExp(`^\\s*${option}\\s*$`) }).first().click();
  await page.locator("li[role=option]").first().waitFor({ state: "detached", timeout: 10000 }).catch(() => {});
  await shot(page, `settings-${option}`, `Settings dialog: "${name}" set to ${option}`);
  await closeSettings(page);
}

async function typeInDialog(page, name, value) {
  const dialog = await openSettings(page);
  const row = await searchSetting(page, dialog, name);
  const input = row.locator("input").first();
  await input.click();
  await page.keyboard.press("Control+A"); // a number field formats as it is typed: type, as a user would
  await page.keyboard.type(String(value));
  await page.keyboard.press("Tab");
  await page.waitForTimeout(300);
  await shot(page, `settings-number-${value}`, `Settings dialog: "${name}" set to ${value}`);
  await closeSettings(page);
}

async function storedSetting(id, value) {
  for (let i = 0; i < 40; i += 1) {
    const stored = await route("/settings");
    if (stored[id] === value) return stored[id];
    await new Promise((r) => setTimeout(r, 250));
  }
  return (await route("/settings"))[id];
}

// The node search a double-click on an empty canvas opens, as a user types into it: the names of
// the results it lists (PrimeVue's autocomplete options up to 1.35, a listbox of options in 1.49).
async function searchNodes(page, query, shotName) {
  await command(page, "Comfy.NewBlankWorkflow"); // an empty canvas, so the double-click hits no node
  await page.waitForTimeout(1000);
  const canvas = await page.locator("#graph-canvas").boundingBox();
  await page.mouse.move(canvas.x + canvas.width / 2, canvas.y + canvas.height / 2);
  await page.mouse.dblclick(canvas.x + canvas.width / 2, canvas.y + canvas.height / 2);
  const typing = () => page.waitForFunction(() => document.activeElement?.tagName === "INPUT", null, { timeout: 5000 });
  let opened = "double-click on the canvas";
  if (!(await typing().then(() => true, () => false))) {
    // Frontend 1.35 opens no search on a fresh tab's first double-click: its own command, the
    // one the menu's "Toggle Search Box" runs.
    await command(page, "Workspace.SearchBox.Toggle");
    await typing();
    opened = "Toggle Search Box";
  }
  await page.keyboard.type(query, { delay: 40 });
  let results = [];
  for (let i = 0; i < 30; i += 1) { // the list follows the typing after a short debounce
    await page.waitForTimeout(500);
    const now = await page.evaluate(() => [...document.querySelectorAll("[role=option]")]
      .filter((o) => o.offsetWidth || o.offsetHeight)
      .map((o) => ({ // 1.27-1.35 follow the name with a no-break space and the category
        name: (o.querySelector(".option-display-name, .option-container span.truncate")?.textContent
               ?? o.innerText.split("\n")[0]).split("\u00a0")[0].trim(),
        text: o.innerText.replace(/\s+/g, " ").trim(),
      })).filter((o) => o.name));
    if (now.length && JSON.stringify(now) === JSON.stringify(results)) break;
    results = now;
  }
  await shot(page, shotName, `Node search (opened by ${opened}): "${query}" typed; the results it lists`);
  await page.keyboard.press("Escape");
  return results;
}

async function command(page, id) {
  await page.evaluate(async ([id]) => {
    const app = window.comfyAPI?.app?.app ?? window.app;
    await app.extensionManager.command.execute(id);
  }, [id]);
}

async function main() {
  const browser = await chromium.launch({ executablePath: plan.chromium, headless: true,
                                          args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") {
      seen.console.push({ type: m.type(), text: m.text(), url: m.location()?.url ?? "" });
    }
  });
  page.on("pageerror", (e) => seen.console.push({ type: "pageerror", text: String(e.stack ?? e), url: "" }));
  try {
    await page.goto(plan.url, { waitUntil: "domcontentloaded" });
    await page.waitForFunction(() => (window.comfyAPI?.app?.app ?? window.app)?.extensionManager?.setting, null,
                               { timeout: 90000 });
    await page.waitForSelector(".mizuoto-runtime-tab-button", { timeout: 60000 });
    seen.frontend = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ ?? null);
    seen.registered = await page.evaluate(() => {
      const app = window.comfyAPI?.app?.app ?? window.app;
      return ["Mizuoto.compute.vram_mode", "Mizuoto.compute.simulate_vram_mb"].map((id) => app.extensionManager.setting.get(id));
    });
    step("loaded page");

    // 0. The node search finds the pack's nodes by the words users type.
    seen.search = {};
    for (const query of plan.searches) {
      seen.search[query] = await searchNodes(page, query, `0-search-${query.replace(/\W+/g, "-")}`);
    }
    step("search");

    // 1. The demo template on the simulated 16 MB GPU (the dialog value stored before start).
    await loadWorkflow(page, plan.demo);
    await setWidgets(page, { max_new_tokens: 64 });
    seen.demo = await queueAndWait(page, 300);
    await openPanel(page);
    seen.demoPanel = await panelMatchesRoute(page);
    await shot(page, "1-demo-panel", "Demo template ran on the simulated 12 MB GPU; Mizuoto panel: bars and the run's VRAM timeline");
    step("demo");

    // 2. A setting changed in the dialog applies to the next run.
    await chooseInDialog(page, plan.modeName, "none");
    seen.storedMode = await storedSetting("Mizuoto.compute.vram_mode", "none");
    await setWidgets(page, { seed: 7, max_new_tokens: 64 });
    seen.demoNone = await queueAndWait(page, 300);
    await openPanel(page);
    seen.demoNonePanel = await panelMatchesRoute(page);
    await shot(page, "2-demo-vram-none", "Next run after 'How models use VRAM' = none: every component streamed from RAM");
    step("dialog mode none");

    // 3. The Qwen3-TTS CustomVoice template with a tiny checkpoint, on a larger simulated GPU.
    await typeInDialog(page, plan.simulateName, plan.qwenSimulateMb);
    seen.storedSimulate = await storedSetting("Mizuoto.compute.simulate_vram_mb", plan.qwenSimulateMb);
    await chooseInDialog(page, plan.modeName, "normal");
    await loadWorkflow(page, plan.qwen);
    await setWidgets(page, plan.qwenWidgets);
    seen.qwen = await queueAndWait(page, 600);
    await openPanel(page);
    seen.qwenPanel = await panelMatchesRoute(page);
    await shot(page, "3-qwen3tts-panel", "Qwen3-TTS CustomVoice template (tiny checkpoint) ran; panel: its components and timeline lanes");
    step("qwen");

    // 4. Unload Models: the panel shows nothing on the GPU.
    for (let i = 0; i < 8; i += 1) {
      await command(page, "Comfy.Memory.UnloadModels");
      await page.waitForTimeout(2500);
      const state = await route("/mizuoto/runtime");
      if (state.models.every((m) => m.loaded_bytes === 0)) break;
    }
    seen.unloadedPanel = await panelMatchesRoute(page);
    await shot(page, "4-unloaded", "After Unload Models: no Mizuoto bytes left on the GPU");
    for (let i = 0; i < 8; i += 1) {
      await command(page, "Comfy.Memory.UnloadModelsAndExecutionCache");
      await page.waitForTimeout(2500);
      if (!(await route("/mizuoto/runtime")).models.length) break;
    }
    seen.freedPanel = await panelMatchesRoute(page);
    await shot(page, "5-freed", "After Unload Models and Execution Cache: no Mizuoto model loaded");
    step("unloaded");
  } catch (error) {
    seen.error = String(error.stack ?? error);
    await shot(page, "failure", "Where the browser test stopped").catch(() => {});
  } finally {
    await browser.close();
    writeFileSync(join(plan.out, "seen.json"), JSON.stringify(seen, null, 1));
  }
}

await main();
