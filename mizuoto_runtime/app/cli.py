"""`mizuoto say | runtime | doctor | tiny-checkpoint | train` — the runtime without ComfyUI."""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..audio import Audio, read_wav, write_wav
from ..engines import ENGINES, Engine, Sampling, check_request, engine_class, install_hint
from ..errors import ArgumentError, MizuotoError
from ..memory import cuda_allocator
from ..memory.small_weights import CHOICES
from ..nn.dtypes import DTYPES
from .chunking import CROSSFADE_MS, DEFAULT_CHUNK_CHARS, MIN_CHUNK_CHARS, TextChunking
from .runtime import Runtime
from .scripts import command as scripts
from .timeline import write_svg

log = logging.getLogger("mizuoto")


def _settings(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise MizuotoError(f"--setting expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mizuoto", description="Mizuoto TTS runtime")
    sub = p.add_subparsers(dest="command", required=True)
    say = sub.add_parser("say", help="synthesize text to a WAV file and print meta.memory")
    say.add_argument("text", nargs="?", help="the words to speak; with [Name] tags, a script (see --script)")
    say.add_argument("--engine", default="demo", choices=sorted(ENGINES))
    say.add_argument("--model", help="checkpoint folder (engines that need weights)")
    say.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    say.add_argument("--device", default="auto", help="where the engine runs: auto, cpu, cuda:0, ...")
    say.add_argument("--weights", help="how Linear and Conv weights are stored: " + ", ".join(CHOICES) + "; or "
                     "phase=choice pairs (generate=fp8_e4m3fn,decode=int8). fp8 and int8 halve memory and change "
                     "the audio slightly (default: the compute.weights setting, as published)")
    say.add_argument("-o", "--output", default="out.wav")
    say.add_argument("--timeline", metavar="SVG", help="also draw the request's VRAM timeline to this SVG file")
    say.add_argument("--voice", help="reference WAV for voice cloning")
    say.add_argument("--ref-text", help="transcript of the reference WAV")
    say.add_argument("--speaker", help="a built-in speaker (engines that have them)")
    say.add_argument("--instruct", help="a voice or style description (engines that take one)")
    say.add_argument("--language", help="the text's language (default: the engine detects it)")
    say.add_argument("--seed", type=int, default=0)
    say.add_argument("--max-new-tokens", type=int, default=2048)
    say.add_argument("--chunk-chars", type=int, default=DEFAULT_CHUNK_CHARS, metavar="N",
                     help=f"long text is cut at sentence ends into chunks of at most N characters, each "
                          f"synthesized in turn and joined with a {CROSSFADE_MS:g} ms crossfade "
                          f"(default {DEFAULT_CHUNK_CHARS}, at least {MIN_CHUNK_CHARS})")
    say.add_argument("--no-chunking", action="store_true", help="synthesize the whole text in one go")
    say.add_argument("--emotion-voice", metavar="WAV", help="IndexTTS-2: speech whose emotion to take")
    say.add_argument("--emotion", default="", help="IndexTTS-2: emotions as name=weight, e.g. 'sad=0.8, calm=0.2'")
    say.add_argument("--emotion-strength", type=float, default=1.0, help="IndexTTS-2: how much of the emotion (0-1)")
    say.add_argument("--emotion-text", help="IndexTTS-2: a sentence whose emotion its emotion model reads")
    say.add_argument("--emotion-from-text", action="store_true",
                     help="IndexTTS-2: its emotion model reads the emotion of the text being spoken")
    say.add_argument("--emotion-random", action="store_true",
                     help="IndexTTS-2: with --emotion or emotion text, a random variant of each emotion (seeded)")
    say.add_argument("--emotion-balance", action="store_true",
                     help="IndexTTS-2: tone --emotion down as IndexTTS-2's web UI does (total at most 0.8)")
    say.add_argument("--exaggeration", type=float, default=None,
                     help="Chatterbox: how expressive the voice speaks (0: flat; default 0.5)")
    scripts.add_arguments(say)
    say.add_argument("--allow-fallback", action="store_true",
                     help="after out-of-memory retries fail, allow the decoder's cheaper tiled fallback "
                          "(output differs slightly)")
    train = _train_parser(sub)
    for name in ("say", "runtime", "doctor", "train"):
        target = {"say": say, "train": train}.get(name) or sub.add_parser(name, help=f"{name} report")
        target.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                            help="a compute.* setting, e.g. compute.simulate_vram_mb=16")
    doctor = sub.choices["doctor"]
    doctor.add_argument("--fit", action="store_true",
                        help="what fits on the card: every installed engine's published models, whole, partial "
                             "(what stays resident, what streams per token or step) or refused")
    doctor.add_argument("--card", metavar="SIZE", help="with --fit: the card's size, e.g. 12GB (default: this "
                                                       "machine's GPU, else the standard cards)")
    doctor.add_argument("--beside", metavar="SIZE", help="with --fit: what other models keep resident on the card, "
                                                         "e.g. 5GB (default: what is in use on this GPU now)")
    doctor.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="with --fit: only this published model (as the table names it; repeatable)")
    runtime = sub.choices["runtime"]
    runtime.add_argument("--url", help="a running ComfyUI with the pack (http://127.0.0.1:8188): show its "
                                       "models instead of a fresh process's")
    runtime.add_argument("--timeline", metavar="SVG", help="with --url: draw its latest request's VRAM timeline "
                                                         "to this SVG file")
    tiny = sub.add_parser("tiny-checkpoint", help="write a small random checkpoint of an engine (tests, demos)")
    tiny.add_argument("directory")
    tiny.add_argument("--engine", default="qwen3tts", choices=sorted(ENGINES))
    tiny.add_argument("--version", "--type", dest="version",
                      help="qwen3tts (--type): base, custom_voice or voice_design (default base; Base clones, "
                           "CustomVoice has speakers, VoiceDesign takes instruct); cosyvoice: 2 or 3 (default 2); "
                           "fishspeech: s2-pro or s1-mini (default s2-pro; S2-Pro: sharded safetensors, S1-mini: "
                           "model.pth); gptsovits: v2 or v2pro (default v2)")
    tiny.add_argument("--dtype", choices=sorted(DTYPES), help="precision of the main weights (default float32; "
                                                              "gptsovits: float16, as published voices are)")
    tiny.add_argument("--seed", type=int, default=0)
    check = sub.add_parser("check-reference", help="compare an engine with reference data made by its upstream "
                                                   "code (one line per stage; exit 1 on any failure)")
    check.add_argument("directory", help="a folder with ckpt/, reference.safetensors and reference.json")
    check.add_argument("--engine", required=True)
    check.add_argument("--stage", help="run only the stages whose name contains this")
    check.add_argument("--threads", type=int, default=1, help="CPU threads (the references use 1)")
    return p


