"""Voices by name (issue 33, item 2, the folder part): the voice library folder, and the on-disk
store of prompted voices (safetensors, never pickled, bounded, damaged entries dropped)."""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mizuoto_runtime import Runtime
from mizuoto_runtime.app.scripts.voices import VoiceLibrary, check_voice_name
from mizuoto_runtime.audio import Audio, read_wav, write_wav
from mizuoto_runtime.engines.base import Sampling, Voice
from mizuoto_runtime.engines.voice_store import VoiceError, VoicePromptStore, cacheable, prompt_key
from mizuoto_runtime.errors import MizuotoError

REPO = Path(__file__).resolve().parents[2]


def clip(seconds: float = 0.1, rate: int = 16000, value: float = 0.25) -> Audio:
    return Audio(torch.full((1, round(seconds * rate)), value), rate)


@pytest.fixture
def library(tmp_path: Path) -> VoiceLibrary:
    first, second = tmp_path / "voices", tmp_path / "extra"
    (first / "characters").mkdir(parents=True)
    second.mkdir()
    write_wav(first / "alice.wav", clip(value=0.5))
    (first / "alice.txt").write_text("Hello, I am Alice.\n", encoding="utf-8")
    write_wav(first / "bob.WAV", clip())
    (first / "bob.reference.txt").write_text("Bob here.", encoding="utf-8")
    write_wav(first / "carol.wav", clip())
    write_wav(first / "characters" / "dave.wav", clip())
    (first / "characters" / "dave.txt").write_text("Dave.", encoding="utf-8")
    (first / "notes.txt").write_text("not a voice", encoding="utf-8")
    write_wav(second / "alice.wav", clip(value=-0.5))  # shadowed by the first folder's
    write_wav(second / "eve.wav", clip())
    return VoiceLibrary([first, second, tmp_path / "not-there-yet"])


def test_the_library_lists_voices_by_name_across_its_folders(library: VoiceLibrary) -> None:
    assert library.names() == ["alice", "bob", "carol", "characters/dave", "eve"]
    audio, transcript = library.load("alice")
    assert transcript == "Hello, I am Alice." and audio.sample_rate == 16000
    assert torch.allclose(audio.waveform, torch.full_like(audio.waveform, 0.5), atol=1e-4)  # the first folder's
    assert library.load("bob")[1] == "Bob here."  # TTS-Audio-Suite's NAME.reference.txt
    assert library.load("carol")[1] is None
    assert library.load("characters/dave")[1] == "Dave."
    assert VoiceLibrary([library.folders[-1]]).names() == []


