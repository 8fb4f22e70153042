"""Harness of the real-ComfyUI tests: where ComfyUI is, which Python runs it, and a server
running the pack (M35, M44, M50, M51).

These tests need `COMFYUI_PATH` (a ComfyUI work tree) and skip with that reason without it.
ComfyUI's own Python runs ComfyUI: `COMFYUI_PYTHON`, or the Python running pytest when unset —
so both `.venv/bin/python -m pytest tests/comfyui` (with COMFYUI_PYTHON set) and
`$COMFYUI_PYTHON -m pytest tests/comfyui` work. In-process checks run in one subprocess
(`comfy_inprocess.py`); server tests start `main.py --cpu` on a free loopback port.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMFYUI_PATH = os.environ.get("COMFYUI_PATH", "")
COMFYUI_PYTHON = os.environ.get("COMFYUI_PYTHON") or sys.executable

requires_comfyui = pytest.mark.skipif(
    not COMFYUI_PATH,
    reason="COMFYUI_PATH is not set: the real-ComfyUI tests need a ComfyUI work tree "
           "(and COMFYUI_PYTHON, its Python), as the README says",
)

SERVER_START_TIMEOUT_S = 120.0
NOT_SAVED = object()  # a widget the workflow has no value for
REFERENCE_WAV = "voice_to_clone.wav"  # in the server's input folder: the voice-clone template's name
REQUEST_TIMEOUT_S = 10.0
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # nodes the frontend keeps out of the prompt
NOT_IMPORTABLE = 3  # the exit status of `import_guard` when an engine's package cannot be imported


def import_guard(engine_module: str) -> str:
    """Python code that imports the upstream package of `mizuoto_runtime.engines.<engine_module>`
    (its `checkpoint` module's `import_upstream`)
    as the engine does (`import_upstream`, adapted to the transformers installed), and exits
    with NOT_IMPORTABLE, saying why, when it cannot."""
    return (f"import sys\ntry:\n    from mizuoto_runtime.engines.{engine_module}.checkpoint import import_upstream\n"
            f"    import_upstream()\n"
            f"except Exception as exc:  # missing, or installed beside a transformers it does not run on\n"
            f"    print(f'the {engine_module} engine cannot import its package under {{sys.executable}}: "
            f"{{type(exc).__name__}}: {{exc}}', file=sys.stderr)\n"
            f"    sys.exit({NOT_IMPORTABLE})\n")


QWEN_PROBE = import_guard("qwen3tts")
TINY_WRITER = QWEN_PROBE + """
from mizuoto_runtime.engines.qwen3tts.tiny import write
write(sys.argv[1], version=sys.argv[2])
"""
TINY_WRITE_TIMEOUT_S = 300


def comfyui_env() -> dict[str, str]:
    # Offline: checkpoints are local folders, and a Hugging Face lookup would only wait for a timeout.
    return {"HF_HUB_OFFLINE": "1", **os.environ, "COMFYUI_PATH": COMFYUI_PATH, "PYTHONUNBUFFERED": "1"}


def run_with_comfyui_python(code: str, *args: str, needs: str, timeout_s: float = 300) -> None:
    """Run `code` (with `args` as sys.argv[1:]) under ComfyUI's Python, from the repository;
    skip the calling test, saying why, when the engine module `needs` cannot import its upstream
    package there (an engine extra that ComfyUI environment does not have)."""
    guard = import_guard(needs)
    done = subprocess.run([COMFYUI_PYTHON, "-c", guard + code, *args], cwd=REPO, env=comfyui_env(),
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode == NOT_IMPORTABLE:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, f"running under {COMFYUI_PYTHON} failed:\n{done.stderr[-4000:]}"


def write_reference_wav(path: Path, seconds: float = 0.5, rate: int = 16000) -> None:
    """A short 16-bit mono tone for LoadAudio → Mizuoto Voice Prompt."""
    samples = [int(8000 * math.sin(2 * math.pi * 220 * i / rate)) for i in range(int(seconds * rate))]
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(struct.pack(f"<{len(samples)}h", *samples))


def run_checks(command: list[str], cwd: str | Path, timeout_s: float,
               env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Run a check script (`comfy_inprocess.py`, `version_check.py`) and read its
    `MIZUOTO-CHECK {json}` lines: check name -> {"check", "ok", "error"}."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env={**(env or comfyui_env()), "PYTHONUNBUFFERED": "1"})
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("MIZUOTO-CHECK "):
            result = json.loads(line[len("MIZUOTO-CHECK "):])
            found[result["check"]] = result
    assert found, f"no check ran (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return found


def check_names(script: Path) -> list[str]:
    """The checks a script defines (`def check_<name>`), read from its source: the test process
    cannot import it (it imports ComfyUI)."""
    return re.findall(r"^def check_(\w+)\(", script.read_text(), flags=re.MULTILINE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def qwen_tts_problem(python: str) -> str | None:
    """Why `python` cannot import `qwen_tts` (really importing it), or None when it can."""
    done = subprocess.run([python, "-c", QWEN_PROBE], cwd=REPO, capture_output=True, text=True,
                          timeout=TINY_WRITE_TIMEOUT_S, env=comfyui_env())
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def write_tiny_qwen3tts(folder: Path, model_type: str) -> None:
    """A tiny Qwen3-TTS checkpoint (random weights, the official layout), written by the first
    of ComfyUI's Python and the one running pytest that has `qwen_tts`; skips if neither has it.
    Listing it in ComfyUI reads its configs only, so ComfyUI itself needs no `qwen_tts` for that."""
    tried = []
    for python in dict.fromkeys((COMFYUI_PYTHON, sys.executable)):
        done = subprocess.run([python, "-c", TINY_WRITER, str(folder), model_type], cwd=REPO, env=comfyui_env(),
                              capture_output=True, text=True, timeout=TINY_WRITE_TIMEOUT_S)
        if done.returncode == 0:
            return
        if done.returncode != NOT_IMPORTABLE:
            raise AssertionError(f"writing the tiny {model_type} checkpoint failed:\n{done.stderr[-4000:]}")
        tried.append(done.stderr.strip().splitlines()[-1])
    pytest.skip("; ".join(tried))


class ComfyServer:
    """A ComfyUI server on 127.0.0.1 with the pack linked in as `custom_nodes/mizuoto` (and, with
    `copies` > 1, again as `custom_nodes/mizuoto-copy-N`, as a second clone would be)."""

    def __init__(self, root: Path, default_paths: Mapping[str, Path] | None = None, copies: int = 1) -> None:
        self.root = root
        self.default_paths = dict(default_paths or {})  # model folders ComfyUI lists (and writes) first
        self.copies = copies
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = root / "output"
        self.log_path = root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        custom_nodes = self.root / "custom_nodes"
        models = self.root / "models" / "mizuoto"
        for folder in (custom_nodes, models, self.output, self.root / "input", self.root / "temp",
                       self.root / "user"):
            folder.mkdir(parents=True, exist_ok=True)
        (custom_nodes / "mizuoto").symlink_to(REPO, target_is_directory=True)
        for copy in range(1, self.copies):
            (custom_nodes / f"mizuoto-copy-{copy}").symlink_to(REPO, target_is_directory=True)
        self._write_demo_checkpoint(models / "demo-small")
        write_reference_wav(self.root / "input" / REFERENCE_WAV)
        config = self.root / "extra_model_paths.yaml"
        text = f"mizuoto_tests:\n  custom_nodes: {custom_nodes}\n  mizuoto: {models}\n"
        if self.default_paths:
            text += "mizuoto_tests_first:\n  is_default: true\n" + "".join(
                f"  {kind}: {path}\n" for kind, path in self.default_paths.items())
        config.write_text(text)
        command = [
            COMFYUI_PYTHON, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
            "--extra-model-paths-config", str(config), "--output-directory", str(self.output),
            "--input-directory", str(self.root / "input"), "--temp-directory", str(self.root / "temp"),
            "--user-directory", str(self.root / "user"), "--disable-auto-launch",
        ]
        with open(self.log_path, "wb") as log:
            # Its own Mizuoto cache: no calibration (M47) read from or written to the user's.
            env = {**comfyui_env(), "MIZUOTO_CACHE": str(self.root / "cache")}
            self.process = subprocess.Popen(command, cwd=COMFYUI_PATH, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.process.returncode}:\n{self.log()}")
            try:
                self.get("/object_info/SaveAudio")
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise TimeoutError(f"ComfyUI did not answer within {SERVER_START_TIMEOUT_S:.0f} s:\n{self.log()}")

    @staticmethod
    def _write_demo_checkpoint(folder: Path) -> None:
        """The demo engine's weights as safetensors files, for the loader's checkpoint path (M27)."""
        code = "import sys; from mizuoto_runtime.engines.demo.tiny import write; write(sys.argv[1])"
        subprocess.run([COMFYUI_PYTHON, "-c", code, str(folder)], cwd=REPO, check=True, timeout=120)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the server and its children
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    # ---- HTTP --------------------------------------------------------------------------------
    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=REQUEST_TIMEOUT_S) as response:
            return json.loads(response.read())

    def post(self, path: str, data: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url + path, json.dumps(data).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            body = response.read()
            return json.loads(body) if body else None

    def post_raw(self, path: str, data: dict[str, Any]) -> Any:
        """POST and the JSON answer, also when ComfyUI refuses (HTTP 400 with `node_errors`)."""
        try:
            return self.post(path, data)
        except urllib.error.HTTPError as refused:
            return json.loads(refused.read())

    def queue(self, prompt: dict[str, Any]) -> str:
        answer = self.post("/prompt", {"prompt": prompt, "client_id": "mizuoto-tests"})
        assert not answer.get("node_errors"), answer
        return str(answer["prompt_id"])

    def wait_history(self, prompt_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            if prompt_id in history:
                return dict(history[prompt_id])
            time.sleep(0.2)
        raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout_s:.0f} s:\n{self.log()}")

    def wait_runtime(self, condition: Any, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll GET /mizuoto/runtime until `condition(describe)` holds (60 s: ComfyUI applies /free
        between prompts, after its garbage collection, slowly on a loaded 2-core machine)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.get("/mizuoto/runtime")
            if condition(state):
                return dict(state)
            if time.monotonic() > deadline:
                raise TimeoutError(f"/mizuoto/runtime never satisfied the condition: {state}\n{self.log()}")
            time.sleep(0.2)

    def free_until(self, condition: Any, free_memory: bool = True, attempts: int = 12) -> dict[str, Any]:
        """POST /free until `condition(GET /mizuoto/runtime)` holds. ComfyUI's prompt worker reads
        the flag when its queue wakes it; a /free sent while the worker runs its garbage collection
        after a prompt misses that wake-up and waits for the next one (up to 1000 s in v0.3.64),
        so ask again."""
        body = {"unload_models": True, **({"free_memory": True} if free_memory else {})}
        for _ in range(attempts - 1):
            self.post("/free", body)
            try:
                return self.wait_runtime(condition, timeout_s=10.0)
            except TimeoutError:
                continue
        self.post("/free", body)
        return self.wait_runtime(condition, timeout_s=10.0)


@contextlib.contextmanager
def running_server(prefix: str, prepare: Callable[[Path], None] | None = None,
                   default_paths: Callable[[Path], Mapping[str, Path]] | None = None,
                   copies: int = 1) -> Iterator[ComfyServer]:
    """A ComfyUI server over a fresh temp base folder; `prepare(root)` runs before it starts
    (e.g. to write checkpoints under `root/models`); `default_paths(root)` names model folders
    (kind → folder) ComfyUI takes first, so what nodes save there stays out of ComfyUI's tree.
    Always stopped and removed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if prepare is not None:
            prepare(root)
        server = ComfyServer(root, default_paths(root) if default_paths is not None else None, copies)
        try:
            server.start()
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def comfy_server() -> Iterator[ComfyServer]:
    with running_server("mizuoto-comfyui-") as server:
        yield server


def ui_to_api(workflow: dict[str, Any], object_info: dict[str, Any]) -> dict[str, Any]:
    """A UI-format workflow (what ComfyUI shows as a template) as an API prompt: links become
    `[node, slot]`, `widgets_values` fill the widget inputs in `input_order` (a seed's
    control_after_generate adds one value). Widgets past the saved values — inputs added after
    the workflow was saved — are left out, so they take their defaults, as in the frontend."""
    sources = {link[0]: (str(link[1]), link[2]) for link in workflow["links"]}
    prompt: dict[str, Any] = {}
    for node in workflow["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        info = object_info[node["type"]]
        linked = {i["name"]: sources[i["link"]] for i in node["inputs"] if i.get("link") is not None}
        sockets = {i["name"] for i in node["inputs"]}
        values = iter(node.get("widgets_values", []))
        inputs: dict[str, Any] = dict(linked)
        for section in ("required", "optional"):
            for name in info["input_order"].get(section, []):
                if name in sockets:
                    continue
                spec = info["input"][section][name]
                value = next(values, NOT_SAVED)
                if value is NOT_SAVED:
                    break
                inputs[name] = value
                if len(spec) > 1 and spec[1].get("control_after_generate"):
                    next(values)
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
