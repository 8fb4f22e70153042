"""LoRA fine-tuning of the Qwen3-TTS talker (issue 16) on the tiny Base checkpoint: the training
inputs are generation's own, every preset trains (M61), the loss falls on a tiny overfit set,
the LoRA changes the output and every placement with it gives the same audio (M28, M57), and
the job owns its device while it runs (M60, M63). Skipped where `qwen_tts` is not installed."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from mizuoto_runtime import CheckpointError, MizuotoError, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.app.training import memory_plan
from mizuoto_runtime.app.training.dataset import Clip, load_audio, read_clips, write_demo_clips
from mizuoto_runtime.app.training.host_optimizer import HostAdamW
from mizuoto_runtime.app.training.job import TrainingJob
from mizuoto_runtime.app.training.lora import save_lora
from mizuoto_runtime.app.training.methods import method_module
from mizuoto_runtime.audio import Audio
from mizuoto_runtime.engines import LoraChoice, Sampling
from mizuoto_runtime.memory.intra_op import computing_thread
from mizuoto_runtime.nn.lora import read_lora

from conftest import require_qwen_tts

require_qwen_tts()  # skips without the package; imported the engine's way (a bare import fails on transformers 5)

from mizuoto_runtime.app.training import qwen3tts_lora as method  # noqa: E402  (imports the engine)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[3]
Checkpoint = Callable[[str], Path]
SAY = Sampling(seed=3, max_new_tokens=6, language="english")
CLI_STEPS = 12
CLI_LR = 3e-3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_clips(tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="module")
def base(qwen3tts_checkpoint: Checkpoint) -> Path:
    return qwen3tts_checkpoint("base")


@pytest.fixture(scope="module")
def prepared(base: Path, data: Path) -> tuple[Any, list[method.Sample]]:
    torch.set_num_threads(1)
    rt = Runtime()
    engine = rt.engine("qwen3tts", base)
    return engine, method.prepare(engine, rt, read_clips(data), "Auto", seed=0)


@pytest.fixture(scope="module")
def trained(base: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A LoRA trained by `mizuoto train` (its own process, on the CPU)."""
    out = tmp_path_factory.mktemp("lora") / "voice.safetensors"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--model", str(base), "--data", str(data), "-o", str(out), "--steps", str(CLI_STEPS),
                     "--lr", str(CLI_LR), "--batch-size", "2", "--memory", "low"])
    assert code == 0
    return out, json.loads(printed.getvalue())


def fresh_talker(base: Path) -> Any:
    """A talker of its own to train (the engine's carries the runtime's per-thread loop state)."""
    from mizuoto_runtime.engines.qwen3tts.checkpoint import load_model

    return load_model(base, torch.float32, torch.device("cpu")).model.talker


