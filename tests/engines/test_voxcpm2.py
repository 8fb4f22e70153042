"""The VoxCPM 2 engine on tiny random checkpoints (issue 12: M1, M4, M15, M20, M27, M40,
M45–M46, M50).

Skipped where the `voxcpm2` extra (`voxcpm`) is not installed. The M57 placements of every
voice mode, the same seed's audio and the exact retry after an OOM in generate are in
`engines_native/streaming.py`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto_runtime import CancelledError, CheckpointError, MizuotoError, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.audio import Audio, write_wav
from mizuoto_runtime.engines import Sampling

from conftest import link_checkpoint
from support.interrupt import interrupt_at

pytest.importorskip("voxcpm")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Checkpoint = Callable[..., Path]
REFERENCE = Audio(0.3 * torch.sin(torch.arange(16000) / 6.0).unsqueeze(0), 22050)  # resampled to 16 kHz
TRANSCRIPT = "a reference sentence"
TEXT = "Hello from the tiny model."
PATCHES = 4
SAMPLES_PER_PATCH = 4 * 1920  # 4 latent frames, 1920 samples at 48 kHz each
SAMPLING = Sampling(seed=7, max_new_tokens=PATCHES)  # the tiny model never stops early: N patches


def say(rt: Runtime, folder: Path, text: str = TEXT, seed: int = 7, patches: int = PATCHES,
        **voice: object) -> tuple[torch.Tensor, dict]:
    engine = rt.engine("voxcpm2", folder)
    audio, meta = rt.say(engine, text, sampling=Sampling(seed=seed, max_new_tokens=patches), **voice)  # type: ignore[arg-type]
    return audio.waveform, meta


def simulated(mb_: int, **settings: object) -> Runtime:
    return Runtime({"compute.simulate_vram_mb": mb_, **{f"compute.{k}": v for k, v in settings.items()}})


# ---- the package's own API -------------------------------------------------------------------
def test_every_mode_equals_the_package_one_call_api(voxcpm2_checkpoint: Checkpoint, tmp_path: Path) -> None:
    """Three phases over our own load, with request-sized KV caches == the package's
    `VoxCPM.generate` over its own `from_local`, with its 8192-position caches, sample by sample
    (M27: strict loading loses nothing; M45: the cache size changes nothing). The last case's
    prompt crosses the attention kernel's 512-position blocks."""
    import soundfile
    from voxcpm import VoxCPM

    folder = voxcpm2_checkpoint()
    ref = str(tmp_path / "ref.wav")
    soundfile.write(ref, REFERENCE.waveform.t().numpy(), REFERENCE.sample_rate, subtype="FLOAT")
    long_text = "Hello from the tiny model is the model. " * 70
    cases = [
        (TEXT, {}, {}),
        (TEXT, {"reference": REFERENCE}, {"reference_wav_path": ref}),
        (TEXT, {"reference": REFERENCE, "transcript": TRANSCRIPT},
         {"reference_wav_path": ref, "prompt_wav_path": ref, "prompt_text": TRANSCRIPT}),
        (TEXT, {"instruct": "a calm low voice"}, {"text": "(a calm low voice)" + TEXT}),
        (long_text, {}, {}),
    ]
    upstream = VoxCPM(str(folder), zipenhancer_model_path=None, enable_denoiser=False, optimize=False, device="cpu")
    assert upstream.tts_model.base_lm.kv_cache.max_length == 8192
    rt = Runtime()
    for text, voice, one_call in cases:
        ours, meta = say(rt, folder, text, **voice)
        assert meta["memory"]["phases"]["generate"]["kv_positions"] < 8192
        torch.manual_seed(7)
        theirs = upstream.generate(text=one_call.pop("text", text), max_len=PATCHES, **one_call)
        assert ours.shape == (1, PATCHES * SAMPLES_PER_PATCH)
        assert torch.equal(ours[0], torch.from_numpy(theirs)), f"{sorted(voice)} differs from the package"