def test_library_errors_name_the_file_or_the_voice(library: VoiceLibrary) -> None:
    with pytest.raises(VoiceError, match=r"no voice named 'zed' in .*voices, .*extra, .*not-there-yet \(voices: "
                                         r"alice, bob, carol, characters/dave, eve\)"):
        library.load("zed")
    folder = library.folders[0]
    (folder / "broken.wav").write_bytes(b"not audio at all")
    with pytest.raises(MizuotoError, match=r"broken.wav"):
        library.load("broken")
    (folder / "carol.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(VoiceError, match=r"carol.txt: cannot be read as UTF-8"):
        library.load("carol")
    (folder / "carol.txt").write_text("  \n", encoding="utf-8")
    with pytest.raises(VoiceError, match=r"carol.txt: the transcript is empty"):
        library.load("carol")
    with pytest.raises(VoiceError, match="at least one folder"):
        VoiceLibrary([])


def test_a_saved_voice_is_listed_and_loads_back(library: VoiceLibrary) -> None:
    path = library.save("story/narrator", clip(0.2, 24000, 0.125), "  Once upon a time. ")
    assert path == library.folders[0] / "story" / "narrator.wav"
    assert "story/narrator" in library.names()
    audio, transcript = library.load("story/narrator")
    assert transcript == "Once upon a time." and audio.sample_rate == 24000 and audio.waveform.shape == (1, 4800)
    with pytest.raises(VoiceError, match=r"a voice named 'alice' already exists .*alice.wav"):
        library.save("alice", clip(), "x")
    with pytest.raises(VoiceError, match="a voice named 'eve' already exists"):
        library.save("eve", clip(), "x")  # in another folder of the library
    library.save("alice", clip(value=0.1), None, overwrite=True)
    assert library.load("alice")[1] is None  # the old recording's words are gone with it
    with pytest.raises(VoiceError, match="the transcript is empty"):
        library.save("new", clip(), " ")
    for bad in ("", "../escape", "a//b", ".hidden", "a/.b", " x", "semi;colon", "back\\slash"):
        with pytest.raises(VoiceError, match="voice name"):
            check_voice_name(bad)


# ---- the prompt store ----------------------------------------------------------------------------

def engine(**changes: Any) -> Any:
    return SimpleNamespace(**{"id": "demo", "model_dir": None, "dtype": torch.float32, "device": torch.device("cpu"),
                              **changes})


def prompt() -> dict[str, Any]:
    return {"spk": torch.randn(1, 8), "codes": torch.arange(12, dtype=torch.int32).reshape(3, 4),
            "half": torch.randn(2, 3).to(torch.bfloat16), "ref_text": "Hello.", "instruct": None, "rms": 0.1 + 0.2,
            "frames": 17, "flag": True, "nested": {"prompt": {"feat": torch.ones(2, 2)}, "ids": [1, 2, (3, "x")]},
            "empty": torch.zeros(0, 5)}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_a_prompt_is_kept_exactly_and_without_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pickle(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle was used")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, no_pickle)
    store = VoicePromptStore(tmp_path / "prompts")
    key = prompt_key(engine(), clip(), "Hello.")
    data = prompt()
    assert store.load(key) is None
    path = store.save(key, data)
    assert path.parent == tmp_path / "prompts" and path.suffix == ".safetensors"
    assert same(store.load(key), data)
    assert [p.name for p in (tmp_path / "prompts").iterdir()] == [path.name]  # no temporary file left


def test_every_input_of_the_voice_prompt_changes_its_key(tmp_path: Path) -> None:
    (tmp_path / "w.safetensors").write_bytes(b"1")
    base = prompt_key(engine(model_dir=tmp_path), clip(), "Hi.", "amy", "calm", {"emotion": "x"})
    assert base == prompt_key(engine(model_dir=tmp_path), clip(), "Hi.", "amy", "calm", {"emotion": "x"})
    others = [prompt_key(engine(model_dir=tmp_path, id="cosyvoice"), clip(), "Hi.", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(), clip(), "Hi.", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path, dtype=torch.float16), clip(), "Hi.", "amy", "calm",
                         {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path, device=torch.device("meta")), clip(), "Hi.", "amy", "calm",
                         {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(value=0.3), "Hi.", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(rate=24000), "Hi.", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), None, "Hi.", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(), "Hi!", "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(), None, "amy", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(), "Hi.", "bo", "calm", {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(), "Hi.", "amy", None, {"emotion": "x"}),
              prompt_key(engine(model_dir=tmp_path), clip(), "Hi.", "amy", "calm", {"emotion": "y"})]
    assert len({base.digest(), *(k.digest() for k in others)}) == len(others) + 1


def test_what_would_need_pickling_is_refused_naming_the_entry(tmp_path: Path) -> None:
    store = VoicePromptStore(tmp_path)
    for data, where in [({"prompt": object()}, r"prompt\.prompt: a object"),
                        ({"a": {"b": [1, {2}]}}, r"prompt\.a\.b\[1\]: a set"),
                        ({"a": {1: torch.ones(1)}}, "string keys"),
                        ({"a": {"__tensor__": "t0"}}, "string keys other than")]:
        assert not cacheable(data)
        with pytest.raises(VoiceError, match=where):
            store.save(prompt_key(engine(), None, None), data)
    assert cacheable(prompt()) and list(tmp_path.iterdir()) == []


def test_a_damaged_entry_is_dropped_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = VoicePromptStore(tmp_path)
    keys = [prompt_key(engine(), clip(value=v), "Hi.") for v in (0.1, 0.2, 0.3)]
    paths = [store.save(k, prompt()) for k in keys]
    paths[0].write_bytes(b"garbage, not safetensors")
    paths[1].write_bytes(paths[1].read_bytes()[:100])  # cut short
    os.replace(paths[2], store.path(keys[0]))  # another key's entry under this key's name
    caplog.set_level(logging.WARNING, logger="mizuoto_runtime.app.scripts.voices")
    for key in keys[:2]:
        caplog.clear()
        assert store.load(key) is None
        assert [r.getMessage() for r in caplog.records] == [
            f"Mizuoto: dropped a damaged voice-prompt cache entry {store.path(key)} ({_reason(caplog)})"]
        assert not store.path(key).exists()
    store.save(keys[0], prompt())
    os.replace(store.path(keys[0]), store.path(keys[1]))
    caplog.clear()
    assert store.load(keys[1]) is None
    assert "written for another key or format" in caplog.records[0].getMessage()


def _reason(caplog: pytest.LogCaptureFixture) -> str:
    message = caplog.records[0].getMessage()
    return message[message.index("(") + 1:-1]


def test_the_store_is_bounded_and_drops_the_least_recently_used(tmp_path: Path) -> None:
    keys = [prompt_key(engine(), clip(value=v / 10), "Hi.") for v in range(4)]
    data = {"spk": torch.zeros(1000)}
    probe = VoicePromptStore(tmp_path / "probe").save(keys[0], data).stat().st_size
    store = VoicePromptStore(tmp_path / "store", max_bytes=3 * probe)
    for i, key in enumerate(keys[:3]):
        os.utime(store.save(key, data), ns=(i * 10**9, i * 10**9))  # written at 0, 1, 2 s
    assert store.load(keys[0]) is not None  # now the newest
    store.save(keys[3], data)
    assert [p.name for p in store.entries()] == [store.path(k).name for k in (keys[2], keys[0], keys[3])]
    assert store.load(keys[1]) is None
    tiny = VoicePromptStore(tmp_path / "tiny", max_bytes=1)
    tiny.save(keys[0], data)
    assert len(tiny.entries()) == 1  # the entry just written stays, even alone past the bound
    tiny.save(keys[1], data)
    assert [p.name for p in tiny.entries()] == [tiny.path(keys[1]).name]
    with pytest.raises(VoiceError, match="at least one byte"):
        VoicePromptStore(tmp_path, max_bytes=0)


def test_a_prompt_saved_in_one_process_loads_in_another(tmp_path: Path) -> None:
    code = ("import sys, torch; from types import SimpleNamespace as N\n"
            "from mizuoto_runtime.audio import Audio\n"
            "from mizuoto_runtime.engines.voice_store import VoicePromptStore, prompt_key\n"
            "e = N(id='demo', model_dir=None, dtype=torch.float32, device=torch.device('cpu'))\n"
            "key = prompt_key(e, Audio(torch.full((1, 1600), 0.25), 16000), 'Hello.')\n"
            "VoicePromptStore(sys.argv[1]).save(key, {'spk': torch.arange(4.0), 'text': 'Hello.'})\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, timeout=300)
    loaded = VoicePromptStore(tmp_path).load(prompt_key(engine(), clip(), "Hello."))
    assert same(loaded, {"spk": torch.arange(4.0), "text": "Hello."})


def test_a_demo_engine_voice_from_the_store_speaks_exactly_as_the_prompted_one(tmp_path: Path) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 64})
    demo = rt.engine("demo")
    reference = Audio(torch.sin(torch.arange(4096) / 7.0).unsqueeze(0) * 0.3, 16000)
    voice = demo.voice_prompt(rt.request(), reference, "Hello.")
    store = VoicePromptStore(tmp_path)
    key = prompt_key(demo, reference, "Hello.")
    store.save(key, voice.data)
    kept = Voice(voice.key, store.load(key), demo.id)
    sampling = Sampling(seed=5, max_new_tokens=32)
    first = demo.synthesize(rt.request(5), "One line.", voice, sampling)
    again = demo.synthesize(rt.request(5), "One line.", kept, sampling)
    assert torch.equal(first.waveform, again.waveform)


def test_the_library_reads_what_write_wav_writes(tmp_path: Path) -> None:
    library = VoiceLibrary([tmp_path])
    library.save("x", clip(0.01, 8000, 0.5), "x")
    assert torch.equal(library.load("x")[0].waveform, read_wav(tmp_path / "x.wav").waveform)


SAVE_IN_A_PROCESS = """
import sys, torch
from mizuoto_runtime import Runtime
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines.voice_store import VoicePromptStore, prompt_key
rt = Runtime({"compute.simulate_vram_mb": 64})
demo = rt.engine("demo")
reference = Audio(torch.sin(torch.arange(4096) / 7.0).unsqueeze(0) * 0.3, 16000)
store = VoicePromptStore(sys.argv[1])
key = prompt_key(demo, reference, "Hello.")
store.get_or_encode(key, lambda: demo.encode_voice(rt.request(), reference, "Hello.", None))
assert [name for action, name, _ in rt.manager.events if action == "place"] == ["demo:speaker_encoder"]
"""


def test_a_voice_prompted_in_one_process_is_used_in_another_without_placing_its_models(tmp_path: Path) -> None:
    """The store's part of M4 across restarts: a new process reads the prompt instead of placing
    the speaker encoder (engines calling the store from their voice-prompt phase is later work)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", SAVE_IN_A_PROCESS, str(tmp_path)], check=True, env=env, timeout=300)
    rt = Runtime({"compute.simulate_vram_mb": 64})
    demo = rt.engine("demo")
    reference = Audio(torch.sin(torch.arange(4096) / 7.0).unsqueeze(0) * 0.3, 16000)

    def encode() -> dict[str, Any]:
        raise AssertionError("the voice was prompted again")

    data = VoicePromptStore(tmp_path).get_or_encode(prompt_key(demo, reference, "Hello."), encode)
    assert "place" not in {action for action, _, _ in rt.manager.events}
    fresh = demo.encode_voice(rt.request(), reference, "Hello.", None)
    assert same(data, fresh)


def test_a_prompt_the_store_cannot_keep_is_used_and_not_kept(tmp_path: Path) -> None:
    store = VoicePromptStore(tmp_path)
    key = prompt_key(engine(id="omnivoice"), None, None)
    kept_object = object()
    assert store.get_or_encode(key, lambda: {"prompt": kept_object})["prompt"] is kept_object
    assert store.entries() == []
