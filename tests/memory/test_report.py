"""The request report people read and programs parse, its timeline and SVG, and the
`/mizuoto/runtime` payload (M50, M51; issue 15): figures per request, not forever; every
component once and nothing contradicting; the timeline's phases, yields, retries and fallbacks;
an SVG that parses; `mizuoto say --timeline`; `mizuoto runtime --url` over HTTP."""
from __future__ import annotations

import http.server
import json
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mizuoto_runtime import ModelManager, Runtime
from mizuoto_runtime.app.cli import main
from mizuoto_runtime.app.timeline import SVG_NS, svg
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.report import REQUESTS_KEPT, RequestLog, device_name, mb

from conftest import make_manager
from support.models import TinyLM

MB = 1 << 20
PROMPT = torch.zeros(1, 2, dtype=torch.long)
NS = {"svg": SVG_NS}


def talk(ctx: Any, h: ModelHandle, steps: int, phase: str = "talker") -> None:
    with ctx.use([h], 0, phase):
        h.module.generate(PROMPT, steps)


def entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in report["components"] if c["name"] == name]
    return found


def streaming_runtime() -> tuple[Runtime, ModelHandle]:
    """A 12 MB simulated GPU and a 12.6 MB language model: it streams half its layers."""
    rt = Runtime({"compute.simulate_vram_mb": 12})
    return rt, rt.manager.register(TinyLM(), engine="a", name="talker", kind="sequence")


def test_streamed_bytes_are_per_request_over_two_requests() -> None:
    rt, h = streaming_runtime()
    first = rt.manager.request()
    talk(first, h, steps=2)
    one = first.meta["memory"]
    second = rt.manager.request()
    talk(second, h, steps=5)
    two = second.meta["memory"]
    a, b = entry(one["request"], "a:talker"), entry(two["request"], "a:talker")
    # Each request counts its own copies: 2 and 5 passes over the same streamed layers.
    assert a["streamed_bytes"] > 0 and 2 * b["streamed_bytes"] == 5 * a["streamed_bytes"]
    assert one["streamed_mb"] == a["streamed_mb"] and two["streamed_mb"] == b["streamed_mb"]
    assert one["request"]["streamed_mb"] == one["streamed_mb"]
    assert b["streamed_mb"] == mb(b["streamed_bytes"])
    state = rt.describe()
    [model] = state["models"]
    assert model["streamed_bytes"] == b["streamed_bytes"]  # the last request's, not a running total
    assert model["streamed_bytes_total"] == a["streamed_bytes"] + b["streamed_bytes"]
    assert [r["id"] for r in state["requests"]] == [first.id, second.id] and first.id < second.id
    assert state["requests"][-1] == two["request"] and not any(r["running"] for r in state["requests"])
    # The second placement is the same: one timeline phase each, what it had and streamed there.
    [phase] = two["request"]["timeline"]
    assert phase["components"] == [{"name": "a:talker", "loaded_mb": b["on_device_mb"],
                                    "streamed_mb": b["streamed_mb"], "working_mb": 0.0}]


def test_a_running_request_is_listed_while_its_phase_runs() -> None:
    rt, h = streaming_runtime()
    ctx = rt.manager.request()
    with ctx.use([h], 0, "talker"):
        h.module.generate(PROMPT, 1)
        running = rt.describe()["requests"][-1]
        assert running["id"] == ctx.id and running["running"]
        assert running["timeline"][0]["name"] == "talker" and running["components"][0]["on_device_mb"] > 0
    assert not rt.describe()["requests"][-1]["running"]


def two_components() -> tuple[ModelManager, Any, dict[str, Any]]:
    """`first` runs whole, then yields VRAM to `second`, which streams part of itself."""
    m = make_manager(16)
    first = m.register(TinyLM(), engine="a", name="first", kind="sequence")
    second = m.register(TinyLM(layers=6), engine="a", name="second", kind="sequence")
    ctx = m.request()
    talk(ctx, first, 2, "one")
    talk(ctx, second, 2, "two")
    return m, ctx, ctx.meta