# ---- phases and placement --------------------------------------------------------------------
def test_phases_place_only_their_components(voxcpm2_checkpoint: Checkpoint) -> None:
    """M1, M4: voice prompt → the VAE encoder, generate → the generator, decoder → the VAE
    decoder; a cached voice is not encoded again, and zero-shot never places the encoder."""
    rt = simulated(256)
    folder = voxcpm2_checkpoint()
    first, meta = say(rt, folder, reference=REFERENCE)
    assert {k: v["phase"] for k, v in meta["memory"]["components"].items()} == {
        "voxcpm2:vae_encoder": "voice prompt", "voxcpm2:generator": "generate", "voxcpm2:vae_decoder": "decoder"}
    rt.manager.events.clear()
    again, meta = say(rt, folder, reference=REFERENCE)
    placed = {name for action, name, _ in rt.manager.events if action == "place"}
    assert placed == {"voxcpm2:generator", "voxcpm2:vae_decoder"} == set(meta["memory"]["components"])
    assert torch.equal(first, again)
    rt.manager.events.clear()
    say(rt, folder)
    assert "voxcpm2:vae_encoder" not in {name for action, name, _ in rt.manager.events if action == "place"}


def test_the_local_dit_is_hot_and_the_generator_holds_one_copy(voxcpm2_checkpoint: Checkpoint) -> None:
    """M15, M20: with the generator capped half-way, the local DiT (9 runs a patch) stays
    resident and LM layers stream; a `sequence` handle keeps one streamed copy, so every
    streamed unit crosses the link exactly once per LM step (prefill, then one per patch)."""
    rt = simulated(256)
    engine = rt.engine("voxcpm2", voxcpm2_checkpoint())
    gen = engine.generator
    assert gen.kind == "sequence" and gen.copies == 1 and gen.prefetch_depth == 0
    assert gen.min_working_set == gen.plan.fixed_bytes + max(u.nbytes for u in gen.units)
    gen.cap_bytes = (gen.min_working_set + gen.size_bytes) // 2
    largest = max(u.nbytes for u in gen.units)
    held: list[int] = []
    hooks = [u.module.register_forward_hook(lambda *_: held.append(gen.streamer.cached_bytes(gen)))
             for u in gen.units]
    try:
        before = gen.streamer.streamed_bytes_of(gen)
        say(rt, engine.model_dir)
        streamed = gen.streamer.streamed_bytes_of(gen) - before
    finally:
        for h in hooks:
            h.remove()
    dit = {u.name for u in gen.units if u.name.startswith("feat_decoder.")}
    streamed_units = {u.name for u in gen.streamed_units}
    assert dit and not dit & streamed_units and streamed_units
    assert all(u.name.startswith(("base_lm.", "residual_lm.", "feat_encoder.")) for u in gen.streamed_units)
    assert streamed == (PATCHES + 1) * sum(u.nbytes for u in gen.streamed_units)
    assert held and max(held) <= largest  # one copy at a time


