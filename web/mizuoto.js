// Mizuoto's frontend extension: a sidebar panel of the memory runtime, read from GET
// /mizuoto/runtime — each model's loaded and host bytes now and what it streamed in the last
// request, as bars, and each recent request's VRAM timeline (panel.js); the memory settings in
// ComfyUI's settings dialog (settings.js); and each Mizuoto node's memory report, shown on the
// node after it runs.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { ComfyWidgets } from "../../scripts/widgets.js";
import { MB, COLORS, deviceLabel, modelBars, requestsOf, timelineShapes } from "./panel.js";
import { settingDefinitions } from "./settings.js";

const REFRESH_SETTING = "Mizuoto.RuntimePanel.RefreshSeconds";
const SVG = "http://www.w3.org/2000/svg";
const CHARTS = 3; // the newest requests drawn

const PANEL_SETTINGS = [
  {
    id: REFRESH_SETTING,
    name: "Runtime panel: refresh every (seconds)",
    type: "number",
    defaultValue: 2,
    attrs: { min: 0.5, max: 60, step: 0.5 },
    tooltip: "How often the Mizuoto sidebar panel reads the runtime's state while it is open.",
    category: ["Mizuoto", "Panel", "Refresh"],
  },
  ...settingDefinitions(),
];

function element(tag, css, text) {
  const el = document.createElement(tag);
  if (css) el.style.cssText = css;
  if (text !== undefined) el.textContent = text;
  return el;
}

function bar(label, bytes, whole, color) {
  const row = element("div", "display:flex;align-items:center;gap:6px;font-size:11px;margin:2px 0");
  row.className = "mizuoto-bar";
  row.dataset.bar = label;
  row.dataset.bytes = String(bytes);
  const track = element("div", "flex:1;height:8px;background:var(--comfy-input-bg,#333);border-radius:4px;overflow:hidden");
  const share = whole > 0 ? Math.min(1, bytes / whole) : 0;
  track.append(element("div", `height:100%;width:${(share * 100).toFixed(1)}%;background:${color}`));
  const words = label === "streamed" ? "streamed (last run)" : label;
  row.append(element("span", "width:96px;opacity:.8", words), track,
             element("span", "width:64px;text-align:right", `${(bytes / MB).toFixed(1)} MB`));
  return row;
}

function svg(tag, attrs, title) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (title) {
    const t = document.createElementNS(SVG, "title");
    t.textContent = title;
    el.append(t);
  }
  return el;
}

function drawShape(shape) {
  const data = { "data-kind": shape.kind, "data-phase": shape.phase ?? "" };
  if (shape.component) data["data-component"] = shape.component;
  switch (shape.kind) {
    case "lane": {
      const g = svg("g", data, shape.title);
      g.append(svg("rect", { x: shape.x, y: shape.y, width: shape.w, height: shape.h, rx: 3,
                             fill: "rgba(127,127,127,.10)", stroke: "rgba(127,127,127,.4)" }));
      const text = svg("text", { x: shape.x + 4, y: shape.y + 9, "font-size": 9, "font-weight": "bold", fill: "currentColor" });
      text.textContent = shape.label;
      g.append(text);
      return g;
    }
    case "run":
      return svg("rect", { ...data, x: shape.x, y: shape.y, width: shape.w, height: shape.h, rx: 2,
                           fill: "rgba(127,127,127,.55)" }, shape.title);
    case "heading": {
      const text = svg("text", { x: shape.x, y: shape.y, "font-size": 8, fill: "currentColor", opacity: 0.6 });
      text.textContent = shape.text;
      return text;
    }
    case "label": {
      const text = svg("text", { ...data, x: shape.x, y: shape.y, "font-size": 9, fill: "currentColor", opacity: 0.8 });
      text.textContent = shape.text;
      return text;
    }
    case "bar":
      return svg("rect", { ...data, "data-part": shape.part, "data-mb": shape.mb, x: shape.x, y: shape.y,
                           width: Math.max(0, shape.w), height: shape.h, fill: shape.color }, shape.title);
    case "yield":
      return svg("path", { ...data, "data-for": shape.forWhom ?? "", fill: "#e91e63",
                           d: `M${shape.x - 4},${shape.y} L${shape.x + 4},${shape.y} L${shape.x},${shape.y + shape.h} Z` }, shape.title);
    case "retry":
    case "fallback":
      return svg("rect", { ...data, x: shape.x - 1, y: shape.y, width: 3, height: shape.h,
                           fill: shape.kind === "retry" ? "#f44336" : "#9c27b0" }, shape.title);
    default:
      return null;
  }
}

function timelineChart(request, index) {
  const box = element("div", "margin:8px 0");
  box.className = "mizuoto-timeline";
  box.dataset.request = String(index);
  box.dataset.id = String(request.id ?? "");
  box.dataset.running = String(Boolean(request.running));
  const layout = timelineShapes(request, 300);
  const streamed = request.streamed_mb ?? 0;
  const state = request.running ? " (running)" : "";
  box.append(element("div", "font-size:11px;opacity:.8",
                     `Run ${request.id ?? index + 1}${state}: ${layout.seconds.toFixed(2)} s, ${streamed.toFixed(1)} MB streamed from RAM`));
  const chart = svg("svg", { width: "100%", viewBox: `0 0 ${layout.width} ${layout.height}`, role: "img",
                             style: "display:block;max-width:100%" });
  for (const shape of layout.shapes) {
    const drawn = drawShape(shape);
    if (drawn) chart.append(drawn);
  }
  box.append(chart);
  return box;
}

