// What the Mizuoto panel draws, from GET /mizuoto/runtime: per model its bars (loaded and host
// bytes now, streamed bytes in the last request that used it) and, per recent request, its VRAM
// timeline — one lane per phase; per component the MB it had on the GPU, streamed from RAM and
// needed as working memory; where components yielded VRAM and for whom; retries and fallbacks.
// Pure functions, no ComfyUI import: mizuoto.js turns them into elements, the tests run them in
// Node. The payload's format is documented in mizuoto_runtime/memory/report.py.

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

// The shapes of one request's timeline chart, `width` wide. One lane per phase name (a phase
// run again, chunk after chunk, stays in its lane). A lane's top strip is time: a box where each
// run of the phase ran, a mark where components yielded VRAM (and for whom), where a step was
// retried after running out of memory, where a fallback was used. Under it, one row per
// component: its VRAM in the phase (on the GPU, then working memory) on the device's scale, and
// what streamed from RAM in the phase on the request's largest stream (streaming can copy a
// model many times over, so the two get their own scales).
export function timelineShapes(request, width = 300) {
  const runs = listOf(request?.timeline);
  const left = 70;
  const right = width - 4;
  const end = Math.max(0, ...runs.map((r) => r.end_s ?? 0));
  const x = (s) => left + ((s ?? 0) / (end > 0 ? end : 1)) * (right - left);
  const middle = left + (right - left) * 0.6;
  const lanes = [];
  for (const r of runs) if (!lanes.includes(r.name)) lanes.push(r.name);
  const perLane = lanes.map((name) => {
    const components = new Map();
    for (const r of runs.filter((run) => run.name === name)) {
      for (const c of listOf(r.components)) {
        const seen = components.get(c.name) ?? { loaded: 0, working: 0, streamed: 0 };
        seen.loaded = Math.max(seen.loaded, c.loaded_mb ?? 0);
        seen.working = Math.max(seen.working, c.working_mb ?? 0);
        seen.streamed += c.streamed_mb ?? 0;
        components.set(c.name, seen);
      }
    }
    return components;
  });
  const vram = Math.max(request?.device_mb ?? 0,
                        ...perLane.flatMap((m) => [...m.values()].map((c) => c.loaded + c.working)), 1e-9);
  const streamed = Math.max(1e-9, ...perLane.flatMap((m) => [...m.values()].map((c) => c.streamed)));
  const row = 12;
  const strip = 12;
  const device = request?.device_mb ? `VRAM (of ${request.device_mb} MB)` : "VRAM";
  const shapes = runs.length ? [{ kind: "heading", x: left, y: 9, text: device },
                                { kind: "heading", x: middle, y: 9, text: "streamed from RAM" }] : [];
  let y = 14;
  lanes.forEach((name, index) => {
    const components = [...perLane[index].entries()];
    const height = strip + Math.max(1, components.length) * row + 6;
    const count = runs.filter((r) => r.name === name).length;
    shapes.push({ kind: "lane", phase: name, index, x: 2, y, w: width - 4, h: height, label: name,
                  title: `${name}: ran ${count} time${count > 1 ? "s" : ""}` });
    for (const r of runs.filter((run) => run.name === name)) {
      const x0 = x(r.start_s);
      shapes.push({ kind: "run", phase: name, x: x0, y: y + 2, w: Math.max(2, x(r.end_s) - x0), h: strip - 4,
                    title: `${name}: ${(r.start_s ?? 0).toFixed(2)}–${(r.end_s ?? 0).toFixed(2)} s, ` +
                           `working memory ${(r.working_mb ?? 0).toFixed(1)} MB` });
      for (const given of listOf(r.yields)) {
        shapes.push({ kind: "yield", phase: name, component: given.component, forWhom: names(given.for_whom),
                      x: x(given.at_s ?? r.start_s), y: y + 1, h: strip - 2,
                      title: `${short(given.component)} gave up ${(given.mb ?? 0).toFixed(1)} MB of VRAM for ` +
                             `${names(given.for_whom)}` });
      }
      for (const retry of listOf(r.retries)) {
        shapes.push({ kind: "retry", phase: name, x: x(retry.at_s ?? r.end_s), y: y + 1, h: strip - 2,
                      title: `${name}: ran out of VRAM (${retry.error ?? "out of memory"}); ` +
                             `retry ${retry.attempt ?? ""} with more streamed from RAM, same result` });
      }
      for (const fallback of listOf(r.fallbacks)) {
        shapes.push({ kind: "fallback", phase: name, x: x(fallback.at_s ?? r.end_s), y: y + 1, h: strip - 2,
                      title: `${name}: used a cheaper fallback (${fallback.what ?? fallback})` });
      }
    }
    components.forEach(([component, c], i) => {
      const top = y + strip + i * row;
      shapes.push({ kind: "label", phase: name, component, x: 8, y: top + 9, text: short(component) });
      let at = left;
      for (const part of ["loaded", "working"]) {
        const w = (c[part] / vram) * (middle - left - 4);
        shapes.push({ kind: "bar", part, phase: name, component, mb: c[part], x: at, y: top + 1, w, h: row - 3,
                      color: COLORS[part], title: `${short(component)} in ${name}: ${c[part].toFixed(1)} MB ${partWords(part)}` });
        at += w;
      }
      shapes.push({ kind: "bar", part: "streamed", phase: name, component, mb: c.streamed, x: middle,
                    y: top + 1, w: (c.streamed / streamed) * (right - middle - 2), h: row - 3, color: COLORS.streamed,
                    title: `${short(component)} in ${name}: ${c.streamed.toFixed(1)} MB ${partWords("streamed")}` });
    });
    y += height + 3;
  });
  return { width, height: y + 2, shapes, seconds: runs.length ? end : 0 };
}

function partWords(part) {
  return { loaded: "on the GPU", streamed: "streamed from RAM", working: "working memory" }[part];
}