def _train_parser(sub: Any) -> argparse.ArgumentParser:
    from .training.memory import PRESET_NAMES
    from .training.methods import METHODS

    train = sub.add_parser("train", help="fine-tune a model in its own process (prints the result as JSON)")
    train.add_argument("--method", default="qwen3tts_lora", choices=sorted(METHODS))
    train.add_argument("--model", required=True, help="the base checkpoint folder (qwen3tts_lora: a Base checkpoint)")
    train.add_argument("--data", required=True, help="a folder of audio clips, each with a .txt transcript beside it")
    train.add_argument("-o", "--output", required=True, help="the LoRA file to write (.safetensors)")
    train.add_argument("--memory", default="default", choices=PRESET_NAMES,
                       help="training.memory: default (fastest), low, lowest (least device memory)")
    train.add_argument("--device", default="auto", help="where to train: auto, cpu, cuda:0, ...")
    for flag, kind in (("steps", int), ("batch-size", int), ("lr", float), ("rank", int), ("alpha", float),
                       ("seed", int)):
        train.add_argument(f"--{flag}", type=kind, help="default: the method's")
    train.add_argument("--language", help="the clips' language (default: auto)")
    train.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="any other method parameter, e.g. targets=talker (values are JSON or text)")
    return train


def _train_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"model": args.model, "data": args.data, "output": args.output, "steps": args.steps,
                              "batch_size": args.batch_size, "lr": args.lr, "rank": args.rank, "alpha": args.alpha,
                              "seed": args.seed, "language": args.language}
    for pair in args.param:
        key, sep, value = pair.partition("=")
        if not sep:
            raise MizuotoError(f"--param expects KEY=VALUE, got {pair!r}")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value.strip()
    return params


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    """M60: a training job in its own process; progress and loss go to the log."""
    from .training.job import TrainingJob

    def show(event: dict[str, Any]) -> None:
        if event.get("event") == "step":
            log.info("step %d/%d  loss %.4f", event["step"], event["steps"], event["loss"])
        elif event.get("event") == "phase":
            log.info("%s: peak %.1f MB", event["name"], event["memory/peak_mb"])

    job = TrainingJob(Runtime(_settings(args.setting)), args.method, _train_params(args), memory=args.memory,
                      device=args.device, on_event=show)
    return job.run()