def test_every_component_once_and_nothing_contradicts() -> None:
    m, ctx, meta = two_components()
    memory, report = meta["memory"], meta["memory"]["request"]
    assert [c["name"] for c in report["components"]] == ["a:first", "a:second"]
    for c in report["components"]:
        assert c["total_mb"] == memory["components"][c["name"]]["size_mb"]
        assert c["on_device_mb"] == memory["components"][c["name"]]["loaded_mb"]
        assert c["held_mb"] == memory["components"][c["name"]]["held_mb"]
        assert round(c["on_device_mb"] + c["from_ram_mb"], 2) == pytest.approx(c["total_mb"], abs=0.011)
        assert (c["why"] is None) == (c["from_ram_mb"] == 0)
        assert (c["held_why"] is None) == (c["held_mb"] == c["on_device_mb"])
        assert c["streamed_mb"] == mb(c["streamed_bytes"])
        assert c["line"].startswith(c["name"].split(":")[1] + " ")
    first, second = report["components"]
    # `first` was whole in its phase, then gave VRAM to `second`: both said, once, without conflict.
    assert first["from_ram_mb"] == 0 and first["streamed_mb"] == 0 and first["why"] is None
    assert first["held_mb"] < first["on_device_mb"] and first["held_why"] == "gave its VRAM to second"
    assert first["line"].startswith(f"first {first['total_mb']:.1f} MB: all on the GPU")
    assert "gave its VRAM to second" in first["line"]
    yielded = memory["partial"]["a:first"]  # M50's entry agrees: what it holds now, and for whom
    assert yielded["reason"] == "yielded for another component" and yielded["gave_up_for"] == ["a:second"]
    assert yielded["loaded_mb"] == first["held_mb"]
    assert second["why"] == "budget too small" and second["streamed_mb"] > 0 and second["held_why"] is None
    assert (f"{second['on_device_mb']:.1f} MB on the GPU" in second["line"]
            and "streamed from RAM (not enough free VRAM)" in second["line"])
    assert memory["partial"]["a:second"]["loaded_mb"] == second["on_device_mb"]
    assert first["held_mb"] == mb(m.handles[0].loaded_bytes)  # what it holds on the device, really


def test_the_timeline_has_each_phase_and_who_yielded_for_whom() -> None:
    _, ctx, meta = two_components()
    one, two = meta["memory"]["request"]["timeline"]
    assert (one["name"], one["lane"], two["name"], two["lane"]) == ("one", 0, "two", 1)
    assert 0 <= one["start_s"] <= one["end_s"] <= two["start_s"] <= two["end_s"]
    assert one["yields"] == [] and [c["name"] for c in two["components"]] == ["a:second"]
    [y] = two["yields"]
    first = entry(meta["memory"]["request"], "a:first")
    assert (y["component"], y["for_whom"]) == ("a:first", ["a:second"])
    assert y["mb"] == pytest.approx(first["on_device_mb"] - first["held_mb"], abs=0.011)
    assert two["start_s"] <= y["at_s"] <= two["end_s"]
    assert meta["memory"]["request"]["duration_s"] >= two["end_s"]


def test_a_phase_name_run_again_keeps_its_lane() -> None:
    m = make_manager(64)
    h = m.register(TinyLM(), engine="a", name="lm", kind="sequence")
    ctx = m.request()
    for name in ("talker", "decoder", "talker"):
        talk(ctx, h, 1, name)
    timeline = ctx.meta["memory"]["request"]["timeline"]
    assert [(p["name"], p["lane"]) for p in timeline] == [("talker", 0), ("decoder", 1), ("talker", 0)]
    [c] = ctx.meta["memory"]["request"]["components"]
    assert c["phases"] == ["talker", "decoder"]  # once, with every phase it ran in


def test_retries_and_the_fallback_are_marked_in_their_phase() -> None:
    m = make_manager(64, oom_fallback=True)
    h = m.register(TinyLM(), engine="a", name="dec", kind="oneshot")
    ctx = m.request()

    def fails() -> str:
        raise torch.OutOfMemoryError("always")

    assert ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "tiled")) == "tiled"
    report = ctx.meta["memory"]["request"]
    [phase] = report["timeline"]  # the retries and the fallback are one phase run
    assert [r["attempt"] for r in phase["retries"]] == [1, 2]
    assert all("OutOfMemoryError" in r["error"] for r in phase["retries"])
    [fallback] = phase["fallbacks"]
    assert fallback["what"] == "tiled_1d"
    times = [phase["start_s"], *(r["at_s"] for r in phase["retries"]), fallback["at_s"], phase["end_s"]]
    assert times == sorted(times)
    assert (report["oom_retries"], report["fallbacks"]) == (2, ["tiled_1d"])
    assert report["components"][0]["why"] in (None, "capped after OOM")