# ---- working memory (M45, M46, M50) ----------------------------------------------------------
def test_kv_caches_follow_the_request(voxcpm2_checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture) -> None:
    """The KV caches are working memory sized from the request, not 8192 positions: two lengths,
    two reservations — in meta.memory, in the placement's working memory and its log line, and
    in the caches really built; they exist only during the generate phase."""
    rt = simulated(256)
    folder = voxcpm2_checkpoint()
    engine = rt.engine("voxcpm2", folder)
    gen = engine.generator
    gen.cap_bytes = (gen.min_working_set + gen.size_bytes) // 2  # partial: the log shows its budget
    caplog.set_level(logging.INFO)
    built: list[int] = []
    hook = engine.model.feat_encoder.register_forward_pre_hook(
        lambda *_: built.append(engine.model.base_lm.kv_cache.kv_cache.shape[-2]))
    try:
        _, short = say(rt, folder, "Hello.")
        _, long = say(rt, folder, "Hello from the tiny model. " * 40, patches=6)
    finally:
        hook.remove()
    reserved = [m["memory"]["phases"]["generate"] for m in (short, long)]
    positions = [r["kv_positions"] for r in reserved]
    assert positions[0] < positions[1] < 8192 and all(p % 64 == 0 for p in positions)
    assert sorted(set(built)) == positions  # the caches built had that size
    cfg = engine.model.config.lm_config
    per_position = 2 * cfg.num_key_value_heads * cfg.kv_channels * 4 * (cfg.num_hidden_layers + 2)  # both LMs
    working = []
    for r, meta in zip(reserved, (short, long)):
        assert r["kv_cache_mb"] == round(per_position * r["kv_positions"] / 2**20, 2)
        placed = meta["memory"]["partial"]["voxcpm2:generator"]["working_mb"]
        assert placed == pytest.approx(r["kv_cache_mb"] + r["prefill_kv_mb"] + r["activations_mb"], abs=0.02)
        working.append(placed)
    assert working[0] < working[1]
    logs = [r.getMessage() for r in caplog.records]
    for r, placed in zip(reserved, working):
        assert any(f"KV caches for {r['kv_positions']} positions" in m for m in logs)
        assert any("voxcpm2:generator partially loaded for phase 'generate'" in m and f"working {placed:.1f} MB" in m
                   for m in logs)
    assert engine.model.base_lm.kv_cache is None and engine.model.residual_lm.kv_cache is None


def test_estimates_follow_the_request(voxcpm2_checkpoint: Checkpoint) -> None:
    """M45: each phase's working memory grows with what the request gives it."""
    engine = Runtime().engine("voxcpm2", voxcpm2_checkpoint())
    short, long = engine.plan("Hello.", None, 4096), engine.plan("Hello. " * 50, None, 4096)
    assert short.patches == int(engine._tokens("Hello.") * 6 + 10)  # the package's own cap
    assert engine.plan("Hello. " * 50, None, 8).patches == 8  # max_new_tokens caps it
    assert sum(engine.generate_memory(short).values()) < sum(engine.generate_memory(long).values())
    assert engine.decoder_memory(100) < engine.decoder_memory(200) <= 2 * engine.decoder_memory(100)
    assert 0 < engine.voice_prompt_memory(16000, 16000) < engine.voice_prompt_memory(32000, 32000)


# ---- voices and their errors -----------------------------------------------------------------
def test_voice_arguments_are_checked(voxcpm2_checkpoint: Checkpoint) -> None:
    rt = Runtime()
    engine = rt.engine("voxcpm2", voxcpm2_checkpoint())
    ctx = rt.request()
    with pytest.raises(MizuotoError, match="no built-in speakers"):
        engine.voice_prompt(ctx, speaker="alice")
    with pytest.raises(MizuotoError, match="transcript needs the reference audio"):
        engine.voice_prompt(ctx, transcript="words")
    with pytest.raises(MizuotoError, match="text is empty"):  # the base class's check, before any work
        engine.generate(ctx, " \n ", engine.voice_prompt(ctx), SAMPLING)
    with pytest.raises(MizuotoError, match=r"expected latents \[1, 64, frames\]"):
        from mizuoto_runtime.engines import Codes

        engine.decode(ctx, Codes(torch.zeros(1, 8, 4), "voxcpm2"))


def test_progress_per_patch_and_interrupt(voxcpm2_checkpoint: Checkpoint) -> None:
    """The host's progress bar moves once per patch (after the prompt's); an interrupt stops
    generation and leaves no hook, no cache and no recording decode behind."""
    rt = Runtime()
    engine = rt.engine("voxcpm2", voxcpm2_checkpoint())
    steps: list[tuple[int, int]] = []
    rt.say(engine, TEXT, sampling=SAMPLING, on_progress=lambda d, t: steps.append((d, t)))
    assert steps == [(i, PATCHES) for i in range(PATCHES + 1)] + [(PATCHES, PATCHES)]

    cancel_check, progress = interrupt_at(1)
    with pytest.raises(CancelledError):
        rt.say(engine, TEXT, sampling=SAMPLING, cancel_check=cancel_check, on_progress=progress)
    model = engine.model
    assert not model.feat_encoder._forward_pre_hooks and model.base_lm.kv_cache is None
    assert "decode" not in vars(model.audio_vae)
    audio, _ = rt.say(engine, TEXT, sampling=SAMPLING)
    assert audio.waveform.shape[-1] == PATCHES * SAMPLES_PER_PATCH


