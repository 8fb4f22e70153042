"""Scripts and subtitles in a running ComfyUI (issue 33): the two templates (a two-character
dialogue with a pause, a subtitle track) run on the demo engine and write audio; Save Voice
writes to the voice library under the models folder; and a Text to Speech workflow saved by
the previous release (its emotion widgets on the node) still runs."""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from comfyui_harness import REFERENCE_WAV, REPO, ComfyServer, requires_comfyui, running_server, ui_to_api
from test_comfyui_qwen3tts import messages, wav_stream_info

pytestmark = requires_comfyui

TEMPLATES = REPO / "example_workflows"
SCRIPT = "Script to Speech - two characters and a pause (demo engine)"
SUBTITLES = "Subtitles to Speech - a subtitle track (demo engine)"
PREVIOUS_RELEASE = "fd27ba2"  # its Text to Speech carried IndexTTS-2's emotion widgets
RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-scripts-") as running:
        yield running


def run(server: ComfyServer, workflow: dict[str, Any], prefix: str,
        seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    prompt = ui_to_api(workflow, server.get("/object_info"))
    for spec in prompt.values():
        if spec["class_type"] == "LoadAudio":
            spec["inputs"]["audio"] = REFERENCE_WAV
        if spec["class_type"] in ("MizuotoScriptToSpeech", "MizuotoSubtitlesToSpeech", "MizuotoTTS"):
            spec["inputs"].update(max_new_tokens=24, seed=seed)
        if spec["class_type"] == "MizuotoSaveWav":
            spec["inputs"]["filename_prefix"] = prefix
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    return prompt, history


def saved_audio(server: ComfyServer, prompt: dict[str, Any], history: dict[str, Any]) -> tuple[int, int]:
    save = next(node for node, spec in prompt.items() if spec["class_type"] == "MizuotoSaveWav")
    files = [server.output / item["subfolder"] / item["filename"] for item in history["outputs"][save]["audio"]]
    assert len(files) == 1 and files[0].is_file()
    return wav_stream_info(files[0])


def template(title: str) -> dict[str, Any]:
    return json.loads((TEMPLATES / f"{title}.json").read_text(encoding="utf-8"))


def test_the_dialogue_template_writes_audio_and_places_each_part_once(server: ComfyServer) -> None:
    prompt, history = run(server, template(SCRIPT), "audio/script")
    rate, samples = saved_audio(server, prompt, history)
    assert rate == 16000 and samples > rate // 2  # five lines and half a second of pause
    node = next(n for n, spec in prompt.items() if spec["class_type"] == "MizuotoScriptToSpeech")
    shown = history["outputs"][node]["text"][0]
    assert shown.startswith("4 lines, 0 from the cache"), shown


def test_the_subtitle_template_writes_audio_the_adjusted_srt_and_a_report(server: ComfyServer) -> None:
    prompt, history = run(server, template(SUBTITLES), "audio/subtitles")
    rate, samples = saved_audio(server, prompt, history)
    assert samples >= rate * 2  # the third cue starts at 5 s: pad places it there
    node = next(n for n, spec in prompt.items() if spec["class_type"] == "MizuotoSubtitlesToSpeech")
    report = history["outputs"][node]["text"][0]
    assert report.startswith("timing pad: 3 cues"), report


def test_save_voice_writes_to_the_library_and_character_voices_lists_it(server: ComfyServer) -> None:
    prompt = {"1": {"class_type": "LoadAudio", "inputs": {"audio": REFERENCE_WAV}},
              "2": {"class_type": "MizuotoSaveVoice", "inputs": {"audio": ["1", 0], "name": "narrator",
                                                                  "transcript": "Hello.", "overwrite": True}}}
    history = server.wait_history(server.queue(prompt), RUN_TIMEOUT_S)
    assert history["status"]["status_str"] == "success", messages(history)
    assert (server.root / "models" / "mizuoto" / "voices" / "narrator.wav").is_file()
    assert (server.root / "models" / "mizuoto" / "voices" / "narrator.txt").read_text().strip() == "Hello."
    info = server.get("/object_info/MizuotoCharacterVoices")["MizuotoCharacterVoices"]
    assert "narrator" in info["input"]["required"]["library_voice"][1]["options"]


def test_an_interrupt_stops_a_script_between_lines_and_the_next_prompt_runs(server: ComfyServer) -> None:
    prompt = ui_to_api(template(SCRIPT), server.get("/object_info"))
    node = next(n for n, spec in prompt.items() if spec["class_type"] == "MizuotoScriptToSpeech")
    # 200 lines of up to 1024 codes: about two minutes on the demo engine, stopped after 3 s.
    lines = "\n".join(f"[{'Alice' if i % 2 else 'Bob'}] Line {i} of a long script." for i in range(200))
    prompt[node]["inputs"].update(script=lines, max_new_tokens=1024, seed=11)
    for spec in prompt.values():
        if spec["class_type"] == "LoadAudio":
            spec["inputs"]["audio"] = REFERENCE_WAV
    prompt_id = server.queue(prompt)
    time.sleep(3.0)
    interrupted_at = time.monotonic()
    server.post("/interrupt", {})
    history = server.wait_history(prompt_id, 60.0)
    ended_after = time.monotonic() - interrupted_at
    shown = dict(history["status"]["messages"])
    assert history["status"]["status_str"] == "error" and "execution_interrupted" in shown, shown
    assert shown["execution_interrupted"]["node_type"] == "MizuotoScriptToSpeech"
    assert ended_after < 10.0, f"the script took {ended_after:.1f} s to stop"
    assert not any(o.get("audio") for o in history["outputs"].values())
    # Another seed: lines not in the line cache, so the next prompt places the parts again.
    prompt, history = run(server, template(SCRIPT), "audio/after_interrupt", seed=12)
    node = next(n for n, spec in prompt.items() if spec["class_type"] == "MizuotoScriptToSpeech")
    assert history["outputs"][node]["text"][0].startswith("4 lines, 0 from the cache")


def test_a_text_to_speech_workflow_of_the_previous_release_still_runs(server: ComfyServer) -> None:
    path = "example_workflows/Text to Speech - demo engine (no download).json"
    saved = json.loads(subprocess.run(["git", "show", f"{PREVIOUS_RELEASE}:{path}"], cwd=REPO, check=True,
                                      capture_output=True, text=True).stdout)
    tts = next(n for n in saved["nodes"] if n["type"] == "MizuotoTTS")
    assert tts["widgets_values"][-3:] == ["", 1.0, False]  # emotion, emotion_strength, emotion_from_text
    info = server.get("/object_info/MizuotoTTS")["MizuotoTTS"]
    assert not {"emotion", "emotion_strength", "emotion_from_text", "emotion_audio"} & set(info["input"]["optional"])
    prompt, history = run(server, saved, "audio/previous_release")
    assert saved_audio(server, prompt, history)[0] == 16000
