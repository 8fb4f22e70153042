"""w2v-BERT 2.0 through transformers' `Wav2Vec2BertModel`: the output of its 17th layer,
normalised with the checkpoint's mean and variance (upstream's `get_emb`).

Only the first 17 layers are kept: hidden state 17 is what they output, and the later layers
would be weights loaded and placed for nothing.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import MizuotoError
from ...nn.loading import reading_weights

LAYER = 17


class W2VBert(nn.Module):
    def __init__(self, folder: Path, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertModel

        if not (folder / "config.json").is_file():
            raise MizuotoError(f"IndexTTS-2 needs w2v-BERT 2.0 in {folder} (config.json, model.safetensors, "
                               "preprocessor_config.json of facebook/w2v-bert-2.0)")
        if reading_weights():
            self.extractor = SeamlessM4TFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
            model = Wav2Vec2BertModel.from_pretrained(str(folder), local_files_only=True)
        else:  # a shapes-only build (engines.published): the folder's config alone
            from transformers import Wav2Vec2BertConfig

            self.extractor = None
            model = Wav2Vec2BertModel(Wav2Vec2BertConfig.from_pretrained(str(folder)))
        if len(model.encoder.layers) < LAYER:
            raise MizuotoError(f"{folder}: w2v-BERT has {len(model.encoder.layers)} layers, "
                               f"IndexTTS-2 reads layer {LAYER}")
        cfg = model.config
        # upstream's transformers (4.52) draws one torch.rand([]) per encoder and adapter layer on
        # every call, in eval mode too (its LayerDrop check): the decoding's random stream on
        # the CPU starts after those draws (see `pipeline.skip_prompt_draws`)
        self.upstream_draws = cfg.num_hidden_layers + (cfg.num_adapter_layers if cfg.add_adapter else 0)
        model.encoder.layers = model.encoder.layers[:LAYER]
        model.config.num_hidden_layers = LAYER
        self.model = model.eval()
        if mean.shape[0] != model.config.hidden_size:
            raise MizuotoError(f"wav2vec2bert_stats.pt has width {mean.shape[0]}, w2v-BERT {model.config.hidden_size}")
        self.register_buffer("mean", mean.float().clone())
        self.register_buffer("std", std.float().clone())

    def memory_units(self) -> list[nn.Module]:
        return list(self.model.encoder.layers)

    def inputs(self, wav_16k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, samples) at 16 kHz -> input features and attention mask (on the CPU)."""
        batch = self.extractor(wav_16k, sampling_rate=16000, return_tensors="pt")
        return batch["input_features"], batch["attention_mask"]

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_features=features, attention_mask=mask, output_hidden_states=True)
        return (out.hidden_states[LAYER] - self.mean) / self.std
