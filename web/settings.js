// The memory settings Mizuoto adds to ComfyUI's settings dialog (Settings → Mizuoto). Pure data
// and functions, no ComfyUI import: mizuoto.js registers them, and the tests run them under Node
// and check them against the runtime's own list of settings, defaults and ranges.
//
// ComfyUI stores a changed value under the setting's id in the user's comfy.settings.json; the
// pack reads that file when a Mizuoto node starts, so a change applies to the next run. A TTS
// Memory Settings node in a workflow replaces these values while that workflow runs.
//
// Number fields cannot be left empty: `unset` is the number that means automatic / no limit / off.

export const PREFIX = "Mizuoto.";
export const CATEGORY = "Mizuoto";
export const SECTION = "Memory";

export const COMPUTE_SETTINGS = [
  {
    key: "compute.vram_mode", name: "How models use VRAM", type: "combo", defaultValue: "normal",
    options: ["high", "shared", "normal", "low", "none"],
    tooltip: "high: load each model whole and keep it. shared: move whole models on and off the GPU. " +
      "normal: load whole when it fits, otherwise keep part on the GPU and stream the rest from RAM. " +
      "low: keep little on the GPU. none: stream every layer from RAM (slowest). The audio is the same in every mode.",
  },
  {
    key: "compute.vram_reserve_mb", name: "VRAM kept free for others (MB)", type: "number", defaultValue: -1,
    unset: -1, attrs: { min: -1, max: 1048576, step: 64 },
    tooltip: "VRAM Mizuoto leaves free for ComfyUI's other models and their working memory. -1: automatic (ComfyUI's own reserve).",
  },
  {
    key: "compute.vram_limit_mb", name: "Most VRAM Mizuoto may use (MB)", type: "number", defaultValue: 0,
    unset: 0, attrs: { min: 0, max: 1048576, step: 64 },
    tooltip: "An upper bound on the VRAM Mizuoto's models take; what does not fit streams from RAM. 0: no limit.",
  },
  {
    key: "compute.gpu_jobs", name: "TTS jobs at once per GPU", type: "number", defaultValue: 1,
    attrs: { min: 1, max: 16, step: 1 },
    tooltip: "How many TTS requests may run on one GPU at the same time. More needs more VRAM.",
  },
  {
    key: "compute.async_offload", name: "Layers copied ahead while streaming", type: "number", defaultValue: 1,
    attrs: { min: 0, max: 8, step: 1 },
    tooltip: "While a model streams from RAM, this many layers are copied to the GPU ahead of the one running. " +
      "More hides copy time but uses more VRAM. 0: copy each layer when it is needed.",
  },
  {
    key: "compute.max_pinned_mb", name: "Pinned RAM for fast copies (MB)", type: "number", defaultValue: -1,
    unset: -1, attrs: { min: -1, max: 1048576, step: 256 },
    tooltip: "RAM locked for fast copies to the GPU. -1: automatic (the amount ComfyUI would pin).",
  },
  {
    key: "compute.host_copies", name: "Keep a RAM copy of weights on the GPU", type: "combo", defaultValue: "auto",
    options: ["auto", "on", "off"],
    tooltip: "on: weights on the GPU keep their copy in RAM, so moving them off is instant. off: saves RAM. " +
      "auto: keep them while free RAM stays above \"RAM kept free\".",
  },
  {
    key: "compute.ram_reserve_mb", name: "RAM kept free (MB)", type: "number", defaultValue: -1,
    unset: -1, attrs: { min: -1, max: 1048576, step: 256 },
    tooltip: "When free RAM drops below this, idle TTS models are unloaded from RAM. -1: automatic (2 GB or a tenth of RAM, whichever is larger).",
  },
  {
    key: "compute.max_resident_models", name: "TTS models kept loaded", type: "number", defaultValue: 0,
    attrs: { min: 0, max: 64, step: 1 },
    tooltip: "How many TTS models stay loaded in RAM; the least recently used goes first. 0: no limit.",
  },
  {
    key: "compute.unload_after_minutes", name: "Unload idle models after (minutes)", type: "number", defaultValue: 0,
    attrs: { min: 0, max: 10080, step: 1 },
    tooltip: "A TTS model not used for this long is unloaded when the next Mizuoto node starts. 0: never.",
  },
  {
    key: "compute.oom_retry", name: "Retry when VRAM runs out", type: "boolean", defaultValue: true,
    tooltip: "When the GPU runs out of memory, run the step again with more of the model streamed from RAM: slower, same audio.",
  },
  {
    key: "compute.oom_fallback", name: "Allow cheaper fallbacks when VRAM runs out", type: "boolean", defaultValue: false,
    tooltip: "When retries still run out of memory, let engines use a cheaper method; the audio then differs slightly.",
  },
  {
    key: "compute.kv_cache", name: "Attention cache", type: "combo", defaultValue: "dynamic",
    options: ["dynamic", "static"],
    tooltip: "static: Qwen3-TTS writes its attention cache into buffers made in advance (less memory churn; " +
      "on a GPU some sums may run in another order). dynamic: the cache grows step by step.",
  },
  {
    key: "compute.simulate_vram_mb", name: "Simulate a small GPU (MB, tests and demos)", type: "number", defaultValue: 0,
    unset: 0, attrs: { min: 0, max: 1048576, step: 1 },
    tooltip: "Make the CPU act as a GPU with this much memory, to see streaming without a GPU. 0: off. Changing it reloads Mizuoto's models.",
  },
  {
    key: "compute.weights", name: "How model weights are stored", type: "combo", defaultValue: "as published",
    options: ["as published", "fp8_e4m3fn", "fp8_e5m2", "int8"],
    tooltip: "For engines loaded after the change whose loader says \"from settings\". fp8 and int8 store layer weights " +
      "in 8 bits: half a bfloat16 model's RAM, VRAM and streamed bytes, and slightly different audio. " +
      "Parts of an engine that refuse one keep their weights as published.",
  },
];

export function settingId(key) {
  return PREFIX + key;
}

// The definitions ComfyUI's frontend takes (the extension's `settings` array, or one
// `app.ui.settings.addSetting` call each in older frontends).
export function settingDefinitions() {
  return COMPUTE_SETTINGS.map((s) => {
    const definition = {
      id: settingId(s.key), name: s.name, type: s.type, defaultValue: s.defaultValue, tooltip: s.tooltip,
      category: [CATEGORY, SECTION, s.name],
    };
    if (s.options) definition.options = [...s.options];
    if (s.attrs) definition.attrs = { ...s.attrs };
    return definition;
  });
}
