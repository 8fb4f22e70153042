"""The web extension's dropdown logic (`web/choices.js`), run under Node on the catalog the
server really sends (`checkpoints.scan(...).as_dict()`); and every extension script parses.
Skips where Node is not installed."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mizuoto_runtime.app.checkpoints import scan
from mizuoto_runtime.engines.demo.tiny import write as save_checkpoint

from support.layouts import qwen_layout

REPO = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed (the web extension's logic runs in it)")

PROBE = """
import * as c from "./choices.mjs";
const catalog = JSON.parse(process.argv[2]);
const qwen = (path) => c.findChoice(catalog, "qwen3tts", path);
console.log(JSON.stringify({
  demo: c.checkpointValues(catalog, "demo"),
  qwen: c.checkpointValues(catalog, "qwen3tts"),
  unknown: c.checkpointValues(catalog, "nothing"),
  cvByPath: qwen("qwen3tts/tiny-cv")?.value,
  cvSpeakers: c.speakerValues(qwen("qwen3tts/tiny-cv")),
  baseSpeakers: c.speakerValues(qwen("Qwen3-TTS-12Hz-0.6B-Base")),
  languages: c.languageValues(qwen("qwen3tts/tiny-cv")),
  demoLanguages: c.languageValues(c.findChoice(catalog, "demo", "none")),
  wrongEngine: c.findChoice(catalog, "demo", "qwen3tts/tiny-cv"),
  keepSaved: c.pickValue(["a", "b"], "gone", true),
  replaced: c.pickValue(["a", "b"], "gone", false),
  stays: c.pickValue(["a", "b"], "b", false),
  widgets: c.NODE_WIDGETS,
}));
"""


def probe(tmp_path: Path, catalog: dict[str, Any]) -> dict[str, Any]:
    shutil.copy(REPO / "web" / "choices.js", tmp_path / "choices.mjs")
    (tmp_path / "probe.mjs").write_text(PROBE)
    done = subprocess.run([NODE, "probe.mjs", json.dumps(catalog)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_dropdowns_follow_the_engine_and_checkpoint(tmp_path: Path) -> None:
    models = tmp_path / "models"
    save_checkpoint(models / "demo-small")
    qwen_layout(models / "qwen3tts" / "tiny-cv", "custom_voice")
    qwen_layout(models / "Qwen3-TTS-12Hz-0.6B-Base", "base")
    out = probe(tmp_path, scan([models]).as_dict())
    assert out["demo"] == ["none", "demo-small"]
    assert out["qwen"] == ["Qwen3-TTS-12Hz-0.6B-Base", "qwen3tts/tiny-cv (CustomVoice)"]
    assert out["unknown"] == ["(no checkpoint for this engine in models/mizuoto)"]
    assert out["cvByPath"] == "qwen3tts/tiny-cv (CustomVoice)"  # a workflow saved with the bare path
    assert out["cvSpeakers"] == ["alice", "bob", "dylan"] and out["baseSpeakers"] == ["none"]
    assert out["languages"] == ["auto", "chinese", "english", "german"] and out["demoLanguages"] == ["auto"]
    assert out["wrongEngine"] is None
    assert (out["keepSaved"], out["replaced"], out["stays"]) == ("gone", "a", "b")
    assert set(out["widgets"]) == {"MizuotoEngineLoader", "MizuotoTTS", "MizuotoVoicePrompt", "MizuotoTalker"}


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "web").glob("*.js")))
def test_every_extension_script_parses(tmp_path: Path, script: str) -> None:
    module = tmp_path / (Path(script).stem + ".mjs")  # ES modules, as the browser loads them
    shutil.copy(REPO / "web" / script, module)
    done = subprocess.run([NODE, "--check", str(module)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
