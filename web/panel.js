// What the Mizuoto panel draws, from GET /mizuoto/runtime: per model its bars (loaded and host
// bytes now, streamed bytes in the last request only) and, per recent request, its VRAM
// timeline — one lane per phase; per component the MB it had on the GPU, streamed from RAM and
// needed as working memory; where it yielded VRAM and for whom; retries and fallbacks. Pure
// functions, no ComfyUI import: mizuoto.js turns them into elements, the tests run them in Node.
//
// The route's `requests` (newest last) hold per request `components` (name, total_mb,
// on_device_mb, streamed_mb, held_mb, why, line) and `timeline` (per phase: name, start_s,
// end_s, components [{name, loaded_mb, streamed_mb, working_mb}], yields [{component,
// for_whom, mb, at_s}], retries, fallbacks).

export const MB = 1024 * 1024;
export const COLORS = { loaded: "#4caf50", streamed: "#2196f3", working: "#ff9800", host: "#9e9e9e" };

export function requestsOf(data) {
  return Array.isArray(data?.requests) ? data.requests : [];
}

export function lastRequest(data) {
  const requests = requestsOf(data);
  return requests.length ? requests[requests.length - 1] : null;
}

// "simulated GPU, 16 MB" for the simulated device, else the device's own name.
export function deviceLabel(device) {
  if (!device) return "no device";
  if (device.label) return device.label;
  return device.simulated ? `simulated GPU, ${device.total_mb} MB` : String(device.device);
}

// The bytes a model streamed in the last request (0 when that request did not use it).
export function streamedLastRequest(data, model) {
  const request = lastRequest(data);
  const entry = request?.components?.find((c) => c.name === model.name);
  return entry ? Math.round((entry.streamed_mb ?? 0) * MB) : 0;
}

// Per model, its three bars: [label, bytes, whole].
export function modelBars(data, model) {
  const streamed = streamedLastRequest(data, model);
  return [
    ["loaded", model.loaded_bytes, model.size_bytes],
    ["streamed", streamed, Math.max(model.size_bytes, streamed)],
    ["host", model.host_bytes, model.size_bytes],
  ];
}

function count(value) {
  if (Array.isArray(value)) return value.length;
  return Number.isFinite(value) ? value : 0;
}

function listOf(value) {
  return Array.isArray(value) ? value : [];
}

// The shapes of one request's timeline chart, in a `width`-wide box: lanes (one per phase,
// placed by time), per component a stacked bar of loaded / streamed / working MB (scaled to
// the request's largest), yield markers at their time, and retry / fallback marks.
export function timelineShapes(request, width = 300) {
  const phases = listOf(request?.timeline);
  const left = 70;
  const span = Math.max(1, width - left - 8);
  const start = Math.min(...phases.map((p) => p.start_s ?? 0), Infinity);
  const end = Math.max(...phases.map((p) => p.end_s ?? 0), -Infinity);
  const seconds = phases.length && end > start ? end - start : 1;
  const x = (s) => left + ((s - (phases.length ? start : 0)) / seconds) * span;
  let largest = 0;
  for (const p of phases) {
    for (const c of listOf(p.components)) {
      largest = Math.max(largest, (c.loaded_mb ?? 0) + (c.streamed_mb ?? 0) + (c.working_mb ?? 0));
    }
  }
  const shapes = [];
  const row = 14;
  let y = 4;
  for (const [index, p] of phases.entries()) {
    const components = listOf(p.components);
    const height = Math.max(1, components.length) * row + 6;
    const x0 = x(p.start_s ?? 0);
    const x1 = Math.max(x0 + 2, x(p.end_s ?? 0));
    const seconds = Math.max(0, (p.end_s ?? 0) - (p.start_s ?? 0));
    shapes.push({ kind: "lane", phase: p.name, index, x: x0, y, w: x1 - x0, h: height,
                  label: p.name, title: `${p.name}: ${seconds.toFixed(2)} s` });
    components.forEach((c, i) => {
      const top = y + 3 + i * row;
      let at = x0 + 2;
      const room = Math.max(4, x1 - x0 - 4);
      shapes.push({ kind: "label", phase: p.name, component: c.name, x: 4, y: top + 10, text: c.name });
      for (const part of ["loaded", "streamed", "working"]) {
        const value = c[`${part}_mb`] ?? 0;
        const w = largest > 0 ? (value / largest) * room : 0;
        shapes.push({ kind: "bar", part, phase: p.name, component: c.name, mb: value, x: at, y: top, w, h: row - 4,
                      color: COLORS[part], title: `${c.name} in ${p.name}: ${value.toFixed(1)} MB ${partWords(part)}` });
        at += w;
      }
    });
    for (const yieldOf of listOf(p.yields)) {
      shapes.push({ kind: "yield", phase: p.name, component: yieldOf.component, forWhom: yieldOf.for_whom,
                    x: x(yieldOf.at_s ?? p.start_s ?? 0), y, h: height,
                    title: `${yieldOf.component} gave up ${(yieldOf.mb ?? 0).toFixed(1)} MB of VRAM for ${yieldOf.for_whom}` });
    }
    const retries = count(p.retries);
    if (retries) {
      shapes.push({ kind: "retry", phase: p.name, count: retries, x: x1 - 4, y, h: height,
                    title: `${p.name}: ran out of VRAM, retried ${retries} time${retries > 1 ? "s" : ""} with more streamed` });
    }
    const fallbacks = listOf(p.fallbacks).length || count(p.fallbacks);
    if (fallbacks) {
      shapes.push({ kind: "fallback", phase: p.name, count: fallbacks, x: x1 - 10, y, h: height,
                    title: `${p.name}: used a cheaper fallback (${listOf(p.fallbacks).join(", ") || fallbacks})` });
    }
    y += height + 4;
  }
  return { width, height: y + 14, shapes, seconds: phases.length ? seconds : 0 };
}

function partWords(part) {
  return { loaded: "on the GPU", streamed: "streamed from RAM", working: "working memory" }[part];
}
