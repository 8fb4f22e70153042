// Mizuoto's frontend extension: a sidebar panel with each model's loaded / streamed / host bytes
// from GET /mizuoto/runtime as bars (M51), its refresh interval as a setting, and each Mizuoto
// node's memory report (meta.memory, M50) shown on the node after it runs.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const REFRESH_SETTING = "Mizuoto.RuntimePanel.RefreshSeconds";
const MB = 1024 * 1024;

function bar(label, bytes, whole, color) {
  const row = document.createElement("div");
  row.style.cssText = "display:flex;align-items:center;gap:6px;font-size:11px;margin:2px 0";
  const name = document.createElement("span");
  name.style.cssText = "width:56px;opacity:.8";
  name.textContent = label;
  const track = document.createElement("div");
  track.style.cssText = "flex:1;height:8px;background:var(--comfy-input-bg,#333);border-radius:4px;overflow:hidden";
  const fill = document.createElement("div");
  const share = whole > 0 ? Math.min(1, bytes / whole) : 0;
  fill.style.cssText = `height:100%;width:${(share * 100).toFixed(1)}%;background:${color}`;
  track.append(fill);
  const value = document.createElement("span");
  value.style.cssText = "width:72px;text-align:right";
  value.textContent = `${(bytes / MB).toFixed(1)} MB`;
  row.append(name, track, value);
  return row;
}

function renderRuntime(el, data) {
  el.replaceChildren();
  const device = data.device;
  const head = document.createElement("div");
  head.style.cssText = "font-size:12px;margin-bottom:8px";
  head.textContent = `${device.device}${device.simulated ? " (simulated)" : ""}: ${device.free_mb} of ${device.total_mb} MB free · mode ${data.policy.mode}`;
  el.append(head);
  if (!data.models.length) {
    el.append(Object.assign(document.createElement("div"), { textContent: "No Mizuoto model loaded." }));
  }
  for (const m of data.models) {
    const box = document.createElement("div");
    box.style.cssText = "margin-bottom:10px";
    const title = document.createElement("div");
    title.style.cssText = "font-weight:bold;font-size:12px";
    title.textContent = `${m.engine}:${m.name} — ${(m.size_bytes / MB).toFixed(1)} MB, ${m.resident_units}/${m.units} units`;
    box.append(title,
      bar("loaded", m.loaded_bytes, m.size_bytes, "#4caf50"),
      bar("streamed", m.streamed_bytes, Math.max(m.size_bytes, m.streamed_bytes), "#2196f3"),
      bar("host", m.host_bytes, m.size_bytes, "#9e9e9e"));
    el.append(box);
  }
}

function mountPanel(el) {
  const body = document.createElement("div");
  body.style.cssText = "padding:8px";
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
    const seconds = app.extensionManager?.setting?.get(REFRESH_SETTING) ?? 2;
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

app.registerExtension({
  name: "Mizuoto.Runtime",
  settings: [
    {
      id: REFRESH_SETTING,
      name: "Mizuoto runtime panel: refresh every (seconds)",
      type: "number",
      defaultValue: 2,
      attrs: { min: 0.5, max: 60, step: 0.5 },
    },
  ],
  async setup() {
    app.extensionManager?.registerSidebarTab?.({
      id: "mizuoto-runtime",
      icon: "pi pi-chart-bar",
      title: "Mizuoto",
      tooltip: "Mizuoto models: loaded, streamed and host bytes",
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
