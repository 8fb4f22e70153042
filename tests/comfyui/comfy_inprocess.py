"""In-process checks of the bridge against a real ComfyUI (M35) — those of `accounting_checks.py`
and the pack's own — run by
`test_comfyui_inprocess.py` as `COMFYUI_PYTHON comfy_inprocess.py CHECK...` with
cwd = COMFYUI_PATH. Prints one JSON line per check: {"check", "ok", "error"}.

The budget arithmetic runs on one simulated device shared by both managers (`shared_device.py`).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMFYUI = os.environ["COMFYUI_PATH"]
CHECKS_WANTED = sys.argv[1:]
sys.path.insert(0, COMFYUI)  # a script outside the tree does not get it on sys.path
sys.path.append(str(REPO))  # appended: the repo's `nodes/` must not shadow ComfyUI's `nodes`
# ComfyUI parses its CLI at import (accounting_checks.COMFYUI_ARGS)
sys.argv = [sys.argv[0], "--cpu", "--reserve-vram", "4"]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import accounting_checks  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import utils.extra_config  # noqa: E402,F401  (before `nodes`, as main.py does)
from shared_device import CPU, SharedDevice  # noqa: E402

from mizuoto_runtime.app.comfy_bridge import node_request  # noqa: E402
from mizuoto_runtime.app.runtime import Runtime  # noqa: E402
from mizuoto_runtime.engines import Sampling, engine_class  # noqa: E402

TILE_LIMIT = 300  # frames: tiled_1d decodes at most 256 at a time
COMFY_GET_FREE_MEMORY = mm.get_free_memory


def check_adapter_load_device_is_comfyuis() -> None:
    s = SharedDevice(mm)
    handle = s.handle("a")
    adapter = s.accounting.adapter(handle)
    assert adapter.load_device == mm.get_torch_device(), (adapter.load_device, mm.get_torch_device())
    assert mm.loaded_models() == [adapter]


def check_interrupt_stops_a_node_request() -> None:
    runtime = Runtime({"compute.simulate_vram_mb": 32})
    engine = runtime.engine("demo")
    ctx = node_request(runtime, 1)
    progress = ctx.on_progress
    seen: list[int] = []

    def interrupt_at_5(done: int, total: int) -> None:
        assert progress is not None
        progress(done, total)  # the real comfy.utils.ProgressBar
        seen.append(done)
        if done == 5:
            mm.interrupt_current_processing(True)

    ctx.on_progress = interrupt_at_5
    voice = engine.voice_prompt(ctx)
    try:
        engine.generate(ctx, "interrupted text", voice, Sampling(max_new_tokens=64))
    except mm.InterruptProcessingException:
        assert seen[-1] == 5 and all(h.in_use == 0 for h in engine.handles())
        return
    raise AssertionError("generation was not interrupted")


PACK_NODES = {"MizuotoMemorySettings", "MizuotoEngineLoader", "MizuotoVoicePrompt", "MizuotoTalker",
              "MizuotoDecoder", "MizuotoTTS"}


def pack_nodes() -> dict[str, type]:
    """Load the pack the way ComfyUI does (once) and return ComfyUI's node table."""
    import nodes

    if not PACK_NODES <= set(nodes.NODE_CLASS_MAPPINGS):
        link = Path(os.environ["MIZUOTO_PACK_LINK"])
        assert asyncio.run(nodes.load_custom_node(str(link))), "the pack did not load"
    return dict(nodes.NODE_CLASS_MAPPINGS)


def check_pack_loads_as_a_custom_node() -> None:
    table = pack_nodes()
    assert PACK_NODES <= set(table), set(table) & PACK_NODES
    assert sys.modules["mizuoto_runtime"].__file__ == str(REPO / "mizuoto_runtime" / "__init__.py")


def memory_settings(table: dict[str, type], oom_fallback: bool) -> dict[str, object]:
    return table["MizuotoMemorySettings"].execute(
        vram_mode="normal", vram_reserve_mb=-1, vram_limit_mb=0, async_offload=1, host_copies="auto",
        oom_retry=True, oom_fallback=oom_fallback, simulate_vram_mb=32).args[0]


def fallbacks(report: str) -> list[str]:
    return list(json.loads(report)["applied"]["fallbacks"])