def cmd_say(args: argparse.Namespace) -> dict[str, Any]:
    rt = Runtime(_settings(args.setting))
    # Everything the request names is checked before the engine loads (a load can take minutes).
    sampling = Sampling(seed=args.seed, max_new_tokens=args.max_new_tokens, language=args.language)
    text = scripts.script_text(args)
    if not args.srt:
        check_request(text, sampling)
    chunking = TextChunking(enabled=not args.no_chunking, max_chars=args.chunk_chars)
    output = _output_file(Path(args.output))
    timeline = _output_file(Path(args.timeline)) if args.timeline else None
    reference = _reference(Path(args.voice)) if args.voice else None
    options = _voice_options(args)
    rt.prompt_store = scripts.prompt_store(args)
    engine = rt.engine(args.engine, args.model, args.dtype, args.device, args.weights)
    if scripts.wants_script(args):
        own = scripts.CharacterVoice(reference, args.ref_text, args.speaker, args.instruct, options)
        audio, meta = scripts.speak(rt, engine, args, text, scripts.character_voices(args, own), sampling, output,
                                    args.allow_fallback or None)
    else:
        with scripts.progress_bar() as on_progress:
            audio, meta = rt.say(engine, text, reference=reference, transcript=args.ref_text, speaker=args.speaker,
                                 sampling=sampling, allow_fallback=args.allow_fallback or None,
                                 instruct=args.instruct, chunking=chunking, voice_options=options,
                                 on_progress=on_progress)
    try:
        path = write_wav(output, audio)
    except OSError as exc:
        raise ArgumentError(f"cannot write the output file {output}: {exc}") from exc
    request = meta["memory"]["request"]
    for component in request["components"]:
        log.info("%s", component["line"])
    drawn = {"timeline": str(_write_timeline(request, timeline))} if timeline else {}
    return {"output": str(path), **drawn, "seconds": round(audio.seconds, 3), "sample_rate": audio.sample_rate,
            **meta}


