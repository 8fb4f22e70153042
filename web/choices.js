// Which options Mizuoto's dropdowns offer, from GET /mizuoto/checkpoints (the catalog: per
// engine its checkpoints, each with its speakers and languages). Pure functions, no ComfyUI
// import: dropdowns.js applies them to nodes, and the tests run them under Node.
//
// ComfyUI builds a combo's options once per node definition (/object_info), so the server lists
// every engine's checkpoints, speakers and languages there; these functions narrow a node's
// lists to the engine and checkpoint it uses. The server checks the same choice when a prompt
// is queued, so a value a stale list still offers gets a clear error, not a wrong run.

export const NO_SPEAKER = "none";
export const AUTO_LANGUAGE = "auto";
export const NO_CHECKPOINT = "(no checkpoint for this engine in models/mizuoto)";

// Per node type, the names of its widgets and of its engine input (`socket`).
export const NODE_WIDGETS = {
  MizuotoEngineLoader: { engine: "engine", checkpoint: "checkpoint" },
  MizuotoTTS: { engine: "engine_name", checkpoint: "checkpoint", speaker: "speaker", language: "language", socket: "engine" },
  MizuotoVoicePrompt: { speaker: "speaker", socket: "engine" },
  MizuotoTalker: { language: "language", socket: "engine" },
};

export function choicesOf(catalog, engine) {
  return catalog?.engines?.[engine]?.choices ?? [];
}

export function checkpointValues(catalog, engine) {
  const values = choicesOf(catalog, engine).map((c) => c.value);
  return values.length ? values : [NO_CHECKPOINT];
}

// The choice a saved value names: its value, or the bare folder path older workflows saved.
export function findChoice(catalog, engine, value) {
  return choicesOf(catalog, engine).find((c) => c.value === value || (c.path !== null && c.path === value)) ?? null;
}

// A checkpoint with speakers needs one of them; one without takes none.
export function speakerValues(choice) {
  return choice?.speakers?.length ? [...choice.speakers] : [NO_SPEAKER];
}

export function languageValues(choice) {
  return choice?.languages?.length ? [...choice.languages] : [AUTO_LANGUAGE];
}

// The value a widget shows after its options change: the current one while it is valid or
// while a saved workflow is being shown as saved (`keep`), else the first option.
export function pickValue(values, current, keep) {
  return keep || values.includes(current) ? current : values[0];
}
