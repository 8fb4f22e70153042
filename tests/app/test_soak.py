"""Soak (issue 10): 300 requests alternating two handles on a small simulated device leak
nothing. Skipped by default (marker `soak`); run with `pytest -m soak tests/app/test_soak.py`.

Tolerances, after 30 warm-up requests and a `gc.collect()`:
- Python objects: at most 200 more than after warm-up (caches such as torch's dispatch tables
  settle during warm-up; a leak of one object per request would add 300);
- RSS: at most 24 MiB more than after warm-up, and the second half of the run grows by at most
  8 MiB (the allocator's arenas settle; one leaked copy of a unit per request would add ~900 MiB);
- the simulated device's counter equals what the handles hold after every request.
"""
from __future__ import annotations

import gc

import psutil
import pytest
import torch

from mizuoto_runtime import ModelHandle

from conftest import make_manager
from support.models import TinyLM, WeightNormVocoder

pytestmark = [pytest.mark.soak, pytest.mark.usefixtures("one_torch_thread")]

MiB = 1 << 20
CPU = torch.device("cpu")
REQUESTS = 300
WARMUP = 30
MAX_NEW_OBJECTS = 200
MAX_RSS_GROWTH = 24 * MiB
MAX_RSS_GROWTH_SECOND_HALF = 8 * MiB


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_300_requests_alternating_two_handles_stay_flat() -> None:
    m = make_manager(12)  # neither fits beside the other: every request yields, places, streams
    prompt, mel = torch.tensor([[5, 7, 11]]), torch.randn(1, 80, 16, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    lm_plain, voc_plain = TinyLM(layers=4), WeightNormVocoder()
    torch.manual_seed(0)
    lm = m.register(TinyLM(layers=4), engine="a", name="talker", kind="sequence")
    voc = m.register(WeightNormVocoder(), engine="b", name="vocoder")

    def talk(module: torch.nn.Module) -> torch.Tensor:
        return module.generate(prompt, 4, torch.Generator().manual_seed(1))

    def vocode(module: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return module(mel)

    expected = {id(lm): talk(lm_plain), id(voc): vocode(voc_plain)}
    runs = {id(lm): talk, id(voc): vocode}
    handles: list[ModelHandle] = [lm, voc]

    def request(i: int) -> None:
        h = handles[i % 2]
        ctx = m.request()
        got = ctx.run("phase", [h], lambda: runs[id(h)](h.module))
        assert torch.equal(got, expected[id(h)]), f"request {i} differs from the plain run"
        assert ctx.meta["applied"]["oom_retries"] == 0
        assert m.devices.counted_bytes(CPU) == sum(x.device_bytes for x in handles), f"request {i}"

    for i in range(WARMUP):
        request(i)
    objects, start = len(gc.get_objects()), rss()
    middle = start
    for i in range(REQUESTS):
        request(WARMUP + i)
        if i == REQUESTS // 2:
            middle = rss()
    end = rss()
    new_objects = len(gc.get_objects()) - objects
    print(f"soak: {REQUESTS} requests, {new_objects:+d} objects, RSS {(end - start) / MiB:+.1f} MiB "
          f"({(end - middle) / MiB:+.1f} MiB in the second half)")
    assert new_objects <= MAX_NEW_OBJECTS
    assert end - start <= MAX_RSS_GROWTH and end - middle <= MAX_RSS_GROWTH_SECOND_HALF
    assert lm.streamer.live_copies(lm) == 0 and voc.streamer.live_copies(voc) == 0
