"""Bad requests in a running ComfyUI: the runtime's one-line errors are the node's error
(M7, M16). A `MizuotoError` raised in a node is what ComfyUI shows in its error dialog; a device
below a component's minimum working set stays an out-of-memory error there, so ComfyUI frees its
models as after any OOM."""
from __future__ import annotations

import re
from typing import Any

from comfyui_harness import ComfyServer, comfy_server, requires_comfyui
from test_comfyui_server import RUN_TIMEOUT_S, node_of, phases_prompt

pytestmark = requires_comfyui
__all__ = ["comfy_server"]  # the fixture, imported for pytest


def execution_error(history: dict[str, Any]) -> dict[str, Any]:
    messages = dict(history["status"]["messages"])
    assert history["status"]["status_str"] == "error" and "execution_error" in messages, messages
    return dict(messages["execution_error"])


def test_empty_text_is_the_talker_nodes_error(comfy_server: ComfyServer) -> None:
    prompt = phases_prompt(comfy_server, text="  \n ", seed=1, prefix="audio/empty")
    error = execution_error(comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S))
    assert error["node_type"] == "MizuotoTalker"
    assert error["exception_type"] == "mizuoto_runtime.errors.ArgumentError"
    assert error["exception_message"].strip() == "text is empty: give the words to speak"


def test_a_device_below_the_minimum_working_set_is_one_line_on_the_node(comfy_server: ComfyServer) -> None:
    prompt = phases_prompt(comfy_server, text="Hello.", seed=2, prefix="audio/too_small")
    node_of(prompt, "MizuotoMemorySettings")["simulate_vram_mb"] = 1
    error = execution_error(comfy_server.wait_history(comfy_server.queue(prompt), RUN_TIMEOUT_S))
    assert error["node_type"] == "MizuotoTalker"
    assert error["exception_type"] == "mizuoto_runtime.errors.DeviceTooSmallError"
    first = error["exception_message"].splitlines()[0]  # ComfyUI appends its own OOM tips below
    assert re.fullmatch(r"talker needs at least [\d.]+ MB on the device; the device has 1\.0 MB", first), first
    # The next prompt, on a device large enough, runs.
    after = phases_prompt(comfy_server, text="After.", seed=3, prefix="audio/after_too_small")
    assert comfy_server.wait_history(comfy_server.queue(after), RUN_TIMEOUT_S)["status"]["status_str"] == "success"
