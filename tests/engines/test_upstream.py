"""Upstream import noise is dropped, and nothing else: each check runs in a fresh Python whose
logging is set up as ComfyUI's is (root logger at INFO, to stderr)."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

NOISY_PACKAGE = '''
import logging, os
print("\\n********\\nWarning: flash-attn is not installed. Will only run the manual PyTorch version. "
      "Please install flash-attn for faster inference.\\n********\\n ")
logging.getLogger("noisy.configuration").info("talker_config is None. Initializing talker model with default values")
logging.getLogger("noisy.configuration").warning("a real warning from noisy")
logging.getLogger("sox").warning("""SoX could not be found!

    If you do not have SoX, proceed here:
     - - - http://sox.sourceforge.net/ - - -
    """)
os.popen("sox -h").read()
print("a real message from noisy")
print("[ERROR] `past_key_values` is part of Foo.forward's signature, but not documented. Make sure to add it to "
      "the docstring of the function in /site-packages/qwen_tts/core/foo.py.")
print("[ERROR] a real error from noisy")
import warnings
warnings.warn_explicit("`rope_scaling` is deprecated and will be removed", FutureWarning, "configuration_utils.py", 726,
                       module="transformers.configuration_utils")
warnings.warn("`rope_scaling` is deprecated in noisy's own words", FutureWarning)
logging.getLogger("transformers.utils.generic").warning("`past_key_values`/`cache_params` are deprecated. Use `cache`.")
if os.environ.get("NOISY_FAILS"):
    raise ImportError("noisy cannot be imported")
'''

IMPORT_NOISY = '''
import dataclasses, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from mizuoto_runtime.engines.qwen3tts.checkpoint import QWEN_TTS_NOISE
from mizuoto_runtime.engines.upstream import quiet_import
try:
    quiet_import("noisy", dataclasses.replace(QWEN_TTS_NOISE, chatty_loggers=("noisy",)))
except ImportError as exc:
    print(f"raised: {exc}", file=sys.stderr)
logging.getLogger("sox").warning("a later sox warning")
import warnings
warnings.warn_explicit("`rope_config_validation` is deprecated, said later", FutureWarning, "modeling_rope_utils.py", 1,
                       module="transformers.modeling_rope_utils")
warnings.warn_explicit("a later transformers warning", FutureWarning, "modeling_rope_utils.py", 2,
                       module="transformers.modeling_rope_utils")
'''

NOISE = ("flash-attn", "********", "is None. Initializing", "SoX could not be found", "sox.sourceforge", "not found\n",
         "but not documented", "`rope_scaling` is deprecated and will", "cache_params` are deprecated",
         "`rope_config_validation` is deprecated")


def run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    pythonpath = f"{REPO}:{tmp_path}"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                            **env})


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    (tmp_path / "noisy").mkdir()
    (tmp_path / "noisy" / "__init__.py").write_text(NOISY_PACKAGE)
    return tmp_path


@pytest.mark.skipif(shutil.which("sox") is not None, reason="SoX is installed: its check prints nothing here")
def test_noise_is_dropped_and_everything_else_kept(noisy: Path) -> None:
    loud = run("import logging, sys; logging.basicConfig(level=logging.INFO); import noisy", noisy)
    assert "sox: not found" in loud.stderr and "flash-attn" in loud.stdout  # what quiet_import is up against
    done = run(IMPORT_NOISY, noisy)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the CLI prints its JSON on stdout
    for noise in NOISE:
        assert noise not in done.stderr, (noise, done.stderr)
    assert not done.stderr.startswith("\n")  # no blank lines where the banner was
    # A warning is dropped for its message and module only (issue 23 item 4).
    for kept in ("a real message from noisy", "WARNING noisy.configuration: a real warning from noisy",
                 "WARNING sox: a later sox warning", "[ERROR] a real error from noisy",
                 "FutureWarning: `rope_scaling` is deprecated in noisy's own words",
                 "FutureWarning: a later transformers warning"):
        assert kept in done.stderr, (kept, done.stderr)


def test_a_failing_import_still_shows_what_it_printed(noisy: Path) -> None:
    done = run(IMPORT_NOISY, noisy, NOISY_FAILS="1")
    assert "a real message from noisy" in done.stderr and "raised: noisy cannot be imported" in done.stderr
    assert "flash-attn" not in done.stderr + done.stdout


def test_qwen_tts_imports_quietly(tmp_path: Path) -> None:
    if importlib.util.find_spec("qwen_tts") is None:  # not imported here: the child imports it
        pytest.skip("qwen_tts is not installed")
    done = run('''
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from mizuoto_runtime.engines.qwen3tts.checkpoint import import_upstream
        import_upstream()
        from qwen_tts.core.models import Qwen3TTSConfig
        Qwen3TTSConfig()  # its sub-configs default, with an INFO line each
        logging.getLogger("qwen_tts.core.models").warning("warnings still show")
        ''', tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    for noise in NOISE:
        assert noise not in done.stderr, (noise, done.stderr)
    assert "warnings still show" in done.stderr
