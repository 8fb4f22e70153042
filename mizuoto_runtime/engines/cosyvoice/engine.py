"""CosyVoice 2 (CosyVoice2-0.5B) and CosyVoice 3 (Fun-CosyVoice3-0.5B-2512) on our own model
code, run in phases by the memory runtime (issue 22; M1, M4, M18, M43, M45, M46, M53).

Components (each a registered handle) and phases:

* ``voice prompt`` — ``campplus`` (speaker embedding) and ``speech_tokenizer`` (prompt speech
  tokens), `oneshot` torch modules from the folder's ONNX files (`voice`), plus the prompt mel
  (computed where the audio is). Cached per reference (M4): the same voice again places
  neither. A speaker of ``spk2info.pt`` (an embedding, or a whole zero-shot prompt as
  upstream's ``add_zero_shot_spk`` saves it) needs no phase at all.
* ``talker`` — ``llm``: the Qwen2 LM with its speech embedding and decoder, a `sequence`
  handle whose units are its decoder layers (24 in the real model). Our token loop
  (`lm.generate`) with upstream's RAS sampling: the same random draws in the same order, so
  the same tokens under a seed. KV cache: ``compute.kv_cache = dynamic`` grows by
  concatenation; ``static`` uses `BufferCache` (M53). Its size is estimated at upstream's cap,
  20 speech tokens per text token, capped by ``max_new_tokens`` (M46).
* ``flow`` — ``flow``, `oneshot`: token embedding, CosyVoice 2's conformer encoder or
  CosyVoice 3's lookahead layer, then 10 Euler steps of the estimator (U-Net or DiT) on fixed
  noise; classifier-free guidance runs both halves as one batch of two through each unit, so
  each streamed unit is copied once per step (M18).
* ``vocoder`` — ``hift``, `oneshot`. No tiled fallback (M43): its source signal's phase is a
  running sum over every sample of the utterance, so tiles would not join.

Text (`text`): upstream's front end normalises the text and splits it into sentences
(``text_normalize(split=True)``); each sentence is one LM run, one flow and one vocoder call,
and the sentences' audio is joined end to end, as upstream's ``inference_*`` yields it. All
sentences run inside the same talker, flow and vocoder phases.

Random numbers. The talker seeds the global generator with the request's seed (inside a
`fork_rng`, so retries replay it, M40). CosyVoice 2's vocoder draws its source phases and
noise from the same generator after the LM's draws, as upstream's ``tts`` does: the talker
hands the generator's state on in its output, and the vocoder phase continues from it. The
result is upstream's ``CosyVoice2Model.tts`` output for the same seed (tested against the
reference data's end-to-end stage). Sentence *i* of a text starts from seed + *i* (the
runtime's rule for chunks), so each sentence replays on its own; upstream's one generator runs
on from sentence to sentence, so only the first sentence's draws are upstream's.

Sampling: upstream's RAS with the yaml's settings (top-p 0.8, top-k 25, window 10); the
request's seed and ``max_new_tokens`` apply, its temperature, top-k and top-p do not.

Modes (`encode_voice`): a ``spk2info`` speaker (upstream's sft mode, or a saved zero-shot
prompt); zero-shot (reference + transcript); cross-lingual (reference alone: no prompt in the
LM); instruct (CosyVoice 2's instruct2 / CosyVoice 3's instruction text: the instruction is the
LM prompt, ended by ``<|endofprompt|>``). CosyVoice 3 needs ``<|endofprompt|>`` in the LM's
text: where the user's prompt lacks it, upstream's documented system prompt
``You are a helpful assistant.<|endofprompt|>`` goes first.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from ...audio import Audio
from ...errors import CheckpointError, MizuotoError
from ...memory.phases import RequestContext
from ...nn.checkpoint import load_weights_only
from ...nn.decoder import KVCache
from ...nn.kv_cache import BufferCache, peak_bytes
from ...nn.loading import reading_weights
from ..base import (
    TYPICAL_REFERENCE_SECONDS,
    CheckpointInfo,
    Codes,
    Engine,
    PhaseEstimate,
    Sampling,
    SmallWeights,
    Voice,
    chunk_seed,
    element_size,
    typical_tokens,
)
from .checkpoint import CosyVoiceModel, detect_version, load_model
from .dit import DiT
from .lm import length_bounds
from .pipeline import SILENT_TOKENS, drop_silent, prompt_mel, speech_tokens
from .text import normalize, sentences
from .tokenizer import ENDOFPROMPT, TextTokenizer
from .voice import MAX_PROMPT_SECONDS, SPEAKER_RATE, load_campplus, load_speech_tokenizer, resample

log = logging.getLogger(__name__)

SPK2INFO = "spk2info.pt"
NO_FALLBACK = "none: HiFT's source phase runs through the whole utterance, so it cannot be tiled"
SYSTEM_PROMPT = "You are a helpful assistant." + ENDOFPROMPT  # CosyVoice 3's documented default
VOICE_FILES = {2: ("campplus.onnx", "speech_tokenizer_v2.onnx"), 3: ("campplus.onnx", "speech_tokenizer_v3.onnx")}
# Working-memory constants (M45, M46): each term follows the dimension it scales with; the
# counts are fitted on the tiny checkpoints' CPU peaks (`bench/engines.py --peaks`, 1.0-1.3x)
# and on the published LM's width (issue 35: one Qwen2-0.5B layer, 1.05-1.10x for 3-30 s voices,
# one or two sentences; with two MLP copies and 0.4 of the scores it read 0.83-0.88x there).
PREFILL_HIDDEN_COPIES = 4  # residual, normed input, attention output, q/k/v: x hidden size
PREFILL_MLP_COPIES = 3  # silu(gate), up and their product (`nn.feed_forward`): x intermediate size
# Part of a score matrix per head: torch's causal CPU attention works in blocks and keeps no
# whole matrix; a real LM (Qwen2-0.5B: hidden 896, intermediate 4864) is dominated by the MLP.
PREFILL_SCORE_FRACTION = 0.2
VOICE_FEATURE_BYTES_PER_SAMPLE = 72  # kaldi fbank, whisper log-mel, 24 kHz prompt mel: STFT frames per 16 kHz sample
TOKEN_SAMPLES = 640  # 16 kHz samples per speech token (25 Hz)
# A typical request's longest sentence (`typical_phases`): upstream's front end splits text
# into sentences, each its own LM run and flow call.
TYPICAL_SENTENCE_SECONDS = 10.0
# The voice prompt runs its stages one after another (CAM++ on its fbank, the tokenizer on its
# log-mel, the 24 kHz prompt mel), each freeing its activations before the next: its peak is the
# larger of the feature frames and the tokenizer's activations, not their sum (issue 35: the
# sum read 1.37-1.53x the published v3 tokenizer's CPU peak for 3-10 s; v2 hid it behind its
# 2 MiB rotary tables, `SpeechTokenizer.rotary_table_bytes`).
# The tokenizer's activations per 25 Hz token, as copies of its widest activation (the rows of
# its largest weight: the tiny graph's scores over its codebook; the published one's 4 x 1280
# MLP): the published encoder layer's attention keeps ~10.3 rows of its width (2.6 of the
# MLP's), fitted on one published-width layer for 1-30 s; 3 leaves 1.04-1.2x.
TOKENIZER_COPIES = 3
# The published tokenizer's attention scores (s3tokenizer's model: float32, heads x tokens^2, its
# eager path): the product and its masked copy, then the softmax beside it (fitted: 2.00 copies).
# A graph converted node by node (a file s3tokenizer cannot map, the tiny one) has no heads to count.
TOKENIZER_SCORE_COPIES = 2
UNET_COPIES = 20  # CosyVoice 2's UNet: live copies of its widest stage, per frame of the CFG batch
# CosyVoice 3's DiT, per frame of the CFG batch: live copies of its width, and its input (noisy
# mel, mu, speaker and prompt condition concatenated); sdpa keeps no score matrix, so no frames^2
# term. Fitted on the tiny (64) and the published (1024) width: 7.0 copies and the input; with
# 12 copies alone the published DiT read 1.61x its CPU peak (issue 35); now 1.13x, tiny 1.08-1.17x.
DIT_COPIES = 8
# HiFT's peak per mel frame: the NSF source at the output rate and each upsampling stage's
# channels x length. Fitted on the tiny (64 channels) and the published (512) width, where the
# stages dominate (issue 35: with 4 stage copies, 7 for CosyVoice 3, and 104 bytes a sample the
# published HiFT read 1.41x, CosyVoice 3's 2.01x, at every length; measured 2.5 and 2.7 stage
# copies, 118 and 151 bytes a sample). Now 1.07 / 1.16x (CosyVoice 2, tiny / published) and
# 1.05 / 1.10x (CosyVoice 3).
SOURCE_BYTES_PER_SAMPLE = 120  # the 9-harmonic NSF source at the output rate (float32), its live copies
CAUSAL_SOURCE_BYTES_PER_SAMPLE = 36  # CosyVoice 3's causal HiFT: its left-padded source and STFT input copies
VOCODER_STAGE_COPIES = 3  # live copies of an upsampling stage (input kept, resblock temporaries)


def read_speakers(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``spk2info.pt``: speaker name -> tensors: ``embedding`` (upstream's sft speakers), or a
    zero-shot voice as ``add_zero_shot_spk`` saves it (``flow_embedding``, ``prompt_text``,
    ``llm_prompt_speech_token``, ``flow_prompt_speech_token``, ``prompt_speech_feat`` ...).
    Weights only; an absent file is no speakers."""
    path = folder / SPK2INFO
    if not path.is_file():
        return {}
    data = load_weights_only(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CheckpointError(f"{path}: expected speaker name -> dict of tensors")
    bad = [name for name, info in data.items()
           if not isinstance(info.get("embedding", info.get("flow_embedding")), torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: speakers without an 'embedding' or 'flow_embedding' tensor: "
                              f"{', '.join(map(str, bad[:5]))}")
    return {str(k): v for k, v in data.items()}


def speaker_names(folder: Path) -> list[str]:
    try:
        return sorted(read_speakers(folder))
    except CheckpointError:
        return []


@dataclasses.dataclass(frozen=True)
class TalkerPlan:
    """The talker phase's sizes, from the request (M45, M46)."""

    prompt_positions: int
    tokens_at_most: int
    kv_kind: str

    @property
    def positions(self) -> int:
        return self.prompt_positions + self.tokens_at_most


class CosyVoiceEngine(Engine):
    """CosyVoice 2 / 3: speakers, zero-shot, cross-lingual and instruct; 24 kHz."""

    id = "cosyvoice"
    title = "CosyVoice"
    REQUIREMENTS = "cosyvoice"
    VERSIONS = ("2", "3")
    REFERENCE = "reference"
    PUBLISHED = "published"
    # The LM (Qwen2) is where the bytes are; the flow and the HiFT vocoder (weight-normed) keep
    # their weights as published (issue 36).
    WEIGHTS = {"generate": SmallWeights(("llm",))}
    sample_rate = 24000

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        """A published CosyVoice 2 or 3 folder (its yaml, the three state_dicts and
        CosyVoice-BlankEN), labelled by version, with the speakers of its ``spk2info.pt``."""
        try:
            version = detect_version(folder)
        except CheckpointError:
            return None
        if not all((folder / f).is_file() for f in ("llm.pt", "flow.pt", "hift.pt")) or \
                not (folder / "CosyVoice-BlankEN" / "config.json").is_file():
            return None
        return CheckpointInfo(f"CosyVoice{version}", speaker_names(folder), ["auto"])

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if self.model_dir is None:
            raise CheckpointError("cosyvoice needs a checkpoint folder (the layout of FunAudioLLM/CosyVoice2-0.5B "
                                  "or Fun-CosyVoice3-0.5B-2512)")
        if not self.model_dir.is_dir():
            raise CheckpointError(f"CosyVoice checkpoint folder not found: {self.model_dir}")
        self.model: CosyVoiceModel = load_model(self.model_dir, dtype=dtype)
        self.version = self.model.version
        self.sample_rate = self.model.sample_rate
        # A shapes-only build (engines.published) has the configs alone: no tokenizer files.
        self.tokenizer = TextTokenizer(self.model.blank_en, self.version) if reading_weights() else None
        self.speakers = read_speakers(self.model_dir)
        self.campplus = self.speech_tokenizer = None
        self.no_cloning = ""  # why reference audio cannot be cloned (empty: it can)
        files = [self.model_dir / f for f in VOICE_FILES[self.version]]
        missing = [f.name for f in files if not f.is_file()]
        if missing:  # speakers of spk2info.pt need neither file
            self.no_cloning = f"the checkpoint folder lacks {', '.join(missing)}"
        else:
            try:
                campplus, tokenizer = load_campplus(files[0]), load_speech_tokenizer(files[1])
            except ImportError as exc:
                self.no_cloning = f"{exc.name} is not installed (requirements/cosyvoice.txt)"
                log.warning("cosyvoice: cloning from reference audio is off: %s", self.no_cloning)
            else:
                self.campplus = self.register(campplus, "campplus")
                self.speech_tokenizer = self.register(tokenizer, "speech_tokenizer")
        self.llm = self.register(self.model.lm, "llm", kind="sequence")
        self.flow = self.register(self.model.flow, "flow")
        self.vocoder = self.register(self.model.hift, "vocoder")

    def handles(self) -> list[Any]:
        voice = [h for h in (self.campplus, self.speech_tokenizer) if h is not None]
        return [*voice, self.llm, self.flow, self.vocoder]

    # ---- voice prompt ----------------------------------------------------------------------
    def encode_voice(self, ctx: RequestContext, reference: Audio | None, transcript: str | None,
                     speaker: str | None, instruct: str | None = None) -> dict[str, Any]:
        """The voice's tensors: ``embedding`` (1, 192); for the flow's prompt ``prompt_token``
        and ``prompt_feat``; for the LM ``llm_prompt_text`` ids and ``llm_prompt_token``."""
        if speaker and reference is not None:
            raise MizuotoError("cosyvoice: give a built-in speaker or reference audio, not both")
        if speaker:
            data = self._speaker(speaker)
        elif reference is not None:
            data = self._reference(ctx, reference)
            if (transcript or "").strip() and not instruct:  # zero-shot; else cross-lingual
                data["llm_prompt_text"] = self._ids(self._lm_prompt(normalize(transcript or "")))
                data["llm_prompt_token"] = data["prompt_token"]
        else:
            raise MizuotoError("cosyvoice needs a voice: a built-in speaker "
                               f"({', '.join(sorted(self.speakers)) or 'this folder has none'}) or reference audio")
        if instruct:
            data["llm_prompt_text"] = self._ids(self._instruction(instruct))
            data["llm_prompt_token"] = torch.zeros(1, 0, dtype=torch.int32)
        return data

    def _speaker(self, name: str) -> dict[str, Any]:
        if name not in self.speakers:
            raise MizuotoError(f"cosyvoice: no speaker {name!r} in {self.model_dir / SPK2INFO} "
                               f"(it has: {', '.join(sorted(self.speakers)) or 'none'})")
        info = self.speakers[name]
        embedding = info.get("flow_embedding", info.get("embedding"))
        data: dict[str, Any] = {"embedding": embedding.reshape(1, -1).float()}
        if "flow_prompt_speech_token" in info and "prompt_speech_feat" in info:  # a saved zero-shot voice
            data["prompt_token"] = info["flow_prompt_speech_token"].to(torch.int32).reshape(1, -1)
            data["prompt_feat"] = info["prompt_speech_feat"].float().reshape(1, -1, 80)
            if "prompt_text" in info:
                data["llm_prompt_text"] = info["prompt_text"].to(torch.int64).reshape(1, -1)
                data["llm_prompt_token"] = info.get("llm_prompt_speech_token", data["prompt_token"]).to(
                    torch.int32).reshape(1, -1)
        return data

    def _reference(self, ctx: RequestContext, reference: Audio) -> dict[str, Any]:
        """The voice-prompt phase: CAM++ embedding and speech tokens of the 16 kHz audio, the
        prompt mel of the 24 kHz audio, tokens and mel cut to 2 mel frames per token (upstream's
        ``frontend_zero_shot``)."""
        if self.campplus is None or self.speech_tokenizer is None:
            raise MizuotoError(f"cosyvoice: cannot clone from reference audio: {self.no_cloning}; "
                               f"use a speaker saved in {SPK2INFO}")
        if reference.seconds > MAX_PROMPT_SECONDS:
            raise MizuotoError(f"cosyvoice: the reference audio is {reference.seconds:.1f} s; the speech tokenizer "
                               f"takes at most {MAX_PROMPT_SECONDS} s")
        wav = reference.mono().unsqueeze(0)
        wav16, wav24 = resample(wav, reference.sample_rate, SPEAKER_RATE), resample(wav, reference.sample_rate, 24000)
        campplus, tokenizer = self.campplus.module, self.speech_tokenizer.module

        @torch.inference_mode()
        def run() -> dict[str, Any]:
            embedding = campplus(wav16.to(self.device)).float().cpu()
            tokens = tokenizer(wav16.to(self.device)).cpu()
            feat = self.prompt_feat(wav24)
            n = min(feat.shape[1] // 2, tokens.shape[1])
            return {"embedding": embedding, "prompt_token": tokens[:, :n], "prompt_feat": feat[:, :2 * n]}

        memory = self.voice_prompt_memory(wav16.shape[-1])
        return ctx.run("voice prompt", [self.campplus, self.speech_tokenizer], run, memory)

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the voice prompt at `samples` 16 kHz samples: the larger of its feature frames
        and its tokenizer's activations (its widest activation, the rows of its largest weight,
        per speech token; its attention scores, `TOKENIZER_SCORE_COPIES`; its rotary tables)."""
        assert self.speech_tokenizer is not None
        tokenizer = self.speech_tokenizer.module
        widest = max((p.shape[0] for p in tokenizer.parameters() if p.dim() >= 2), default=0)
        tokens = samples // TOKEN_SAMPLES + 1
        scores = TOKENIZER_SCORE_COPIES * 4 * tokenizer.attention_heads * tokens * tokens
        activations = TOKENIZER_COPIES * 4 * widest * tokens + scores + tokenizer.rotary_table_bytes
        return max(VOICE_FEATURE_BYTES_PER_SAMPLE * samples, activations)

    def prompt_feat(self, wav24k: torch.Tensor) -> torch.Tensor:
        """The prompt mel (1, frames, 80) of a 24 kHz waveform (the yaml's feat_extractor)."""
        return prompt_mel(wav24k, self.model.mel)

    def _lm_prompt(self, transcript: str) -> str:
        if self.version == 3 and ENDOFPROMPT not in transcript:
            return SYSTEM_PROMPT + transcript
        return transcript

    def _instruction(self, instruct: str) -> str:
        if ENDOFPROMPT in instruct:
            return instruct
        if self.version == 3:
            return f"You are a helpful assistant. {instruct}{ENDOFPROMPT}"
        return instruct + ENDOFPROMPT

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor([self.tokenizer.encode(text)], dtype=torch.int64)

    # ---- talker ----------------------------------------------------------------------------
    def sentences(self, text: str) -> list[str]:
        """`text` normalised and split as upstream's front end does (`text.sentences`), non-Chinese
        text measured in LM tokens."""
        found = sentences(text, lambda s: len(self.tokenizer.encode(s)))
        if not found:
            raise MizuotoError(f"cosyvoice: nothing to speak in {text[:40]!r}: it is punctuation only")
        return found

    def text_ids(self, text: str, voice: Voice) -> torch.Tensor:
        """The ids of the whole text, normalised as upstream does (`text.normalize`), unsplit."""
        return self.sentence_ids(normalize(text), voice)

    def sentence_ids(self, sentence: str, voice: Voice) -> torch.Tensor:
        """The ids of one normalised sentence. CosyVoice 3 needs ``<|endofprompt|>`` in its text
        or prompt: a voice without an LM prompt gets the system prompt before the text."""
        prompt = voice.data.get("llm_prompt_text")
        text = sentence
        if self.version == 3 and prompt is None and ENDOFPROMPT not in text:
            text = SYSTEM_PROMPT + text
        return self._ids(text)

    def plan(self, text: torch.Tensor, voice: Voice, max_new_tokens: int) -> TalkerPlan:
        prompt_text = voice.data.get("llm_prompt_text")
        prompt_token = voice.data.get("llm_prompt_token")
        prompt = 2 + text.shape[1] + (prompt_text.shape[1] if prompt_text is not None else 0) + \
            (prompt_token.shape[1] if prompt_token is not None else 0)
        _, cap = length_bounds(text.shape[1])
        return TalkerPlan(prompt, max(1, min(cap, max_new_tokens)), self.manager.policy.kv_cache)

    def talker_memory(self, plan: TalkerPlan) -> dict[str, int]:
        """M45/M46: the KV cache at the plan's positions (static: `BufferCache`'s doubling
        buffers), the prefill's activations (hidden states, MLP, attention scores per head) and
        the logits."""
        cfg, lm = self.model.lm.spec.decoder, self.model.lm
        elem = element_size(self.dtype)
        position = 2 * cfg.num_key_value_heads * cfg.dim_head * elem
        kind = "static" if plan.kv_kind == "static" else "dynamic"
        kv = peak_bytes(position, cfg.num_hidden_layers, plan.positions, kind)
        t = plan.prompt_positions
        activations = int(elem * t * (PREFILL_HIDDEN_COPIES * cfg.hidden_size + PREFILL_MLP_COPIES
                                      * cfg.intermediate_size + PREFILL_SCORE_FRACTION * cfg.num_attention_heads * t))
        logits = 4 * 3 * lm.llm_decoder.out_features
        return {"kv_cache": kv, "activations": activations, "logits": logits}

    def generate(self, ctx: RequestContext, text: str, voice: Voice, sampling: Sampling) -> Codes:
        """Speech tokens of each sentence (`sentences`), one LM run each, in one talker phase.
        The codes hold them end to end; ``extra["sentences"]`` has each one's length and the
        generator state its vocoder continues from."""
        data = voice.data
        all_ids = [self.sentence_ids(s, voice) for s in self.sentences(text)]
        plans = [self.plan(ids, voice, sampling.max_new_tokens) for ids in all_ids]
        largest = max(plans, key=lambda p: p.positions)  # one sentence's cache is live at a time
        parts = self.talker_memory(largest)
        ctx.report.add_phase("talker", kv_positions=largest.positions,
                             tokens_at_most=sum(p.tokens_at_most for p in plans), sentences=len(plans),
                             **{f"{k}_mb": round(v / 2**20, 3) for k, v in parts.items()})
        prompt_text = data.get("llm_prompt_text", torch.zeros(1, 0, dtype=torch.int64)).to(self.device)
        prompt_token = data.get("llm_prompt_token", torch.zeros(1, 0, dtype=torch.int32)).to(self.device)
        count, total = [0], sum(p.tokens_at_most for p in plans)

        def tick(_token: int) -> None:
            count[0] += 1
            ctx.progress(count[0], total)

        @torch.inference_mode()
        def run() -> list[tuple[list[int], torch.Tensor]]:
            count[0] = 0  # a retry after OOM starts over
            out = []
            for index, (ids, plan) in enumerate(zip(all_ids, plans)):
                cache = BufferCache(min_capacity=plan.positions) if plan.kv_kind == "static" else KVCache()
                with self.seeded(chunk_seed(sampling.seed, index)):
                    gen = speech_tokens(self.model, ids.to(self.device), prompt_text, prompt_token.to(torch.int64),
                                        cache=cache, max_new_tokens=plan.tokens_at_most, on_token=tick)
                    state = self.rng_state()  # its vocoder continues from here (module docstring)
                out.append((drop_silent(gen.tokens, SILENT_TOKENS[self.version]), state))
            return out

        runs = ctx.run("talker", [self.llm], run, sum(parts.values()))
        ctx.applied.update(kv_cache=largest.kv_kind)
        runs = [(tokens, rng) for tokens, rng in runs if tokens]
        if not runs:
            raise MizuotoError("cosyvoice: the LM produced no speech tokens for this text")
        tokens = torch.tensor([[t for part, _ in runs for t in part]], dtype=torch.int32)
        return Codes(tokens, self.id, {"sentences": [(len(part), rng) for part, rng in runs], "voice": data})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference with its transcript (its speech tokens and text in the LM
        prompt, its tokens and mel in the flow's), the text in sentences of at most
        `TYPICAL_SENTENCE_SECONDS` (upstream's front end splits it; one sentence is live at a
        time). The voice prompt is there where the folder has its two ONNX files."""
        sentence = min(seconds, TYPICAL_SENTENCE_SECONDS)
        ref_tokens = int(TYPICAL_REFERENCE_SECONDS * self.sample_rate / self.model.mel.hop_size
                         / self.model.flow.token_mel_ratio)
        tokens = int(sentence * ref_tokens / TYPICAL_REFERENCE_SECONDS)  # speech tokens at the same rate
        text = typical_tokens(sentence)
        _, cap = length_bounds(text)
        plan = TalkerPlan(2 + text + typical_tokens(TYPICAL_REFERENCE_SECONDS) + ref_tokens, cap,
                          self.manager.policy.kv_cache)
        mel_frames = (tokens + ref_tokens) * self.model.flow.token_mel_ratio
        phases = []
        if self.campplus is not None and self.speech_tokenizer is not None:
            samples = int(TYPICAL_REFERENCE_SECONDS * SPEAKER_RATE)
            phases.append(PhaseEstimate("voice prompt", (self.campplus, self.speech_tokenizer),
                                        self.voice_prompt_memory(samples)))
        return phases + [
            PhaseEstimate("talker", (self.llm,), sum(self.talker_memory(plan).values())),
            PhaseEstimate("flow", (self.flow,), self.flow_memory(mel_frames)),
            PhaseEstimate("vocoder", (self.vocoder,), self.vocoder_memory(tokens * self.model.flow.token_mel_ratio)),
        ]

    # ---- flow + vocoder --------------------------------------------------------------------
    def flow_memory(self, frames: int) -> int:
        """M45: the flow phase at `frames` mel frames (prompt + new): the CFG batch of two
        through the estimator's widest stage, the UNet's attention scores (the DiT's sdpa keeps
        none), and the Euler state (8 mel-sized tensors)."""
        est = self.model.flow.decoder.estimator
        elem = element_size(self.dtype)
        if isinstance(est, DiT):
            spec = est.spec
            per_frame = DIT_COPIES * spec.dim + 2 * spec.mel_dim + spec.mu_dim + spec.spk_dim
        else:
            per_frame = UNET_COPIES * max(est.spec.channels) + 2 * est.spec.num_heads * frames
        return int(2 * frames * elem * per_frame + 8 * frames * 80 * elem)

    def vocoder_memory(self, frames: int) -> int:
        """M45: HiFT at `frames` mel frames (float32): the NSF source at the output rate, and
        each upsampling stage's channels x length."""
        spec = self.model.hift.spec
        samples = frames * spec.upsample_scale
        stages, length = 0, frames
        for i, rate in enumerate(spec.upsample_rates):
            length *= rate
            stages += (spec.base_channels // 2 ** (i + 1)) * length
        per_sample = SOURCE_BYTES_PER_SAMPLE + (CAUSAL_SOURCE_BYTES_PER_SAMPLE if spec.causal else 0)
        return samples * per_sample + 4 * VOCODER_STAGE_COPIES * stages

    def decode(self, ctx: RequestContext, codes: Codes, allow_fallback: bool | None = None) -> Audio:
        """Each sentence's tokens through the flow (one phase), each mel through HiFT from its
        sentence's generator state (one phase); the waveforms end to end."""
        data = codes.extra["voice"]
        lengths, states = zip(*codes.extra["sentences"])
        parts = torch.split(codes.tokens.to(torch.int32), list(lengths), dim=1)
        prompt_token = data.get("prompt_token", torch.zeros(1, 0, dtype=torch.int32)).to(torch.int32)
        prompt_feat = data.get("prompt_feat", torch.zeros(1, 0, 80))
        embedding = data["embedding"]
        frames = (max(lengths) + prompt_token.shape[1]) * self.model.flow.token_mel_ratio
        steps = self.model.flow.decoder.n_timesteps

        @torch.inference_mode()
        def flow() -> list[torch.Tensor]:
            dev = self.device
            with self.progress_per_call(ctx, self.model.flow.decoder.estimator, steps * len(parts)):
                return [self.model.flow(tokens.to(dev), prompt_token.to(dev), prompt_feat.to(dev, self.dtype),
                                        embedding.to(dev, self.dtype)).cpu() for tokens in parts]

        mels = ctx.run("flow", [self.flow], flow, self.flow_memory(frames))

        @torch.inference_mode()
        def vocode() -> torch.Tensor:
            waves = []
            for mel, state in zip(mels, states):
                with self.seeded(0):
                    self.set_rng_state(state)
                    wav, _, _ = self.model.hift(mel.to(self.device, self.dtype))
                waves.append(wav.float().cpu())
            return torch.cat(waves, dim=-1)

        ctx.applied["vocoder_fallback"] = NO_FALLBACK  # meta.applied: what the report shows
        wav = ctx.run("vocoder", [self.vocoder], vocode, self.vocoder_memory(max(m.shape[-1] for m in mels)))
        return Audio(wav, self.sample_rate)