function legend() {
  const row = element("div", "display:flex;gap:8px;flex-wrap:wrap;font-size:10px;opacity:.8");
  for (const [part, words] of [["loaded", "on the GPU"], ["streamed", "streamed from RAM"], ["working", "working memory"]]) {
    const key = element("span", "", ` ${words}`);
    key.prepend(element("span", `display:inline-block;width:8px;height:8px;background:${COLORS[part]}`));
    row.append(key);
  }
  row.append(element("span", "color:#e91e63", "▼ gave VRAM up"), element("span", "color:#f44336", "| retry"),
             element("span", "color:#9c27b0", "| fallback"));
  return row;
}

function renderRuntime(el, data) {
  el.replaceChildren();
  const device = data.device;
  const head = element("div", "font-size:12px;margin-bottom:8px",
                       `${deviceLabel(device)}: ${device.free_mb} of ${device.total_mb} MB free · VRAM use ${data.policy.mode}`);
  head.className = "mizuoto-device";
  el.append(head);
  const models = element("div");
  models.className = "mizuoto-models";
  if (!data.models.length) models.append(element("div", "", "No Mizuoto model loaded."));
  for (const m of data.models) {
    const box = element("div", "margin-bottom:10px");
    box.className = "mizuoto-model";
    box.dataset.name = m.name;
    box.append(element("div", "font-weight:bold;font-size:12px", `${m.engine}: ${m.name} — ${(m.size_bytes / MB).toFixed(1)} MB`));
    if (m.line) box.append(element("div", "font-size:11px;opacity:.8", m.line));
    for (const [label, bytes, whole] of modelBars(m)) box.append(bar(label, bytes, whole, COLORS[label]));
    models.append(box);
  }
  el.append(models);
  const requests = requestsOf(data);
  if (requests.length) {
    el.append(element("div", "font-weight:bold;font-size:12px;margin-top:8px", "VRAM over each recent run"), legend());
    const first = Math.max(0, requests.length - CHARTS);
    for (let i = requests.length - 1; i >= first; i -= 1) el.append(timelineChart(requests[i], i));
  }
}

function mountPanel(el) {
  const body = document.createElement("div");
  body.style.cssText = "padding:8px 16px 8px 8px;box-sizing:border-box;width:100%;overflow-wrap:anywhere";
  el.append(body);
  // The frontend calls render before it attaches the element: stop polling only once the
  // panel has been shown and then closed.
  let shown = false;
  const refresh = async () => {
    if (el.isConnected) shown = true;
    else if (shown) return;
    try {
      const response = await api.fetchApi("/mizuoto/runtime");
      renderRuntime(body, await response.json());
    } catch (error) {
      body.textContent = `Mizuoto runtime unavailable: ${error}`;
    }
    const seconds = settingValue(REFRESH_SETTING) ?? 2;
    setTimeout(refresh, Math.max(0.5, seconds) * 1000);
  };
  refresh();
}

// The report's text area grows to show every line (one per component), wrapped at the node's
// width: the frontend sizes a DOM widget by its options' getMinHeight.
function reportHeight(node, el, text) {
  const style = getComputedStyle(el);
  const fontPx = parseFloat(style.fontSize) || 11;
  const linePx = parseFloat(style.lineHeight) || fontPx * 1.25;
  const perLine = Math.max(20, Math.floor((node.size[0] - 24) / (fontPx * 0.62)));
  const lines = text.split("\n").reduce((n, line) => n + Math.max(1, Math.ceil(line.length / perLine)), 0);
  return Math.ceil(lines * linePx + 12);
}

function showReport(node, text) {
  let widget = node.widgets?.find((w) => w.name === "mizuoto_memory");
  if (!widget) {
    widget = ComfyWidgets.STRING(node, "mizuoto_memory", ["STRING", { multiline: true }], app).widget;
    widget.options.serialize = false; // a display, not an input of the prompt
    widget.inputEl.readOnly = true;
    widget.inputEl.style.opacity = 0.7;
    widget.options.getMinHeight = () => reportHeight(node, widget.inputEl, widget.value ?? "");
  }
  widget.value = text;
  const [width, height] = node.computeSize();
  node.setSize([Math.max(node.size[0], width), Math.max(node.size[1], height)]);
  node.setDirtyCanvas?.(true, true);
}

// Newer frontends read an extension's `settings`; the legacy one only `app.ui.settings.addSetting`.
function settingValue(id) {
  const store = app.extensionManager?.setting;
  return store ? store.get(id) : app.ui?.settings?.getSettingValue?.(id);
}

app.registerExtension({
  name: "Mizuoto.Runtime",
  settings: PANEL_SETTINGS,
  async init() {
    if (app.extensionManager?.setting || !app.ui?.settings?.addSetting) return;
    for (const definition of PANEL_SETTINGS) app.ui.settings.addSetting(definition);
  },
  async setup() {
    app.extensionManager?.registerSidebarTab?.({
      id: "mizuoto-runtime",
      icon: "pi pi-chart-bar",
      title: "Mizuoto",
      tooltip: "Mizuoto: what its TTS models hold on the GPU and in RAM, and VRAM over each recent run",
      type: "custom",
      render: mountPanel,
    });
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!nodeData.name?.startsWith("Mizuoto")) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.text?.length) showReport(this, message.text.join("\n"));
    };
  },
});
