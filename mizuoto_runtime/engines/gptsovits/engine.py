"""GPT-SoVITS v2 / v2Pro / v2ProPlus on our own model code, run in phases by the memory runtime.

Components (each a handle) and phases (M1):

* ``voice prompt`` — ``hubert`` (transformers HubertModel, `oneshot`) on the 16 kHz reference
  with 0.3 s of silence appended (as upstream's TTS does), then ``vits``' SSL projection and
  quantizer → the prompt's semantic codes; the 32 kHz reference's linear spectrogram (for the
  reference encoder); v2Pro: ``sv`` (ERes2NetV2, `oneshot`) on its 80-bin kaldi fbank → the
  speaker embedding. Cached per voice (M4), and per voice pair: switching the pair forgets them
  (the codes come from that pair's quantizer).
* ``talker`` — ``t2s``, a `sequence` handle whose units are the decoder's blocks (24 for the
  published model, M11/M12); its attention's raw ``in_proj_weight`` streams (M13, see `t2s`).
  Working memory: the KV cache at 16 positions per phoneme (M46) capped by ``max_new_tokens``,
  ``[B, T, D]`` keys and values per layer in the run dtype, plus a step's activations.
* ``bert`` — ``bert`` (chinese-roberta, transformers ``BertModel``, `oneshot`), per request: the
  features of the Chinese runs of the prompt's transcript and the target text (`bert`); other
  languages get zeros, and a request without Chinese places nothing.
* ``g2pw`` — ``g2pw`` (the user's ``G2PWModel/g2pW.onnx`` as a torch module, `oneshot`), per
  request, before ``bert``: the Chinese polyphones of the texts (`text.g2pw`). Without the folder
  pypinyin reads them, the log says so once, and ``meta.applied.chinese_polyphones`` names the reason.
* ``decoder`` — ``vits`` (`oneshot`): codes → waveform with upstream's one noise draw.

Randomness (M40): upstream draws its sampling noise (one Exp(1) tensor per step) and the VITS
noise (one ``randn_like``) from torch's global RNG; each phase seeds it inside `Engine.seeded`,
so a retried phase and every placement draw the same numbers.

A voice is a pair of weights (M28). `use_pair` switches to another pair: a pair of the same
architecture (same T2S and SoVITS configs) goes through ``handle.replace`` — nothing is
re-registered and the host copies are the new ones; a different architecture or version
re-registers the component.

Text. `text.phonemize` (offline G2P for Chinese, English and Japanese; language runs decided
with the user's ``pretrained_models/fast_langdetect/lid.176.bin`` where found, see
`text.segment`) gives the phoneme ids of the reference's transcript and of the target; the
``bert`` phase adds their features. Callers may give ids and features themselves (`PhonemeText`).
``meta.applied.language_runs`` names the language model that cut the text, and
``meta.applied.english_homographs`` how English homographs were read (`text.english`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...audio import Audio
from ...errors import ArgumentError, CheckpointError
from ...nn.features import kaldi_fbank
from ...nn.kv_cache import peak_bytes
from ...nn.loading import reading_weights
from ..base import (
    TYPICAL_CHARS_PER_SECOND,
    TYPICAL_REFERENCE_SECONDS,
    CheckpointInfo,
    Codes,
    Engine,
    PhaseEstimate,
    Sampling,
    SmallWeights,
    Voice,
    element_size,
)
from ..checkpoint_files import cache_root
from . import bert as bert_features
from .checkpoint import (
    HUBERT_FOLDER,
    SUPPORTED,
    SV_FILE,
    VoicePair,
    build_sv,
    build_t2s,
    build_vits,
    find_aux,
    pair_in,
    read_gpt,
    read_sovits,
    read_sv_state,
    require_pair,
    sovits_version_hint,
    voice_files,
)
from .spectrogram import spectrogram
from .t2s import Text2Semantic
from .text import Run, english, g2pw, phonemize, segment
from .text.chinese import PINYIN_SOURCE
from .text.segment import LANGUAGES
from .vits import Synthesizer

log = logging.getLogger(__name__)

SSL_RATE = 16000
PROMPT_SILENCE_S = 0.3
POSITIONS_PER_PHONEME = 16  # M46
EARLY_STOP_PER_SECOND = 50  # upstream stops after 50 Hz x max_sec tokens
# Working-memory constants (M45), fitted on the tiny voice's CPU peaks (`bench/engines.py
# --peaks`, 1.0-1.3x); each multiplies the dimension its term scales with.
# HuBERT's first conv (channels / stride per input sample: its output and its group norm's) is the
# voice prompt's peak at the published 512 channels (measured 2.0 copies); the transformer after
# it, 768 wide at 50 Hz, holds `SSL_HIDDEN_COPIES` hidden states (what the tiny model's 32
# channels leave as its peak).
SSL_CONV_COPIES = 2
SSL_HIDDEN_COPIES = 4
# The VITS generator's widest upsampling stage per mel frame (its input kept, the resblocks'
# outputs summed): real voices (512 initial channels) and the tiny one alike.
DECODER_STAGE_COPIES = 5


@dataclasses.dataclass(frozen=True)
class PhonemeText:
    """Text already turned into the model's inputs: v2 phoneme ids and BERT features
    ``[1024, len(ids)]`` (zeros for languages upstream gives none: all but Chinese)."""

    ids: tuple[int, ...]
    bert: torch.Tensor | None = None

    def features(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([list(self.ids)], dtype=torch.long)
        bert = self.bert if self.bert is not None else torch.zeros(1024, len(self.ids))
        if tuple(bert.shape) != (1024, len(self.ids)):
            raise ArgumentError(f"BERT features must be [1024, {len(self.ids)}], got {tuple(bert.shape)}")
        return ids, bert.to(dtype)


class GptSovitsEngine(Engine):
    id = "gptsovits"
    title = "GPT-SoVITS"
    REQUIREMENTS = "gptsovits"
    UPSTREAM = "jieba"  # its text frontend's
    VERSIONS = ("v2", "v2pro")
    REFERENCE = "reference"
    PUBLISHED = "published"
    PHASED = True
    # The GPT (t2s) is the talker (issue 36): its Linear layers are stored small, its attention's
    # raw q/k/v weight stays as published; SoVITS (weight-normed), HuBERT, SV and BERT as well.
    WEIGHTS = {"generate": SmallWeights(("t2s",))}

    @classmethod
    def describe_checkpoint(cls, folder: Path) -> CheckpointInfo | None:
        pair = pair_in(folder)
        if pair is None:
            return None
        try:
            _, version = sovits_version_hint(pair.sovits)
        except (CheckpointError, OSError):
            return None
        if version is not None and version not in SUPPORTED:
            return None  # v3 / v4: not run by this engine
        return CheckpointInfo(f"GPT-SoVITS {version or 'v2'}", languages=list(LANGUAGES))

    @classmethod
    def checkpoint_entries(cls, folder: Path) -> list[tuple[str, CheckpointInfo]]:
        """A folder with one pair, or each ``.pth`` of a folder of several that has its GPT."""
        files = voice_files(folder)
        if not files:
            return super().checkpoint_entries(folder)
        described = ((f.name, cls.describe_checkpoint(f)) for f in files)
        return [(name, info) for name, info in described if info is not None]

    def __init__(self, manager: Any, model_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None, *, pair: VoicePair | None = None) -> None:
        super().__init__(manager, model_dir, dtype, device)
        if pair is None:
            if self.model_dir is None:
                raise CheckpointError("GPT-SoVITS needs a voice: a folder with a GPT (.ckpt) and a SoVITS (.pth) file")
            pair = require_pair(self.model_dir)
        self.pair = pair
        t2s, vits = self._read(pair)
        self.sample_rate = vits.cfg.sampling_rate
        self.t2s = self.register(t2s, "t2s", kind="sequence")
        self.vits = self.register(vits, "vits")
        self.hubert = self._optional_hubert(pair)
        self.sv = self._optional_sv(pair) if vits.cfg.is_pro else None
        self.bert, self.tokenizer = self._optional_bert(pair)
        self.g2pw, self.g2pw_tables, self.polyphone_source = self._optional_g2pw(pair)

    # ---- loading ------------------------------------------------------------------------------
    def _read(self, pair: VoicePair) -> tuple[Text2Semantic, Synthesizer]:
        return build_t2s(read_gpt(pair.gpt), self.dtype), build_vits(read_sovits(pair.sovits), self.dtype)

    def _optional_hubert(self, pair: VoicePair) -> Any:
        folder = find_aux(pair.sovits.parent, HUBERT_FOLDER)
        if folder is None:
            return None
        from transformers import HubertConfig, HubertModel

        try:
            if reading_weights():
                model = HubertModel.from_pretrained(str(folder), local_files_only=True, dtype=self.dtype)
            else:  # a shapes-only build (engines.published): the folder's config alone
                model = HubertModel(HubertConfig.from_pretrained(str(folder))).to(self.dtype)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{folder}: not a HubertModel folder ({exc})") from exc
        return self.register(model.eval(), "hubert")

    def _optional_sv(self, pair: VoicePair) -> Any:
        path = find_aux(pair.sovits.parent, SV_FILE)
        if path is None:
            return None
        return self.register(build_sv(read_sv_state(path), path, self.dtype), "sv")

    def _optional_bert(self, pair: VoicePair) -> tuple[Any, Any]:
        folder = find_aux(pair.sovits.parent, bert_features.BERT_FOLDER)
        if folder is None:
            return None, None
        model, tokenizer = bert_features.load_bert(folder, self.dtype)
        return self.register(model, "bert"), tokenizer

    def _optional_g2pw(self, pair: VoicePair) -> tuple[Any, g2pw.Tables | None, str]:
        """g2pW from the user's ``G2PWModel`` folder (`g2pw.PLACES`), with what reads Chinese
        polyphones for `meta.applied`; without it, or with a file missing or unreadable there,
        pypinyin does, said once per reason in the log."""
        folder = g2pw.find_folder(pair.sovits.parent)
        lacking = g2pw.missing(folder) if folder is not None else \
            f"no {g2pw.FOLDER} folder beside the voice or up to two folders above it ({', '.join(g2pw.PLACES)})"
        if lacking is None and folder is not None:
            try:
                tables, net = g2pw.read_tables(folder), g2pw.load_net(folder, cache_root() / g2pw.CACHE_FOLDER)
                return self.register(net, "g2pw"), tables, f"g2pW ({folder})"
            except CheckpointError as exc:  # a file the converter or the tables cannot read: the voice still speaks
                lacking = str(exc)
        source = f"{PINYIN_SOURCE}: {lacking}"
        _note_polyphone_source(source)
        return None, None, source

    def polyphones(self, ctx: Any) -> g2pw.Polyphones | None:
        """g2pW's readings for the frontend, its network run in the ``g2pw`` phase (None: pypinyin)."""
        ctx.applied["chinese_polyphones"] = self.polyphone_source
        if self.g2pw is None or self.tokenizer is None:
            return None  # without the BERT folder Chinese text stops at the BERT phase, naming it
        net, tables = self.g2pw.module, self.g2pw_tables
        assert tables is not None

        def predict(batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
            tokens = max(b["input_ids"].shape[1] for b in batches)
            queries = max(b["char_ids"].shape[0] for b in batches)

            @torch.inference_mode()
            def run() -> list[torch.Tensor]:
                return [net({k: v.to(self.device) for k, v in b.items()}).float().cpu() for b in batches]

            return ctx.run("g2pw", [self.g2pw], run, g2pw.memory(net, tokens, queries, len(tables.labels)))

        return g2pw.Polyphones(tables, self.tokenizer, predict)

    def handles(self) -> list[Any]:
        return [h for h in (self.t2s, self.vits, self.hubert, self.sv, self.bert, self.g2pw) if h is not None]

    def use_pair(self, pair: VoicePair) -> None:
        """M28: switch to another voice pair between requests. The same architecture goes
        through ``handle.replace``; another one re-registers the component."""
        t2s, vits = self._read(pair)
        self.t2s = self._swap(self.t2s, t2s, "t2s", "sequence", t2s.cfg == self.t2s.module.cfg)
        same_vits = vits.cfg == self.vits.module.cfg
        self.vits = self._swap(self.vits, vits, "vits", "oneshot", same_vits)
        if vits.cfg.is_pro and self.sv is None:
            self.sv = self._optional_sv(pair)
        self.sample_rate = vits.cfg.sampling_rate
        self.pair = pair
        self.voices.clear()  # prompt codes came from the old pair's quantizer

    def _swap(self, handle: Any, module: nn.Module, name: str, kind: str, same: bool) -> Any:
        if same:
            handle.replace(module)
            return handle
        self.manager.unregister(handle)
        return self.register(module, name, kind=kind)  # type: ignore[arg-type]

    # ---- voice prompt ----------------------------------------------------------------------------
    def encode_voice(self, ctx: Any, reference: Audio | None, transcript: str | None, speaker: str | None,
                     instruct: str | None = None) -> dict[str, Any]:
        if reference is None:
            raise ArgumentError("GPT-SoVITS clones a reference: give reference audio (3 to 10 s)")
        if self.hubert is None:
            raise CheckpointError(f"{self.pair.sovits.parent}: no {HUBERT_FOLDER}/ folder beside the voice or above it "
                                  f"(the feature model a reference needs)")
        if self.vits.module.cfg.is_pro and self.sv is None:
            raise CheckpointError(f"{self.pair.sovits.parent}: no {SV_FILE} beside the voice or above it "
                                  f"(the speaker model v2Pro needs)")
        cfg = self.vits.module.cfg
        wav32 = _resampled(reference, cfg.sampling_rate)
        peak = float(wav32.abs().max())
        if peak > 1:
            wav32 = wav32 / min(2.0, peak)
        spec = spectrogram(wav32.unsqueeze(0), cfg.filter_length, cfg.hop_length, cfg.win_length).to(self.dtype)
        wav16 = _resampled(reference, SSL_RATE)
        silence = torch.zeros(int(cfg.sampling_rate * PROMPT_SILENCE_S))
        ssl_in = torch.cat([wav16, silence]).unsqueeze(0).to(self.dtype)
        handles = [self.hubert, self.vits] + ([self.sv] if self.sv is not None else [])
        memory = self.voice_prompt_memory(ssl_in.shape[-1])

        @torch.inference_mode()
        def encode() -> dict[str, Any]:
            ssl = self.hubert.module(ssl_in)["last_hidden_state"].transpose(1, 2)
            codes = self.vits.module.extract_latent(ssl)
            data: dict[str, Any] = {"prompt": codes[0], "spec": spec, "sv": None, "text": transcript}
            if self.sv is not None:
                wav16k_of_32k = _resample(wav32, cfg.sampling_rate, SSL_RATE)
                fbank = kaldi_fbank(wav16k_of_32k.unsqueeze(0), num_mel_bins=80, sample_frequency=SSL_RATE)
                data["sv"] = self.sv.module(fbank.unsqueeze(0).to(self.dtype))
            return data

        return ctx.run("voice prompt", handles, encode, memory)

    def voice_prompt_memory(self, samples: int) -> int:
        """M45: the SSL encoder's first conv feature maps over the 16 kHz samples, and its
        transformer's hidden states over its frames (one per `conv_stride`'s product of samples)."""
        assert self.hubert is not None
        cfg = self.hubert.module.config
        conv = SSL_CONV_COPIES * cfg.conv_dim[0] * samples // cfg.conv_stride[0]
        hidden = SSL_HIDDEN_COPIES * cfg.hidden_size * (samples // math.prod(cfg.conv_stride))
        return (conv + hidden) * element_size(self.dtype)

    # ---- talker ------------------------------------------------------------------------------
    def text_features(self, ctx: Any, texts: list[list[Run]]) -> list[PhonemeText]:
        """The ``bert`` phase: each text's ids with its features (zeros but for Chinese runs)."""
        chinese = [r for runs in texts for r in runs if r.language == "zh"]
        if chinese and self.bert is None:
            raise CheckpointError(f"{self.pair.sovits.parent}: no {bert_features.BERT_FOLDER}/ folder beside the "
                                  "voice or above it (the BERT model Chinese text needs)")
        inputs = {id(r): bert_features.tokens(self.tokenizer, r.text) for r in chinese}
        found: dict[int, torch.Tensor] = {}
        if chinese:
            longest = max(len(r.text) for r in chinese)
            model = self.bert.module

            @torch.inference_mode()
            def run() -> dict[int, torch.Tensor]:
                return {id(r): bert_features.features(model, inputs[id(r)], r.word2ph or ()) for r in chinese}

            found = ctx.run("bert", [self.bert], run, bert_features.memory(model, longest, self.dtype))
        out = []
        for runs in texts:
            ids = tuple(i for r in runs for i in r.ids)
            parts = [found.get(id(r), torch.zeros(bert_features.FEATURES, len(r.phones))) for r in runs]
            out.append(PhonemeText(ids, torch.cat(parts, dim=1) if parts else torch.zeros(bert_features.FEATURES, 0)))
        return out

    def texts(self, ctx: Any, text: str, voice: Voice, language: str | None,
              target: PhonemeText | None, prompt_text: PhonemeText | None) -> tuple[PhonemeText, PhonemeText]:
        """The prompt transcript's and the target's inputs: as given, or from the frontend."""
        if target is not None and prompt_text is not None:
            return prompt_text, target
        transcript = voice.data.get("text") or ""
        if prompt_text is None and not transcript.strip():
            raise ArgumentError("GPT-SoVITS needs the reference's transcript (what is said in it)")
        polyphones = self.polyphones(ctx)
        model = find_aux(self.pair.sovits.parent, segment.LANGUAGE_MODEL)  # upstream's full language model
        ctx.applied["language_runs"] = segment.model_source(model)
        wanted = [phonemize(transcript, None, target=False, polyphones=polyphones, language_model=model)
                  if prompt_text is None else [],
                  phonemize(text, language, polyphones=polyphones, language_model=model) if target is None else []]
        if any(r.language == "en" for runs in wanted for r in runs):
            ctx.applied["english_homographs"] = english.homograph_source()
        made = self.text_features(ctx, wanted)
        return prompt_text or made[0], target or made[1]

    def talker_memory(self, positions: int, prompt_len: int) -> int:
        """M45/M46: the growing KV cache's peak plus the prompt pass's activations, with one
        layer's q/k/v projection beside the k and v copied out of it (`Text2Semantic.run_prompt`)."""
        cfg = self.t2s.module.cfg
        e = element_size(self.dtype)
        cache = peak_bytes(2 * cfg.hidden_dim * e, cfg.n_layer, positions)
        activations = (prompt_len * prompt_len * cfg.head + (8 + 3) * prompt_len * cfg.hidden_dim) * e
        return cache + activations + cfg.vocab_size * 4 * e

    def generate(self, ctx: Any, text: str, voice: Voice, sampling: Sampling,
                 target: PhonemeText | None = None, prompt_text: PhonemeText | None = None) -> Codes:
        """Semantic tokens for `target` (or `text` through the frontend), continuing the voice's
        prompt codes after its transcript's phonemes."""
        prompt_text, target = self.texts(ctx, text, voice, sampling.language, target, prompt_text)
        p_ids, p_bert = prompt_text.features(self.dtype)
        t_ids, t_bert = target.features(self.dtype)
        phones = torch.cat([p_ids, t_ids], dim=1)
        bert = torch.cat([p_bert, t_bert], dim=1).unsqueeze(0)
        prompt = voice.data["prompt"]
        new = min(POSITIONS_PER_PHONEME * t_ids.shape[1], sampling.max_new_tokens)
        memory = self.talker_memory(phones.shape[1] + prompt.shape[1] + new, phones.shape[1] + prompt.shape[1])
        model = self.t2s.module

        def talk() -> torch.Tensor:
            with self.seeded(sampling.seed):
                result = model.generate(phones, bert, prompt, top_k=sampling.top_k, top_p=sampling.top_p,
                                        temperature=sampling.temperature,
                                        repetition_penalty=sampling.repetition_penalty,
                                        early_stop_num=sampling.max_new_tokens, max_steps=1500,
                                        on_step=lambda i: ctx.progress(i, new))
            return result.tokens[:, -result.idx:] if result.idx else result.tokens[:, :0]

        tokens = ctx.run("talker", [self.t2s], talk, memory)
        return Codes(tokens, self.id, {"phones": t_ids, "seed": sampling.seed, "voice": voice})

    def typical_phases(self, seconds: float) -> list[PhaseEstimate]:
        """A clone of a 10 s reference with its transcript, English text (a phoneme a character,
        no BERT or g2pW phase: those run for Chinese text only); semantic tokens at half the
        spectrogram's frame rate, the talker's new positions as `generate` bounds them."""
        cfg = self.vits.module.cfg
        token_rate = cfg.sampling_rate / cfg.hop_length / 2
        ref_tokens, tokens = int(TYPICAL_REFERENCE_SECONDS * token_rate), int(seconds * token_rate)
        ref_phones, phones = (round(s * TYPICAL_CHARS_PER_SECOND) for s in (TYPICAL_REFERENCE_SECONDS, seconds))
        prompt = ref_phones + phones + ref_tokens
        new = min(POSITIONS_PER_PHONEME * phones, Sampling().max_new_tokens)
        spec = torch.empty((cfg.filter_length // 2 + 1, int(TYPICAL_REFERENCE_SECONDS * token_rate * 2)), device="meta")
        phases = []
        if self.hubert is not None:
            samples = int(TYPICAL_REFERENCE_SECONDS * SSL_RATE + cfg.sampling_rate * PROMPT_SILENCE_S)
            handles = (self.hubert, self.vits) + ((self.sv,) if self.sv is not None else ())
            phases.append(PhaseEstimate("voice prompt", handles, self.voice_prompt_memory(samples)))
        return phases + [PhaseEstimate("talker", (self.t2s,), self.talker_memory(prompt + new, prompt)),
                         PhaseEstimate("decoder", (self.vits,), self.decoder_memory(tokens, spec))]

    # ---- decoder -----------------------------------------------------------------------------
    def decoder_memory(self, tokens: int, spec: torch.Tensor) -> int:
        """M45: the generator's widest upsampling stage over the 2 mel frames per token, and a
        copy of the reference spectrogram (the reference encoder's input)."""
        cfg = self.vits.module.cfg
        widest, channels, length = 0, cfg.upsample_initial_channel, 1
        for rate in cfg.upsample_rates:
            channels, length = channels // 2, length * rate
            widest = max(widest, channels * length)
        return element_size(self.dtype) * (DECODER_STAGE_COPIES * widest * 2 * tokens + spec.numel())

    def decode(self, ctx: Any, codes: Codes, allow_fallback: bool | None = None, noise_scale: float = 0.5,
               speed: float = 1.0) -> Audio:
        voice: Voice = codes.extra["voice"]
        model = self.vits.module
        sv = [voice.data["sv"]] if model.cfg.is_pro else None
        memory = self.decoder_memory(codes.tokens.shape[-1], voice.data["spec"])

        def run() -> torch.Tensor:
            with self.seeded(int(codes.extra["seed"])):
                return model.decode(codes.tokens.unsqueeze(0), codes.extra["phones"], [voice.data["spec"]], sv,
                                    noise_scale, speed)

        wav = ctx.run("decoder", [self.vits], run, memory, allow_fallback=allow_fallback)
        return Audio(wav[0].float(), self.sample_rate)


def _resample(wav: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    if rate == target:
        return wav
    import torchaudio.functional

    return torchaudio.functional.resample(wav, rate, target)


def _resampled(audio: Audio, target: int) -> torch.Tensor:
    return _resample(audio.mono(), audio.sample_rate, target)


@functools.cache
def _note_polyphone_source(source: str) -> None:
    """Said once per process and reason, as the frontend's other fallbacks are."""
    log.warning("GPT-SoVITS: Chinese polyphones are read with %s; upstream reads them with g2pW", source)