def test_the_svg_parses_and_draws_every_phase_and_mark() -> None:
    _, _, meta = two_components()
    report = meta["memory"]["request"]
    m = make_manager(64, oom_fallback=True)
    h = m.register(TinyLM(), engine="a", name="dec", kind="oneshot")
    ctx = m.request()

    def fails() -> str:
        raise torch.OutOfMemoryError("always")

    ctx.run("decode", [h], fails, fallback=("tiled_1d", lambda: "tiled"))
    for request, marks in ((report, {"yield": 1}), (ctx.meta["memory"]["request"], {"retry": 2, "fallback": 1})):
        root = ET.fromstring(svg(request))
        assert root.tag == f"{{{SVG_NS}}}svg"
        phases = root.findall(".//svg:g[@class='phase']", NS)
        assert [g.get("data-phase") for g in phases] == [p["name"] for p in request["timeline"]]
        for kind, count in marks.items():
            assert len(root.findall(f".//svg:g[@class='{kind}']", NS)) == count
        texts = [t.text or "" for t in root.iter(f"{{{SVG_NS}}}text")]
        assert texts[0].startswith(f"Request {request['id']} on simulated GPU, ")
        assert {p["name"] for p in request["timeline"]} <= set(texts)  # each lane is labelled
    loaded = ET.fromstring(svg(report)).findall(".//svg:rect[@class='loaded']", NS)
    assert [r.get("data-component") for r in loaded] == ["a:first", "a:second"]
    first, second = report["components"]
    heights = [float(r.get("height")) for r in loaded]  # in proportion to what each had on the device
    assert heights[0] / heights[1] == pytest.approx(first["on_device_mb"] / second["on_device_mb"], rel=0.01)


def test_devices_are_named_in_plain_words() -> None:
    assert device_name("cpu", None, 16 * MB, True) == "simulated GPU, 16 MB"
    assert device_name("cpu", None, 0, False) == "CPU (no GPU: models run from RAM)"
    assert device_name("cuda", 0, 80 * 1024 * MB, False, "NVIDIA H100") == "GPU 0 (NVIDIA H100), 81920 MB"
    assert Runtime({"compute.simulate_vram_mb": 16}).describe()["device"]["name"] == "simulated GPU, 16 MB"


def test_a_cpu_run_says_its_weights_stay_in_ram() -> None:
    from mizuoto_runtime import DeviceService, VramPolicy

    m = ModelManager(DeviceService(), VramPolicy())
    h = m.register(TinyLM(), engine="a", name="lm", kind="sequence")
    ctx = m.request()
    talk(ctx, h, 1)
    report = ctx.meta["memory"]["request"]
    [c] = report["components"]
    assert report["device_mb"] is None and report["device"].startswith("CPU")
    assert c["on_device_mb"] == c["total_mb"] == c["held_mb"] and c["held_why"] is None
    assert c["line"] == f"lm {c['total_mb']:.1f} MB: runs from RAM (no GPU)"


def test_the_log_keeps_the_last_requests_newest_last() -> None:
    log = RequestLog()
    ids = [log.new_id() for _ in range(REQUESTS_KEPT + 3)]
    for i in ids:
        log.publish({"id": i, "components": [{"name": "a:x", "streamed_bytes": i}]})
    log.publish({"id": ids[-2], "components": [{"name": "a:x", "streamed_bytes": 0}]})  # an update in place
    assert [r["id"] for r in log.reports()] == ids[-REQUESTS_KEPT:]
    assert log.last_streamed() == {"a:x": ids[-1]}


def test_say_draws_its_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, chart = tmp_path / "hello.wav", tmp_path / "timeline.svg"
    code = main(["say", "Hi", "-o", str(out), "--timeline", str(chart), "--setting", "compute.simulate_vram_mb=64"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["timeline"] == str(chart)
    request = result["memory"]["request"]
    root = ET.parse(chart).getroot()
    assert [g.get("data-phase") for g in root.findall(".//svg:g[@class='phase']", NS)] == \
        [p["name"] for p in request["timeline"]] and request["timeline"]
    assert request["device"] == "simulated GPU, 64 MB"


def test_say_refuses_a_timeline_in_a_missing_folder(tmp_path: Path) -> None:
    assert main(["say", "Hi", "-o", str(tmp_path / "a.wav"), "--timeline", str(tmp_path / "no" / "t.svg")]) == 2
    assert not (tmp_path / "a.wav").exists()


@pytest.fixture
def serving_runtime() -> Iterator[tuple[str, dict[str, Any]]]:
    """A loopback HTTP server answering GET /mizuoto/runtime with a real runtime's payload
    (what the pack's route returns); anything else is 404."""
    rt, h = streaming_runtime()
    talk(rt.manager.request(), h, 1)
    payload = rt.describe()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(payload).encode()
            self.send_response(200 if self.path == "/mizuoto/runtime" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", payload
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_runtime_url_shows_a_running_hosts_models_and_draws_its_last_request(
        serving_runtime: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, payload = serving_runtime
    chart = tmp_path / "last.svg"
    assert main(["runtime", "--url", url, "--timeline", str(chart)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["url"] == url and result["models"] == payload["models"] and result["requests"] == payload["requests"]
    assert result["timeline"] == str(chart)
    root = ET.parse(chart).getroot()
    assert [g.get("data-phase") for g in root.findall(".//svg:g[@class='phase']", NS)] == ["talker"]
    assert main(["runtime", "--timeline", str(chart)]) == 2  # a fresh process has no request to draw
