// What the Mizuoto panel draws, from GET /mizuoto/runtime: per model its bars (loaded and host
// bytes now, streamed bytes in the last request that used it) and, per recent request, its VRAM
// timeline — one lane per phase; per component the MB it had on the GPU, streamed from RAM and
// needed as working memory; where components yielded VRAM and for whom; retries and fallbacks.
// Pure functions, no ComfyUI import: mizuoto.js turns them into elements, the tests run them in
// Node. The payload's format is documented in mizuoto_runtime/report.py.

export const MB = 1024 * 1024;
export const COLORS = { loaded: "#4caf50", streamed: "#2196f3", working: "#ff9800", host: "#9e9e9e" };

export function requestsOf(data) {
  return Array.isArray(data?.requests) ? data.requests : [];
}

// "simulated GPU, 16 MB" for the simulated device, else the device's own name.
export function deviceLabel(device) {
  if (!device) return "no device";
  if (device.name) return device.name;
  return device.simulated ? `simulated GPU, ${device.total_mb} MB` : String(device.device);
}

// Per model, its three bars: [label, bytes, whole]. `streamed_bytes` is the last request's.
export function modelBars(model) {
  const streamed = model.streamed_bytes ?? 0;
  return [
    ["loaded", model.loaded_bytes, model.size_bytes],
    ["streamed", streamed, Math.max(model.size_bytes, streamed)],
    ["host", model.host_bytes, model.size_bytes],
  ];
}

function listOf(value) {
  return Array.isArray(value) ? value : [];
}

function short(name) {
  return String(name ?? "").split(":").pop(); // "demo:acoustic" → "acoustic"
}

function names(value) {
  return (Array.isArray(value) ? value : [value]).filter(Boolean).map(short).join(", ");
}

// The shapes of one request's timeline chart, in a `width`-wide box: one lane per phase name
// (a phase run again, chunk after chunk, stays in its lane), each run placed by time; per
// component a stacked bar of loaded / streamed / working MB (scaled to the request's largest);
// a mark where components yielded VRAM (and for whom), where a step was retried after running
// out of memory, and where a fallback was used.
export function timelineShapes(request, width = 300) {
  const runs = listOf(request?.timeline);
  const left = 70;
  const span = Math.max(1, width - left - 8);
  const end = Math.max(0, ...runs.map((r) => r.end_s ?? 0));
  const seconds = end > 0 ? end : 1;
  const x = (s) => left + ((s ?? 0) / seconds) * span;
  const lanes = [];
  for (const r of runs) if (!lanes.includes(r.name)) lanes.push(r.name);
  const row = 14;
  const laneComponents = lanes.map((name) => {
    const found = [];
    for (const r of runs) {
      if (r.name !== name) continue;
      for (const c of listOf(r.components)) if (!found.includes(c.name)) found.push(c.name);
    }
    return found;
  });
  let largest = 0;
  for (const r of runs) {
    for (const c of listOf(r.components)) {
      largest = Math.max(largest, (c.loaded_mb ?? 0) + (c.streamed_mb ?? 0) + (c.working_mb ?? 0));
    }
  }
  const tops = [];
  let y = 4;
  const shapes = [];
  lanes.forEach((name, index) => {
    const height = Math.max(1, laneComponents[index].length) * row + 16;
    tops.push(y);
    shapes.push({ kind: "lane", phase: name, index, x: 2, y, w: width - 4, h: height, label: name,
                  title: `${name}: ${runs.filter((r) => r.name === name).length} run(s)` });
    laneComponents[index].forEach((component, i) => {
      shapes.push({ kind: "label", phase: name, component, x: 6, y: y + 12 + i * row + 10, text: short(component) });
    });
    y += height + 4;
  });
  for (const r of runs) {
    const index = lanes.indexOf(r.name);
    const top = tops[index];
    const height = Math.max(1, laneComponents[index].length) * row + 16;
    const x0 = x(r.start_s);
    const x1 = Math.max(x0 + 3, x(r.end_s));
    shapes.push({ kind: "run", phase: r.name, x: x0, y: top + 10, w: x1 - x0, h: height - 12,
                  title: `${r.name}: ${(r.start_s ?? 0).toFixed(2)}–${(r.end_s ?? 0).toFixed(2)} s, ` +
                         `working memory ${(r.working_mb ?? 0).toFixed(1)} MB` });
    for (const c of listOf(r.components)) {
      const i = laneComponents[index].indexOf(c.name);
      let at = x0 + 1;
      const room = Math.max(3, x1 - x0 - 2);
      for (const part of ["loaded", "streamed", "working"]) {
        const value = c[`${part}_mb`] ?? 0;
        const w = largest > 0 ? (value / largest) * room : 0;
        shapes.push({ kind: "bar", part, phase: r.name, component: c.name, mb: value, x: at, y: top + 13 + i * row,
                      w, h: row - 4, color: COLORS[part],
                      title: `${short(c.name)} in ${r.name}: ${value.toFixed(1)} MB ${partWords(part)}` });
        at += w;
      }
    }
    for (const given of listOf(r.yields)) {
      shapes.push({ kind: "yield", phase: r.name, component: given.component, forWhom: names(given.for_whom),
                    x: x(given.at_s ?? r.start_s), y: top, h: height,
                    title: `${short(given.component)} gave up ${(given.mb ?? 0).toFixed(1)} MB of VRAM for ` +
                           `${names(given.for_whom)}` });
    }
    for (const retry of listOf(r.retries)) {
      shapes.push({ kind: "retry", phase: r.name, x: x(retry.at_s ?? r.end_s), y: top, h: height,
                    title: `${r.name}: ran out of VRAM (${retry.error ?? "out of memory"}); ` +
                           `retry ${retry.attempt ?? ""} with more streamed from RAM, same result` });
    }
    for (const fallback of listOf(r.fallbacks)) {
      shapes.push({ kind: "fallback", phase: r.name, x: x(fallback.at_s ?? r.end_s), y: top, h: height,
                    title: `${r.name}: used a cheaper fallback (${fallback.what ?? fallback})` });
    }
  }
  return { width, height: y + 4, shapes, seconds: runs.length ? end : 0 };
}

function partWords(part) {
  return { loaded: "on the GPU", streamed: "streamed from RAM", working: "working memory" }[part];
}
