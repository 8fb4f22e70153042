"""Issue 31 (M8): a request on a thread of its own computes with the intra-op thread count the
process set, so `compute.gpu_jobs` never changes a CPU run's numbers.

`torch.set_num_threads` reaches MKL in the calling thread only; a new thread whose first work is
a matrix product runs MKL's GEMM at MKL's default (the core count), and on MKL's Intel code path
a product with a long inner dimension is split along it: its sums round otherwise. On MKL's
generic path (a non-Intel CPU) these products are not split and the tests pass either way; with
MKL forced onto its Intel path (the LD_PRELOAD shim of issue 31's report), they fail without
`mizuoto_runtime.memory.intra_op`.
"""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from mizuoto_runtime.memory.intra_op import computing_thread

from conftest import make_manager

# Inner dimensions MKL's Intel path splits across two threads at 2 and 4 rows (measured).
INNER = (1145, 2032, 2740)
ROWS = 4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class LongSums(nn.Module):
    """Products over long inner dimensions, the first thing the model does."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(k, 64) for k in INNER)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [layer(x[:, : layer.in_features]) for layer in self.layers]


def inputs() -> torch.Tensor:
    return torch.randn(ROWS, max(INNER), generator=torch.Generator().manual_seed(1))


def on_plain_threads(count: int, body: object) -> list[list[torch.Tensor]]:
    """Run `body()` on `count` new threads at once, started as a host would start them (no thread
    setting of their own); what each returned."""
    results: list[list[torch.Tensor]] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            results.append(body())  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            raised.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not raised, raised
    assert len(results) == count
    return results


@pytest.mark.parametrize("gpu_jobs", [1, 2])
def test_a_request_on_a_new_thread_equals_the_main_threads_run(gpu_jobs: int) -> None:
    """The main thread's request places the model (its weight copies would set a new thread's
    count on the way, ATen's parallel copy), so the new threads' requests go straight to it."""
    torch.manual_seed(0)
    model = LongSums().eval()
    x = inputs()
    m = make_manager(64, gpu_jobs=gpu_jobs)
    handle = m.register(model, engine="t", name="sums", kind="oneshot")

    def request() -> list[torch.Tensor]:
        with m.request().use([handle], 0, "p"), torch.no_grad():
            return model(x)

    expected = request()
    for got in on_plain_threads(gpu_jobs, request):
        for g, e, k in zip(got, expected, INNER):
            assert torch.equal(g, e), f"inner dimension {k}: differs from the main thread's run"


def test_what_a_request_computes_before_its_first_phase_equals_the_main_threads() -> None:
    """An engine's work before any phase (its frontend: host tensors, no component placed)."""
    torch.manual_seed(0)
    model = LongSums().eval()
    x = inputs()
    with torch.no_grad():
        expected = model(x)
    m = make_manager(64)

    def request() -> list[torch.Tensor]:
        m.request()
        with torch.no_grad():
            return model(x)

    (got,) = on_plain_threads(1, request)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_a_computing_thread_rounds_as_its_creator() -> None:
    torch.manual_seed(0)
    model = LongSums().eval()
    x = inputs()
    with torch.no_grad():
        expected = model(x)
        got: list[torch.Tensor] = []
        thread = computing_thread(lambda: got.extend(model(x)))
        thread.start()
        thread.join(60)
    assert len(got) == len(INNER)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
