// Mizuoto's dropdowns follow the engine and checkpoint a node uses: the checkpoint list shows the
// folders the chosen engine can load, and the speaker and language lists those of the chosen
// checkpoint. Nodes that take their engine from a socket (Voice Clone / Voice Design, Text →
// Speech Codes, Text to Speech with an engine connected) follow the loader upstream.
//
// The options come from GET /mizuoto/checkpoints (read-only, no input), fetched once and again
// when the user refreshes node definitions. When the user changes an engine or checkpoint, a
// value that no longer fits is replaced by the first that does; a loaded workflow keeps its
// saved values (the server says at queue time if one no longer fits).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import {
  NODE_WIDGETS, checkpointValues, findChoice, languageValues, pickValue, speakerValues,
} from "./choices.js";

const ENGINE_TYPE = "MIZUOTO_ENGINE";
const MAX_HOPS = 8; // loader → TTS → TTS …: a cycle cannot hang the page

let catalog = null;
let loading = null;

function loadCatalog(force = false) {
  if (!loading || force) {
    loading = api.fetchApi("/mizuoto/checkpoints", { cache: "no-store" })
      .then((response) => (response.ok ? response.json() : null))
      .then((data) => {
        catalog = data;
        return data;
      })
      .catch((error) => {
        console.warn("Mizuoto: checkpoint list unavailable", error);
        return null;
      });
  }
  return loading;
}

function widget(node, name) {
  return name ? node.widgets?.find((w) => w.name === name) : undefined;
}

function setOptions(node, name, values, keep) {
  const w = widget(node, name);
  if (!w || !values.length) return;
  w.options.values = values;
  const value = pickValue(values, w.value, keep);
  if (value !== w.value) {
    w.value = value;
    w.callback?.(value); // let other listeners (and our own) see the new value
  }
}

// The {engine, checkpoint} a node's engine comes from: its own widgets, or the node its
// engine socket is connected to (followed upstream); null when unknown.
function engineSource(node, hops = 0) {
  const spec = NODE_WIDGETS[node?.comfyClass ?? node?.type];
  if (!spec || hops > MAX_HOPS) return null;
  if (spec.socket) {
    const slot = node.findInputSlot?.(spec.socket) ?? -1;
    const upstream = slot >= 0 ? node.getInputNode?.(slot) : null;
    if (upstream) return engineSource(upstream, hops + 1);
  }
  const engine = widget(node, spec.engine);
  const checkpoint = widget(node, spec.checkpoint);
  return engine && checkpoint ? { engine: engine.value, checkpoint: checkpoint.value } : null;
}

function downstream(node) {
  const found = [];
  (node.outputs ?? []).forEach((output, slot) => {
    if (output.type === ENGINE_TYPE) found.push(...(node.getOutputNodes?.(slot) ?? []));
  });
  return found;
}

function refresh(node, keep, hops = 0) {
  const spec = NODE_WIDGETS[node?.comfyClass ?? node?.type];
  if (!catalog || !spec || hops > MAX_HOPS) return;
  if (spec.engine && spec.checkpoint) {
    const engine = widget(node, spec.engine)?.value;
    setOptions(node, spec.checkpoint, checkpointValues(catalog, engine), keep);
  }
  const source = engineSource(node);
  const choice = source ? findChoice(catalog, source.engine, source.checkpoint) : null;
  if (choice) {
    setOptions(node, spec.speaker, speakerValues(choice), keep);
    setOptions(node, spec.language, languageValues(choice), keep);
  }
  for (const next of downstream(node)) refresh(next, keep, hops + 1);
  node.setDirtyCanvas?.(true, true);
}

function follow(node) {
  const spec = NODE_WIDGETS[node?.comfyClass ?? node?.type];
  if (!spec || node.__mizuotoFollows) return;
  node.__mizuotoFollows = true;
  for (const name of [spec.engine, spec.checkpoint]) {
    const w = widget(node, name);
    if (!w) continue;
    const callback = w.callback;
    w.callback = function (...args) {
      const result = callback?.apply(this, args);
      refresh(node, false);
      return result;
    };
  }
}

function allNodes() {
  return (app.rootGraph ?? app.graph)?.nodes ?? [];
}

app.registerExtension({
  name: "Mizuoto.Dropdowns",
  async setup() {
    await loadCatalog();
    for (const node of allNodes()) refresh(node, true);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODE_WIDGETS[nodeData.name]) return;
    const onConnectionsChange = nodeType.prototype.onConnectionsChange;
    nodeType.prototype.onConnectionsChange = function (...args) {
      const result = onConnectionsChange?.apply(this, args);
      // While a workflow loads its links are restored: keep its saved values then.
      refresh(this, Boolean(app.configuringGraph));
      return result;
    };
  },
  nodeCreated(node) {
    follow(node);
    loadCatalog().then(() => refresh(node, true));
  },
  loadedGraphNode(node) {
    follow(node);
    loadCatalog().then(() => refresh(node, true));
  },
  async refreshComboInNodes() {
    await loadCatalog(true);
    for (const node of allNodes()) refresh(node, true);
  },
});