def check_fallback_toggle_allows_and_off_defers_to_the_setting() -> None:
    """M44: a decode that keeps running out of memory falls back to tiles (recorded in
    meta.applied) when the node's toggle is on, whatever oom_fallback says; with the toggle off
    Memory Settings' oom_fallback decides — for the Codec Decoder and the all-in-one TTS."""
    mm.current_loaded_models.clear()
    mm.get_free_memory = COMFY_GET_FREE_MEMORY  # undo the shared-device set-up of other checks
    table = pack_nodes()
    sampling = {"seed": 1, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
                "max_new_tokens": 2048, "do_sample": True}
    text = "x" * 100
    with torch.inference_mode():  # as ComfyUI executes nodes
        engine = table["MizuotoEngineLoader"].execute(engine="demo", checkpoint="none", dtype="float32",
                                                      memory=memory_settings(table, False)).args[0]
        codes = table["MizuotoTalker"].execute(engine=engine, text=text, **sampling).args[0]
        assert codes.tokens.shape[-1] > TILE_LIMIT
        decoder = engine.engine.decoder.module
        whole = decoder.forward

        def out_of_memory_when_whole(tokens: torch.Tensor) -> torch.Tensor:
            if tokens.shape[-1] > TILE_LIMIT:
                raise torch.OutOfMemoryError("test: a whole decode does not fit")
            return whole(tokens)

        decoder.forward = out_of_memory_when_whole
        decode, tts = table["MizuotoDecoder"].execute, table["MizuotoTTS"].execute
        # oom_fallback off: only the toggle allows it.
        audio, report = decode(engine=engine, codes=codes, allow_fallback=True).args
        assert fallbacks(report) == ["tiled_1d"], report
        assert audio["waveform"].shape == (1, 1, codes.tokens.shape[-1] * 256)
        assert fallbacks(tts(engine=engine, text=text, allow_fallback=True, **sampling).args[1]) == ["tiled_1d"]
        for refused in (lambda: decode(engine=engine, codes=codes, allow_fallback=False),
                        lambda: tts(engine=engine, text=text, allow_fallback=False, **sampling)):
            try:
                refused()
            except torch.OutOfMemoryError:
                continue
            raise AssertionError("with oom_fallback and the toggle off the decode should have failed")
        # oom_fallback on: the toggle left off no longer refuses it.
        memory_settings(table, True)
        assert fallbacks(decode(engine=engine, codes=codes, allow_fallback=False).args[1]) == ["tiled_1d"]
        assert fallbacks(tts(engine=engine, text=text, allow_fallback=False, **sampling).args[1]) == ["tiled_1d"]


def evict_each_other_by_unit(engine_id: str) -> None:
    """Issue 34: `engine_id`'s tiny checkpoint (its official layout) and ComfyUI's own diffusion
    UNet share a device too small for both. Our talker placed: ComfyUI unloads part of the UNet,
    module by module, and keeps the rest. ComfyUI loading the UNet again: our talker gives up
    some of its units (streamed from then on) and stays an entry, placed in part."""
    with tempfile.TemporaryDirectory(prefix=f"mizuoto-{engine_id}-") as folder:
        checkpoint = engine_class(engine_id).tiny_writer()(Path(folder) / "tiny", seed=0)
        probe = SharedDevice(mm, total=1 << 40)
        unet = probe.comfy_unet()
        unet_bytes = unet.model_size()
        engine = engine_class(engine_id)(probe.manager, checkpoint, torch.float32, probe.devices.compute_device())
        talker = max((h for h in engine.handles() if h.kind == "sequence"), key=lambda h: h.size_bytes)
        assert len(talker.units) >= 2, (engine_id, len(talker.units))
        # Room for the UNet and half the talker: each fits alone, the two together do not.
        s = SharedDevice(mm, total=unet_bytes + talker.size_bytes // 2 + talker.plan.fixed_bytes)
        engine = engine_class(engine_id)(s.manager, checkpoint, torch.float32, s.devices.compute_device())
        talker = next(h for h in engine.handles() if h.name == talker.name)
        unet = s.comfy_unet()
        mm.load_models_gpu([unet])
        assert unet.loaded_size() == unet_bytes, (unet.loaded_size(), unet_bytes)

        s.manager.load([talker])
        assert talker.is_whole, talker.streamed_units
        assert 0 < unet.loaded_size() < unet_bytes, (unet.loaded_size(), unet_bytes)  # part of the UNet stayed

        # ComfyUI on --cpu loads without freeing (shared_device.py): it frees what the rest of
        # the UNet needs as it would on a GPU, then loads it.
        mm.free_memory(unet_bytes - unet.loaded_size(), CPU, keep_loaded=[s.entry_of(unet)])
        mm.load_models_gpu([unet])
        assert unet.loaded_size() == unet_bytes and s.free() >= 0, (unet.loaded_size(), unet_bytes, s.free())
        streamed = len(talker.streamed_units)
        assert 0 < streamed < len(talker.units), (streamed, len(talker.units))  # by unit, not the whole handle
        assert talker in s.ours(), "our talker should stay an entry, placed in part"
        yields = [e for e in s.manager.events if e[0] == "yield"]
        assert yields, s.manager.events


def check_demo_and_a_comfy_unet_evict_each_other_by_unit() -> None:
    evict_each_other_by_unit("demo")


CHECKS: dict[str, Callable[[], None]] = {
    **accounting_checks.CHECKS,  # the ComfyUI accounting checks every release of the harness runs
    **{name[len("check_"):]: fn for name, fn in list(globals().items()) if name.startswith("check_")},
}


if __name__ == "__main__":
    accounting_checks.report(CHECKS, CHECKS_WANTED)
