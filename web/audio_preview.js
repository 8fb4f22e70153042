// Save Audio (WAV) shows a player after it runs, the way core Save Audio does: the frontend
// gives core's audio nodes its own audio widget (AUDIO_UI), which plays the `ui.audio` entries
// the node returns (filename, subfolder, type). The widget is not serialized, so saved
// workflows keep their widget values.
import { app } from "../../scripts/app.js";

const SAVE_NODES = ["MizuotoSaveWav"];

app.registerExtension({
  name: "Mizuoto.AudioPreview",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!SAVE_NODES.includes(nodeData.name)) return;
    nodeData.input ??= {};
    nodeData.input.required ??= {};
    nodeData.input.required.audioUI ??= ["AUDIO_UI", {}];
  },
});