def _voice_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine-specific voice options the flags set (IndexTTS-2's emotion, Chatterbox's
    exaggeration)."""
    options: dict[str, Any] = {} if args.exaggeration is None else {"exaggeration": args.exaggeration}
    if not (args.emotion_voice or args.emotion.strip() or args.emotion_text or args.emotion_from_text):
        return options
    from ..engines.indextts2.emotion import Emotion

    audio = _reference(Path(args.emotion_voice)) if args.emotion_voice else None
    emotion = Emotion.from_inputs(audio, args.emotion, args.emotion_strength, text=args.emotion_text,
                                  from_text=args.emotion_from_text, random=args.emotion_random,
                                  balance=args.emotion_balance)
    return options if emotion is None else {**options, "emotion": emotion}


def _write_timeline(request: dict[str, Any], path: Path) -> Path:
    try:
        return write_svg(request, path)
    except OSError as exc:
        raise ArgumentError(f"cannot write the timeline file {path}: {exc}") from exc


def _output_file(path: Path) -> Path:
    """`--output`: a file name in a folder that exists and can be written."""
    if path.is_dir():
        raise ArgumentError(f"output {path} is a folder; give a file name, e.g. {path / 'out.wav'}")
    folder = path.parent
    if not folder.is_dir():
        raise ArgumentError(f"output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ArgumentError(f"output folder {folder} cannot be written")
    return path


def _reference(path: Path) -> Audio:
    """`--voice`: a WAV file that exists and can be read."""
    if not path.is_file():
        raise ArgumentError(f"reference file {path} does not exist" if not path.exists()
                            else f"reference {path} is not a file")
    try:
        return read_wav(path)
    except OSError as exc:
        raise ArgumentError(f"cannot read the reference file {path}: {exc}") from exc


#: The pack's read-only route (M51): no input, no paths.
RUNTIME_ROUTE = "/mizuoto/runtime"
URL_TIMEOUT_S = 10.0


def cmd_runtime(args: argparse.Namespace) -> dict[str, Any]:
    if not args.url:
        if args.timeline:
            raise MizuotoError("--timeline draws a running host's latest request: give --url too")
        return Runtime(_settings(args.setting)).describe()
    if args.setting:
        raise MizuotoError("--setting applies to a fresh runtime; a running host keeps its own (drop --url)")
    timeline = _output_file(Path(args.timeline)) if args.timeline else None
    answer = remote_runtime(args.url)
    if timeline is not None:
        requests = answer.get("requests") or []
        if not requests:
            raise MizuotoError(f"{answer['url']} has run no Mizuoto request yet: nothing to draw")
        answer["timeline"] = str(_write_timeline(requests[-1], timeline))
    return answer


def remote_runtime(url: str) -> dict[str, Any]:
    """M51 of a running host: GET its `/mizuoto/runtime` route."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise MizuotoError(f"--url must start with http:// or https://, got {url!r}")
    try:
        with urllib.request.urlopen(base + RUNTIME_ROUTE, timeout=URL_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise MizuotoError(f"{base}{RUNTIME_ROUTE} answered HTTP {exc.code}: is the Mizuoto pack installed "
                           "in that ComfyUI?") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise MizuotoError(f"cannot reach {base}: {getattr(exc, 'reason', exc)}") from exc
    except json.JSONDecodeError as exc:
        raise MizuotoError(f"{base}{RUNTIME_ROUTE} did not answer JSON ({exc})") from exc
    if not isinstance(answer, dict) or "models" not in answer:
        raise MizuotoError(f"{base}{RUNTIME_ROUTE} did not answer a Mizuoto runtime report")
    return {"url": base, **answer}


def cmd_doctor(args: argparse.Namespace) -> dict[str, Any]:
    """M52: the memory policy in force, the CUDA allocator (M54: in force, or from the next
    start), and which engines can be imported. With ``--fit`` (issue 35): the fit table."""
    if args.fit:
        from . import fit

        return fit.fit_report(None if args.card is None else fit.parse_size(args.card),
                              None if args.beside is None else fit.parse_size(args.beside), args.model)
    if args.card is not None or args.beside is not None or args.model:
        raise ArgumentError("--card, --beside and --model go with --fit")
    rt = Runtime(_settings(args.setting))
    engines = {}
    for engine_id in ENGINES:
        try:
            cls = engine_class(engine_id)
        except MizuotoError as exc:
            engines[engine_id] = f"missing ({exc})"
            continue
        ok = cls.UPSTREAM is None or _installed(cls.UPSTREAM)
        engines[engine_id] = "ok" if ok else f"missing ({install_hint(cls.REQUIREMENTS or engine_id)})"
    allocator = {"applied": cuda_allocator.state(rt.policy.cuda_allocator),
                 "backend": torch.cuda.get_allocator_backend() if torch.cuda.is_available() else None}
    return {"memory": {**rt.policy.describe(), **rt.devices.describe()}, "cuda_allocator": allocator,
            "engines": engines}


def _installed(module: str) -> bool:
    """Whether `module` can be imported; a dotted name whose parent package is missing is not
    (find_spec raises there: Higgs Audio's ``transformers.models.higgs_audio_v2``)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _check_version(engine: type[Engine], version: str | None) -> None:
    """`--version`, when given, is one of the engine's checkpoint versions."""
    if version is not None and version not in engine.VERSIONS:
        has = ", ".join(engine.VERSIONS) if engine.VERSIONS else "one checkpoint layout, no versions"
        raise MizuotoError(f"--version {version!r}: {engine.id} has {has}")


def cmd_tiny_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Write a small random checkpoint in the engine's own folder layout (no download)."""
    engine = engine_class(args.engine)
    _check_version(engine, args.version)
    try:
        folder = engine.tiny_writer()(args.directory, version=args.version, seed=args.seed,
                                      dtype=None if args.dtype is None else DTYPES[args.dtype])
    except ImportError as exc:
        hint = f" (install it with: {install_hint(engine.REQUIREMENTS)})" if engine.REQUIREMENTS else ""
        raise MizuotoError(f"engine {args.engine!r} cannot write a checkpoint: {exc}{hint}") from exc
    except ValueError as exc:  # a precision its published checkpoints do not come in
        raise MizuotoError(f"engine {args.engine!r} cannot write that checkpoint: {exc}") from exc
    files = sorted(str(f.relative_to(folder)) for f in Path(folder).rglob("*") if f.is_file())
    return {"output": str(folder), "engine": args.engine, "files": files}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-reference":
            from .reference_check import run_cli

            return run_cli(args.engine, args.directory, args.stage, args.threads, sys.stdout)
        commands = {"say": cmd_say, "runtime": cmd_runtime, "doctor": cmd_doctor,
                    "tiny-checkpoint": cmd_tiny_checkpoint, "train": cmd_train}
        result = commands[args.command](args)
    except MizuotoError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":  # `python -m mizuoto_runtime` (`entry`) also sets the allocator first
    raise SystemExit(main())