def test_weight_norm_leaves_no_weights_behind(voxcpm2_checkpoint: Checkpoint) -> None:
    """Legacy weight norm computes each conv's weight before its forward and keeps it: after a
    phase no VAE module holds one (it would be device memory the runtime cannot see), nor after
    the load (the weights computed at construction: a second copy of the VAE, issue 35)."""
    from torch.nn.utils.weight_norm import WeightNorm

    rt = Runtime()
    engine = rt.engine("voxcpm2", voxcpm2_checkpoint())
    normed = [m for m in engine.model.audio_vae.modules()
              if any(isinstance(h, WeightNorm) for h in m._forward_pre_hooks.values())]
    assert len(normed) > 20
    assert all(m.weight.is_meta for m in normed)
    say(rt, engine.model_dir, reference=REFERENCE)
    assert all(m.weight.is_meta for m in normed)


def test_a_weight_normed_unit_is_refused() -> None:
    """Weight norm's pre-hook runs before a streamed unit's own: a unit that is a normed layer
    itself would compute its weight before it is there, so the engine refuses such a layout."""
    import warnings

    from mizuoto_runtime.engines.voxcpm2.engine import _check_weight_norm_units

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        convs = torch.nn.Sequential(*(torch.nn.utils.weight_norm(torch.nn.Conv1d(512, 512, 3)) for _ in range(2)))
    with pytest.raises(MizuotoError, match="vae_decoder: units 0, 1 are weight-normed layers"):
        _check_weight_norm_units(convs, "vae_decoder")
    _check_weight_norm_units(torch.nn.Sequential(torch.nn.Sequential(convs[0]), torch.nn.Sequential(convs[1])), "ok")