def params(base: Path, data: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return method.check({"model": str(base), "data": str(data), "output": str(out), **extra})


def reference(data: Path) -> Audio:
    return load_audio(data / "clip0.wav")


def spoken(rt: Runtime, base: Path, data: Path, lora: Path | None = None,
           strength: float = 1.0) -> tuple[torch.Tensor, dict[str, Any]]:
    """The audio of a short voice-clone request, and its meta (`meta.memory`, M50)."""
    engine = rt.engine("qwen3tts", base)
    engine.use_lora(LoraChoice(lora, strength) if lora is not None else None)
    audio, meta = rt.say(engine, "hello there", reference=reference(data), sampling=SAY)
    return audio.waveform, meta


def say(rt: Runtime, base: Path, data: Path, lora: Path | None = None, strength: float = 1.0) -> torch.Tensor:
    return spoken(rt, base, data, lora, strength)[0]


# ---- the training inputs -------------------------------------------------------------------------
@pytest.mark.parametrize("language", ["english", "Auto"])
def test_teacher_forced_inputs_are_what_generation_sees(prepared: tuple[Any, list], data: Path,
                                                        language: str) -> None:
    """The talker's logits over a training sequence equal, position by position, the logits
    generation computed for the same codes (KV cache vs one pass: float32 tolerance)."""
    engine, _ = prepared
    rt = Runtime()
    ctx = rt.request(0)
    voice = engine.voice_prompt(ctx, reference(data))  # an x-vector clone
    seen: list[torch.Tensor] = []
    hook = engine.tts.model.talker.codec_head.register_forward_hook(lambda _m, _i, out: seen.append(out[0, -1]))
    try:
        codes = engine.generate(ctx, "hello there friend", voice, Sampling(seed=5, max_new_tokens=7,
                                                                           language=language)).tokens
    finally:
        hook.remove()
    sample = method._sample(engine, Clip("c", Path("c"), "hello there friend"), codes, voice.data["spk"], language)
    with torch.no_grad():
        out = engine.tts.model.talker(inputs_embeds=sample.embeds[None], use_cache=False,
                                      attention_mask=torch.ones(1, sample.embeds.shape[0], dtype=torch.long))
    first = sample.prompt - 1
    forced = out.logits[0, first:first + codes.shape[0] + 1]  # every frame's first code, then the end
    torch.testing.assert_close(forced, torch.stack(seen[:forced.shape[0]]), rtol=1e-4, atol=1e-4)


def test_a_batch_targets_every_frame_and_the_end(prepared: tuple[Any, list]) -> None:
    engine, samples = prepared
    eos = engine.tts.model.config.talker_config.codec_eos_token_id
    batch = method.collate(samples, eos, torch.device("cpu"), torch.float32)
    frames = sum(s.frames for s in samples)
    assert batch.codes.shape == (frames, 16) and batch.rows.shape == (frames,)
    assert int((batch.targets != method.IGNORE).sum()) == frames + len(samples)  # + one end per clip
    for i, s in enumerate(samples):
        assert int(batch.mask[i].sum()) == s.embeds.shape[0]
        assert batch.targets[i, s.prompt - 1 + s.frames] == eos


# ---- training ----------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["default", "low", "lowest"])
def test_each_preset_runs_a_few_steps(prepared: tuple[Any, list], base: Path, data: Path, tmp_path: Path,
                                      preset: str) -> None:
    _, samples = prepared
    talker = fresh_talker(base)
    plan = memory_plan(preset)
    events: list[dict[str, Any]] = []
    made: list[Any] = []
    real = method.make_optimizer
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(method, "make_optimizer", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
        adapters, losses = method.train(talker, samples, params(base, data, tmp_path / "x.safetensors", steps=3,
                                                                batch_size=2), plan, torch.device("cpu"),
                                        lambda **e: events.append(e))
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert [e["step"] for e in events] == [1, 2, 3]
    assert isinstance(made[0], HostAdamW) == plan.host_optimizer
    assert talker.model.gradient_checkpointing == plan.gradient_checkpointing
    assert len(adapters) == 2 * 7 + 2 * 7  # q, k, v, o, gate, up, down of 2 talker and 2 predictor layers
    assert any(a.lora_B.weight.abs().sum() > 0 for a in adapters.values())  # it learned something
    assert all(not p.requires_grad for n, p in talker.named_parameters() if "lora_" not in n)


def test_the_loss_goes_down_on_a_tiny_overfit_set(prepared: tuple[Any, list], base: Path, data: Path,
                                                  tmp_path: Path) -> None:
    _, samples = prepared
    talker = fresh_talker(base)
    _, losses = method.train(talker, samples, params(base, data, tmp_path / "x.safetensors", steps=20, lr=3e-3,
                                                     batch_size=2), memory_plan("default"), torch.device("cpu"),
                             lambda **e: None)
    assert losses[-1] < 0.5 * losses[0], losses


def test_bad_training_input_is_one_clear_error(base: Path, data: Path, tmp_path: Path,
                                               qwen3tts_checkpoint: Checkpoint) -> None:
    (tmp_path / "lonely.wav").write_bytes((data / "clip0.wav").read_bytes())
    with pytest.raises(MizuotoError, match="lonely.wav: no transcript lonely.txt"):
        params(base, tmp_path, tmp_path / "x.safetensors")
    with pytest.raises(MizuotoError, match="training needs a Base checkpoint"):
        params(qwen3tts_checkpoint("custom_voice"), data, tmp_path / "x.safetensors")
    with pytest.raises(MizuotoError, match="'rank' must be a positive integer"):
        params(base, data, tmp_path / "x.safetensors", rank=0)
    with pytest.raises(MizuotoError, match="unknown parameter 'learning_rate'; known: activation_offload, alpha, "):
        params(base, data, tmp_path / "x.safetensors", learning_rate=1e-3)
    with pytest.raises(MizuotoError, match="must be a .safetensors file"):
        params(base, data, tmp_path / "x.bin")
    assert main(["train", "--model", str(base), "--data", str(tmp_path / "none"),
                 "-o", str(tmp_path / "x.safetensors")]) == 2


# ---- the LoRA file and applying it -------------------------------------------------------------------
def test_mizuoto_train_writes_a_lora_file(trained: tuple[Path, dict[str, Any]]) -> None:
    path, result = trained
    assert result["output"] == str(path) and len(result["losses"]) == CLI_STEPS
    assert result["memory"]["preset"] == "low" and set(result["memory/peak_mb"]) == {"prepare", "train"}
    assert result["losses"][-1] < result["losses"][0]
    lora = read_lora(path, "qwen3tts")
    assert (lora.rank, lora.alpha) == (8, 16.0) and len(lora.layers) == 28
    assert lora.metadata["method"] == "qwen3tts_lora" and lora.metadata["training_memory"] == "low"
    assert "talker.model.layers.0.self_attn.q_proj" in lora.layers
    assert "talker.code_predictor.model.layers.1.mlp.down_proj" in lora.layers


def test_a_bad_lora_file_is_named(trained: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = trained
    with pytest.raises(CheckpointError, match="a LoRA for engine 'qwen3tts', not 'f5tts'"):
        read_lora(path, "f5tts")
    from safetensors.torch import save_file

    broken = tmp_path / "broken.safetensors"
    save_file({"talker.x.lora_A.weight": torch.zeros(8, 4)}, str(broken),
              metadata={"format": "mizuoto-lora", "engine": "qwen3tts", "rank": "8", "alpha": "16"})
    with pytest.raises(CheckpointError, match="talker.x.lora_A.weight has no talker.x.lora_B.weight"):
        read_lora(broken, "qwen3tts")
    save_file({"w": torch.zeros(2)}, str(broken))
    with pytest.raises(CheckpointError, match="not a Mizuoto LoRA file"):
        read_lora(broken, "qwen3tts")


def test_a_trained_lora_changes_the_output_and_removing_it_restores_it(
        trained: tuple[Path, dict[str, Any]], base: Path, data: Path) -> None:
    path, _ = trained
    rt = Runtime()
    plain = say(rt, base, data)
    with_lora = say(rt, base, data, path)
    assert rt.engine("qwen3tts", base).applied_lora() == LoraChoice(path, 1.0)
    assert not torch.equal(plain, with_lora)
    assert torch.equal(say(rt, base, data, path), with_lora)  # the same LoRA again: no change
    assert not torch.equal(say(rt, base, data, path, 0.5), with_lora)
    assert torch.equal(say(rt, base, data), plain)  # the checkpoint's exact weights are back


@pytest.mark.parametrize("mode", ["none", "normal", "high"])
def test_every_placement_with_the_lora_gives_the_plain_runs_audio(
        trained: tuple[Path, dict[str, Any]], base: Path, data: Path, mode: str) -> None:
    """M57 with a LoRA: all units streamed (none), the talker capped half-way (normal on a
    small device), whole (high) — each equals the plain CPU run with the same LoRA."""
    path, _ = trained
    expected = say(Runtime(), base, data, path)
    size = {"none": 200, "normal": 10, "high": 200}[mode]  # normal: the 11.7 MB talker does not fit
    rt = Runtime({"compute.simulate_vram_mb": size, "compute.vram_mode": mode})
    say(rt, base, data)  # placed once without the LoRA: applying it must refresh every copy (M28)
    got, meta = spoken(rt, base, data, path)
    assert torch.equal(got, expected)
    assert (meta["memory"]["streamed_mb"] > 0) == (mode != "high"), meta["memory"]  # the placement ran as named


def test_a_lora_applies_to_qwen3tts_only(trained: tuple[Path, dict[str, Any]]) -> None:
    path, _ = trained
    demo = Runtime().engine("demo")
    with pytest.raises(MizuotoError, match="do not apply to the demo engine"):
        demo.use_lora(LoraChoice(path))
    demo.use_lora(None)  # nothing to remove: nothing happens


def test_retraining_the_same_file_applies_the_new_weights(base: Path, data: Path, tmp_path: Path,
                                                          trained: tuple[Path, dict[str, Any]]) -> None:
    source, _ = trained
    path = tmp_path / "same.safetensors"
    path.write_bytes(source.read_bytes())
    rt = Runtime()
    first = say(rt, base, data, path)
    lora = read_lora(path, "qwen3tts")
    doubled = {name: (a, 2 * b) for name, (a, b) in lora.layers.items()}
    write_lora(path, doubled, lora)
    assert not torch.equal(say(rt, base, data, path), first)


def write_lora(path: Path, layers: dict[str, tuple[torch.Tensor, torch.Tensor]], like: Any) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for name, (a, b) in layers.items():
        tensors[name + ".lora_A.weight"], tensors[name + ".lora_B.weight"] = a.contiguous(), b.contiguous()
    time.sleep(0.01)  # a new modification time
    save_file(tensors, str(path), metadata=like.metadata)


# ---- the job owns its device (M60, M63) -------------------------------------------------------------
def job_params(base: Path, data: Path, out: Path, steps: int) -> dict[str, Any]:
    return {"model": str(base), "data": str(data), "output": str(out), "steps": steps, "lr": CLI_LR}


class OtherModels:
    """Another host's accounting on the device (ComfyUI's, M35), recording what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[torch.device, int, tuple]] = []

    def free_for(self, device: torch.device, nbytes: int, keep: Any) -> int:
        self.asked.append((device, nbytes, tuple(keep)))
        return 0

    def on_placed(self, handles: Any) -> None:
        pass


def test_the_job_releases_the_device_holds_it_and_makes_inference_wait(base: Path, data: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)  # the runtime writes it (M54); undone after
    rt = Runtime({"compute.simulate_vram_mb": 120, "compute.cuda_allocator": "expandable"})
    say(rt, base, data)  # every component placed on the simulated GPU
    placed = {rt.manager.key(h) for h in rt.manager.handles if h.device_bytes}
    assert placed
    rt.manager.external = others = OtherModels()
    inference: dict[str, Any] = {}

    def infer_when_training(event: dict[str, Any]) -> None:
        if event.get("event") == "step" and "thread" not in inference:
            inference["asked"] = len(rt.manager.events)
            inference["thread"] = computing_thread(lambda: inference.update(audio=say(rt, base, data)))
            inference["thread"].start()

    job = TrainingJob(rt, "qwen3tts_lora", job_params(base, data, tmp_path / "job.safetensors", steps=3),
                      memory="lowest", on_event=infer_when_training)
    result = job.run()
    inference["thread"].join(120)
    log = rt.manager.events
    held = "training:qwen3tts_lora"
    start, end = log.index(("exclusive", held, 0)), log.index(("exclusive_end", held, 0))
    released = {component for action, component, _ in log[start:end] if action == "yield"}
    assert released == placed and result["released_mb"] > 0  # release_device: every idle model left
    assert not [e for e in log[start:end] if e[0] == "place"]  # exclusive: nothing placed meanwhile
    assert inference["asked"] <= end and [e for e in log[end:] if e[0] == "place"]  # asked meanwhile; ran after
    assert "audio" in inference
    total = rt.devices.total_bytes(torch.device("cpu"))
    assert (torch.device("cpu"), total, ()) in others.asked  # the other host freed the whole device too
    assert result["warnings"] and "training.memory=lowest needs about" in result["warnings"][0]  # M63, 120 MB
    # M54, M62: the allocator settings reached the training process through its environment
    assert result["process"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert result["process"]["THP_MEM_ALLOC_ENABLE"] == "0" and result["process"]["huge_pages"] in (False, None)


def test_the_training_environment_follows_the_settings(base: Path, data: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    job = TrainingJob(Runtime({"compute.cuda_allocator": "async", "compute.cpu_allocator": "hugepages",
                               "compute.simulate_vram_mb": 64}),
                      "qwen3tts_lora", job_params(base, data, tmp_path / "x.safetensors", steps=1), memory="lowest")
    env = job.child_env()
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"  # compute.cpu_allocator, set, wins over the preset's choice
    assert str(REPO) in env["PYTHONPATH"].split(os.pathsep)
    request = job.child_job()
    assert request["device"] == "cpu" and "compute.simulate_vram_mb" not in request["settings"]
    assert request["memory"]["preset"] == "lowest" and request["cpu_allocator"] == "hugepages"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert job.child_env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"  # the environment wins (M54)


def children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


def test_cancelling_ends_the_training_process_and_frees_the_device(base: Path, data: Path, tmp_path: Path) -> None:
    rt = Runtime({"compute.simulate_vram_mb": 120})
    seen: list[int] = []

    def cancel() -> None:
        found = [p.pid for p in children()]
        seen.extend(found)
        if found:
            raise KeyboardInterrupt  # what ComfyUI's interrupt or Ctrl-C raise, as far as the job is concerned

    job = TrainingJob(rt, "qwen3tts_lora", job_params(base, data, tmp_path / "never.safetensors", steps=500),
                      cancel_check=cancel)
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert seen and not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                            for pid in seen)
    assert not (tmp_path / "never.safetensors").exists()
    assert rt.manager.events[-1] == ("exclusive_end", "training:qwen3tts_lora", 0)
    say(rt, base, data)  # the device is free again: a request runs at once


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to one process is POSIX")
def test_ctrl_c_on_mizuoto_train_ends_the_training_process(base: Path, data: Path, tmp_path: Path) -> None:
    # Ctrl-C as a terminal delivers it: a test run started in the background of a non-interactive
    # shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    cli = subprocess.Popen([sys.executable, "-m", "mizuoto_runtime.app.cli", "train", "--model", str(base), "--data",
                            str(data), "-o", str(tmp_path / "never.safetensors"), "--steps", "1000"],
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        worker = wait_for_child(cli)
        cli.send_signal(signal.SIGINT)
        assert cli.wait(60) == 130
        assert "interrupted" in cli.stderr.read()  # type: ignore[union-attr]
        worker.wait(10)  # gone (psutil raises TimeoutExpired otherwise)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def wait_for_child(proc: subprocess.Popen[str], timeout: float = 120.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Only the worker counts: start-up imports may run short-lived helpers of their own
        # (ctypes' library lookup), and a SIGINT sent then lands before `main` can catch it.
        found = [c for c in psutil.Process(proc.pid).children() if _is_training_worker(c)]
        if found:
            return found[0]
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        time.sleep(0.1)
    raise AssertionError("mizuoto train started no training process")


def _is_training_worker(child: psutil.Process) -> bool:
    try:
        return "mizuoto_runtime.app.training.worker" in child.cmdline()
    except psutil.NoSuchProcess:  # a helper that ended between listing and reading
        return False


def test_every_method_module_has_the_method_interface() -> None:
    module = method_module("qwen3tts_lora")
    for name in ("INFO", "check", "model_params", "run"):
        assert hasattr(module, name)
    with pytest.raises(MizuotoError, match="unknown training method 'nope'; known: qwen3tts_lora"):
        method_module("nope")


def test_lora_files_round_trip(tmp_path: Path) -> None:
    from torch import nn

    from mizuoto_runtime.app.training.lora import inject, lora_parameters

    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(2, 4)
    before = net(x)
    adapters = inject(net, "net.", lambda name, _m: True, rank=2, alpha=4.0, dtype=torch.float32)
    assert torch.equal(net(x), before)  # B starts at zero: training starts from the base model
    assert len(lora_parameters(adapters)) == 4
    for a in adapters.values():
        nn.init.normal_(a.lora_B.weight)
    path = save_lora(tmp_path / "n.safetensors", adapters, {"engine": "qwen3tts"})
    lora = read_lora(path, "qwen3tts")
    assert set(lora.layers) == {"net.0", "net.2"}
    merged = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    with torch.no_grad():
        for i in (0, 2):
            base_layer = adapters[f"net.{i}"].base
            merged[i].bias.copy_(base_layer.bias)
            merged[i].weight.copy_(base_layer.weight + lora.delta(f"net.{i}", 1.0))
    torch.testing.assert_close(merged(x), net(x))  # the merged weights compute what the adapters did