# ---- loading (M27) ---------------------------------------------------------------------------
def test_loading_errors_name_what_is_wrong(voxcpm2_checkpoint: Checkpoint, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = voxcpm2_checkpoint()
    rt = Runtime()
    with pytest.raises(MizuotoError, match="needs a checkpoint folder"):
        rt.engine("voxcpm2")
    with pytest.raises(CheckpointError, match="folder not found"):
        rt.engine("voxcpm2", tmp_path / "nowhere")
    missing = link_checkpoint(folder, tmp_path / "missing", skip=("tokenizer.json", "audiovae.pth"))
    with pytest.raises(CheckpointError, match="missing tokenizer.json, audiovae.safetensors or audiovae.pth"):
        rt.engine("voxcpm2", missing)

    v1 = link_checkpoint(folder, tmp_path / "v1", skip=("config.json",))
    (v1 / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                "architecture": "voxcpm"}))
    with pytest.raises(CheckpointError, match="architecture is 'voxcpm', expected 'voxcpm2'"):
        rt.engine("voxcpm2", v1)

    mismatched = link_checkpoint(folder, tmp_path / "mismatched", skip=("model.safetensors",))
    state = load_file(str(folder / "model.safetensors"))
    state["stop_head.weight"] = state["stop_head.weight"][:, :-1].clone()
    del state["fusion_concat_proj.bias"]
    save_file(state, str(mismatched / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        rt.engine("voxcpm2", mismatched)
    assert "missing fusion_concat_proj.bias" in str(err.value)
    assert "shape of stop_head.weight: checkpoint (2, 255), model (2, 256)" in str(err.value)

    vae = link_checkpoint(folder, tmp_path / "vae", skip=("audiovae.pth",))
    weights = torch.load(folder / "audiovae.pth", weights_only=True)
    weights["extra.weight"] = torch.zeros(1)
    torch.save(weights, vae / "audiovae.pth")
    with pytest.raises(CheckpointError, match=r"audiovae.pth: does not match the audio VAE: .*extra.weight"):
        rt.engine("voxcpm2", vae)
    assert rt.manager.handles == []  # nothing half-registered


def test_bf16_load_converts_in_place(voxcpm2_checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """M27: everything but the VAE loads straight into bf16 (built on meta, each tensor converted
    as it is copied in: no float32 copy ever exists) and equals both the package's `from_local`
    and float32-then-convert, rotary tables included; the VAE stays float32; the bf16 engine speaks."""
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    from mizuoto_runtime.engines.voxcpm2 import checkpoint as voxcpm2

    filled: list[set[tuple[torch.dtype, str]]] = []

    def spy(module: torch.nn.Module, *args: object, **kwargs: object) -> torch.nn.Module:
        filled.append({(p.dtype, p.device.type) for p in module.parameters()})
        return load_safetensors(module, *args, **kwargs)

    load_safetensors = voxcpm2.load_safetensors
    monkeypatch.setattr(voxcpm2, "load_safetensors", spy)
    rt = Runtime()
    half = rt.engine("voxcpm2", voxcpm2_checkpoint("bfloat16"), "bfloat16")
    assert filled == [{(torch.bfloat16, "meta")}]  # model.safetensors went into bf16 meta parameters
    monkeypatch.undo()
    full = rt.engine("voxcpm2", voxcpm2_checkpoint("float32"), "float32")
    upstream = VoxCPM2Model.from_local(str(voxcpm2_checkpoint("bfloat16")), optimize=False, device="cpu")
    ours, theirs = half.model.state_dict(), upstream.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert value.dtype == theirs[key].dtype and torch.equal(value, theirs[key]), key
        if not key.startswith("audio_vae."):
            assert value.dtype == torch.bfloat16, key
            assert torch.equal(value, full.model.state_dict()[key].to(torch.bfloat16)), key
    buffers = dict(half.model.named_buffers())
    for key, value in upstream.named_buffers():
        assert torch.equal(buffers[key], value) and buffers[key].dtype == value.dtype, key
    assert {p.dtype for p in half.model.audio_vae.parameters()} == {torch.float32}
    audio, _ = rt.say(half, TEXT, reference=REFERENCE, sampling=SAMPLING)
    assert audio.waveform.dtype == torch.float32 and audio.waveform.shape[-1] == PATCHES * SAMPLES_PER_PATCH


# ---- CLI -------------------------------------------------------------------------------------
def test_cli_say_and_tiny_checkpoint(voxcpm2_checkpoint: Checkpoint, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = voxcpm2_checkpoint()
    write_wav(tmp_path / "ref.wav", REFERENCE)
    out = tmp_path / "out.wav"
    code = main(["say", "--engine", "voxcpm2", "--model", str(folder), TEXT, "-o", str(out),
                 "--voice", str(tmp_path / "ref.wav"), "--ref-text", TRANSCRIPT, "--seed", "3",
                 "--max-new-tokens", str(PATCHES), "--setting", "compute.simulate_vram_mb=24"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["sample_rate"] == 48000
    assert result["memory"]["streamed_mb"] > 0 and "voxcpm2:generator" in result["memory"]["partial"]
    with wave.open(str(out)) as f:
        assert f.getframerate() == 48000 and f.getnframes() == PATCHES * SAMPLES_PER_PATCH
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    assert np.abs(samples).max() > 100  # not silence

    code = main(["tiny-checkpoint", "--engine", "voxcpm2", str(tmp_path / "again")])
    files = json.loads(capsys.readouterr().out)["files"]
    assert code == 0 and {"audiovae.pth", "model.safetensors", "tokenizer.json"} <= set(files)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        digest = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (folder, tmp_path / "again")]
        assert digest[0] == digest[1], f"{name} is not byte-identical across runs"
    again = torch.load(tmp_path / "again" / "audiovae.pth", weights_only=True)
    first = torch.load(folder / "audiovae.pth", weights_only=True)
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
    shutil.rmtree(tmp_path / "again")
