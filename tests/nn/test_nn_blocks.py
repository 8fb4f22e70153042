"""mizuoto_runtime.nn: weight-norm folding (both key forms), features (mel against librosa,
kaldi fbank against torchaudio), conformer pieces, rotary embeddings in both layouts, the SwiGLU
feed-forward, the timestep embedding, dtype names, the safe checkpoint reader (issues 22, 32); the
audio blocks: Snake, causal and reflect convs, HiFi-GAN resblocks, WaveNet, ConvNeXt (issue 32)."""
from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto_runtime.errors import ArgumentError
from mizuoto_runtime.nn import (
    conformer,
    conv,
    convnext,
    features,
    feed_forward,
    hifigan,
    rotary,
    snake,
    timestep,
    vq,
    wavenet,
    weight_norm,
)
from mizuoto_runtime.nn.checkpoint import CheckpointError, load_state_dict, load_weights_only
from mizuoto_runtime.nn.dtypes import DTYPE_NAMES, DTYPES, parse_dtype


@pytest.mark.parametrize("module", [nn.Conv1d(6, 4, 3), nn.ConvTranspose1d(6, 4, 5, 2)])
def test_weight_norm_fold_both_key_forms(module: nn.Module) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 6, 11)
    new = nn.utils.parametrizations.weight_norm(module)
    with torch.no_grad():
        new.parametrizations.weight.original0.mul_(1.3)
    want = new(x)
    folded = weight_norm.fold_state_dict(new.state_dict())
    assert set(folded) == {"weight", "bias"}
    plain = type(module)(6, 4, module.kernel_size[0], module.stride[0])
    plain.load_state_dict(folded)
    assert torch.equal(plain(x), want)

    legacy = {"weight_g": new.parametrizations.weight.original0.detach(),
              "weight_v": new.parametrizations.weight.original1.detach(), "bias": module.bias.detach()}
    assert torch.equal(weight_norm.fold_state_dict(legacy)["weight"], folded["weight"])
    with pytest.raises(KeyError, match="weight_v"):
        weight_norm.fold_state_dict({"weight_g": legacy["weight_g"]})


def test_mel_filterbank_matches_librosa() -> None:
    librosa = pytest.importorskip("librosa")
    for fmax in (8000, None):
        want = librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=fmax)
        assert torch.equal(features.mel_filterbank(24000, 1920, 80, 0, fmax), torch.from_numpy(want))
    want = librosa.filters.mel(sr=16000, n_fft=400, n_mels=40, fmin=30, fmax=7000, htk=True)
    assert torch.equal(features.mel_filterbank(16000, 400, 40, 30, 7000, htk=True), torch.from_numpy(want))


def test_mel_spectrogram_shape_and_log_floor() -> None:
    wav = torch.zeros(1, 24000)
    mel = features.mel_spectrogram(wav, n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480,
                                   win_size=1920, fmin=0, fmax=8000)
    assert mel.shape == (1, 80, 50)
    assert torch.all(mel == math.log(1e-5))


def test_kaldi_fbank_matches_torchaudio() -> None:
    kaldi = pytest.importorskip("torchaudio.compliance.kaldi")
    torch.manual_seed(0)
    wav = torch.randn(1, 16000) * 0.1
    want = kaldi.fbank(wav, num_mel_bins=80, dither=0, sample_frequency=16000)
    got = features.kaldi_fbank(wav, num_mel_bins=80, sample_frequency=16000)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="fewer than one"):
        features.kaldi_fbank(torch.zeros(100))


def test_rel_pos_attention_without_positions_is_plain_attention() -> None:
    torch.manual_seed(0)
    attn = conformer.RelPositionMultiHeadedAttention(4, 32).eval()
    with torch.no_grad():
        attn.linear_pos.weight.zero_()
    embed = conformer.EspnetRelPositionalEncoding(32)
    x = torch.randn(1, 7, 32)
    _, pos = embed(x)
    assert pos.shape == (1, 13, 32)
    got = attn(x, torch.ones(1, 1, 7, dtype=torch.bool), pos)
    q, k, v = (lin(x).view(1, 7, 4, 8).transpose(1, 2) for lin in (attn.linear_q, attn.linear_k, attn.linear_v))
    want = attn.linear_out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 7, 32))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_rel_shift_aligns_relative_positions() -> None:
    """Row i of the shifted scores holds relative positions i-j for keys j = 0..t-1."""
    t = 5
    rel = torch.arange(t - 1, -t, -1).float()  # the encoding's order: t-1 .. -(t-1)
    scores = rel.expand(1, 1, t, 2 * t - 1)
    shifted = conformer.RelPositionMultiHeadedAttention.rel_shift(scores)
    want = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).float()
    assert torch.equal(shifted[0, 0], want)


def test_causal_conv_module_ignores_the_future() -> None:
    torch.manual_seed(0)
    conv = conformer.ConvolutionModule(8, 5, norm="layer_norm", causal=True).eval()
    x = torch.randn(1, 10, 8)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 8)
    assert torch.equal(conv(x)[:, :6], conv(y)[:, :6])
    layer = conformer.ConformerEncoderLayer(
        8, conformer.RelPositionMultiHeadedAttention(2, 8), conformer.PositionwiseFeedForward(8, 16, nn.SiLU()),
        conformer.PositionwiseFeedForward(8, 16, nn.SiLU()), conv).eval()
    _, pos = conformer.EspnetRelPositionalEncoding(8)(x)
    assert layer(x, torch.ones(1, 1, 10, dtype=torch.bool), pos).shape == x.shape


def test_checkpoint_reader(tmp_path: Path) -> None:
    t = torch.ones(2)
    torch.save({"state_dict": {"generator.a": t, "step": 3}}, tmp_path / "wrapped.pt")
    assert set(load_state_dict(tmp_path / "wrapped.pt", strip_prefixes=("generator.",))) == {"a"}
    torch.save([t], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="list.pt: expected a dict"):
        load_state_dict(tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="not found"):
        load_state_dict(tmp_path / "absent.pt")
    torch.save({"cfg": {"x": 1}}, tmp_path / "empty.pt")
    with pytest.raises(CheckpointError, match="no tensors"):
        load_state_dict(tmp_path / "empty.pt")


class Opaque:  # a class, not a tensor: no file of weights holds one
    pass


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_a_refused_pickle_says_what_it_holds_and_what_to_do(tmp_path: Path) -> None:
    """Issue 31: PyTorch's own message advises loading with the safety off; ours names the class
    the file holds (where PyTorch's message names it) and says to get the file as weights or
    convert it, never to turn the safety off."""
    torch.save({"weight": torch.ones(2), "extra": Opaque()}, tmp_path / "custom.pt")
    (tmp_path / "plain2.pkl").write_bytes(pickle.dumps({"weight": Opaque()}, protocol=2))
    (tmp_path / "plain4.pkl").write_bytes(pickle.dumps({"weight": Opaque()}, protocol=4))  # refused by opcode
    named = f"a pickled {Opaque.__module__}.Opaque"
    for name, holds in (("custom.pt", named), ("plain2.pkl", named), ("plain4.pkl", "a pickled object")):
        for load in (load_weights_only, load_state_dict):
            with pytest.raises(CheckpointError) as info:
                load(tmp_path / name)
            message = str(info.value)
            assert message.startswith(f"{tmp_path / name}: refused to load: it holds {holds}, which is not a tensor")
            assert "publisher" in message and "convert it" in message
            assert "weights_only" not in message and "False" not in message and "trust" not in message


# Audio and conv blocks (issue 32): Snake, causal / reflect convs, HiFi-GAN resblocks, WaveNet,
# ConvNeXt. Their equality with each engine's former copy is what the engines' tests and
# check-reference show; these pin the parameters that tell the engines' uses apart.

def _random_(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    return module.eval()


def test_snake_layouts_and_scales() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9)
    plain = _random_(snake.Snake(4))
    assert plain.alpha.shape == (4,)
    a = plain.alpha.detach()[None, :, None]
    assert torch.equal(plain(x), x + 1.0 / (a + 1e-9) * torch.sin(x * a) ** 2)  # upstream's form, exactly
    column = snake.Snake(4, column=True)
    assert column.alpha.shape == (1, 4, 1)  # DAC's stored layout
    column.load_state_dict({"alpha": plain.alpha.detach().view(1, 4, 1)})
    assert torch.equal(column(x), plain(x))
    log = snake.Snake(4, logscale=True)
    assert torch.equal(log.alpha, torch.zeros(4))  # exp(0) = 1, as the linear scale's ones
    log.load_state_dict({"alpha": plain.alpha.detach().log().nan_to_num()})
    positive = plain.alpha.detach() > 0
    assert torch.allclose(log(x)[:, positive], plain(x)[:, positive], atol=1e-6)

    beta = _random_(snake.SnakeBeta(4))
    assert set(beta.state_dict()) == {"alpha", "beta"}
    b = beta.beta.detach()[None, :, None]
    a = beta.alpha.detach()[None, :, None]
    assert torch.equal(beta(x), x + 1.0 / (b + 1e-9) * torch.sin(x * a).pow(2))
    logbeta = snake.SnakeBeta(4, logscale=True)
    logbeta.load_state_dict(beta.state_dict())
    assert torch.equal(logbeta(x), snake.snake(x, a.exp(), b.exp()))


def test_causal_conv_padding_and_direction() -> None:
    assert [conv.causal_padding(k) for k in (1, 2, 3, 4, 7)] == [0, 1, 2, 3, 6]
    assert conv.causal_padding(3, 2) == 4
    torch.manual_seed(0)
    x = torch.randn(1, 3, 12)
    later = x.clone()
    later[..., 8:] = torch.randn(1, 3, 4)
    past = _random_(conv.CausalConv1d(3, 5, 3, dilation=2))
    assert past(x).shape == (1, 5, 12)
    assert torch.equal(past(x)[..., :8], past(later)[..., :8])
    ahead = _random_(conv.CausalConv1d(3, 5, 4, right=True))  # looks 3 samples ahead
    assert ahead(x).shape == (1, 5, 12)
    assert torch.equal(ahead(x)[..., :5], ahead(later)[..., :5])
    assert not torch.equal(ahead(x)[..., 5:8], ahead(later)[..., 5:8])
    grouped = _random_(conv.CausalConv1d(4, 4, 5, groups=2))  # CosyVoice 3's DiT position embedding
    x4 = torch.randn(1, 4, 12)
    assert torch.equal(grouped(x4), F.conv1d(F.pad(x4, (4, 0)), grouped.weight, grouped.bias, groups=2))
    down = _random_(conv.CausalConv1d(3, 5, 4, stride=2, padding=1))  # HiFT's source downsampling
    assert down(x).shape == (1, 5, 5)
    assert torch.equal(down(x), F.conv1d(F.pad(x, (1, 0)), down.weight, down.bias, stride=2))


def test_reflect_conv_keeps_length_and_key_path() -> None:
    torch.manual_seed(0)
    layer = _random_(conv.ReflectConv1d(3, 4, 5, dilation=2))
    assert set(layer.state_dict()) == {"conv.conv.weight", "conv.conv.bias"}
    x = torch.randn(1, 3, 20)
    assert torch.equal(layer(x), layer.conv.conv(F.pad(x, (4, 4), mode="reflect")))
    assert layer(torch.randn(1, 3, 3)).shape == (1, 4, 3)  # shorter than the padding


def test_resblock1_activation_names_and_causality() -> None:
    pairs = hifigan.ResBlock1(4, 3, (1, 3), activation=snake.Snake)
    assert [k for k in pairs.state_dict() if "activations" in k] == [
        "activations1.0.alpha", "activations1.1.alpha", "activations2.0.alpha", "activations2.1.alpha"]
    interleaved = hifigan.ResBlock1(4, 3, (1, 3), activation=snake.SnakeBeta, names=hifigan.ActivationNames.INTERLEAVED)
    assert [k for k in interleaved.state_dict() if "activations" in k] == [
        f"activations.{i}.{p}" for i in range(4) for p in ("alpha", "beta")]
    plain = _random_(hifigan.ResBlock1(4, 3, (1, 3)))
    assert set(plain.state_dict()) == {f"convs{j}.{i}.{p}" for j in (1, 2) for i in (0, 1) for p in ("weight", "bias")}
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16)
    want = x
    for c1, c2 in zip(plain.convs1, plain.convs2):
        want = c2(F.leaky_relu(c1(F.leaky_relu(want, 0.1)), 0.1)) + want
    assert torch.equal(plain(x), want)
    _random_(pairs)
    causal = _random_(hifigan.ResBlock1(4, 3, (1, 3), activation=snake.Snake, causal=True))
    assert isinstance(causal.convs1[1], conv.CausalConv1d)
    later = x.clone()
    later[..., 10:] = torch.randn(1, 4, 6)
    assert torch.equal(causal(x)[..., :10], causal(later)[..., :10])
    assert not torch.equal(pairs(x)[..., :10], pairs(later)[..., :10])  # zero padded: sees ahead


def test_resblock2_and_mean() -> None:
    torch.manual_seed(0)
    block = _random_(hifigan.ResBlock2(4, 3, (1, 3)))
    x = torch.randn(1, 4, 10)
    want = x
    for c in block.convs:
        want = c(F.leaky_relu(want, 0.1)) + want
    assert torch.equal(block(x), want)
    blocks = nn.ModuleList([block, _random_(hifigan.ResBlock1(4, 3, (1,))), _random_(hifigan.ResBlock2(4, 5, (2,)))])
    assert torch.equal(hifigan.resblock_mean(blocks, x), (blocks[0](x) + blocks[1](x) + blocks[2](x)) / 3)


def test_wavenet_condition_dilation_and_mask() -> None:
    torch.manual_seed(0)
    net = _random_(wavenet.WaveNet(4, 3, 3, 2, dilation_rate=2))
    assert [layer.dilation[0] for layer in net.in_layers] == [1, 2, 4]
    assert net.cond_layer is not None and net.res_skip_layers[-1].out_channels == 4
    x, g = torch.randn(1, 4, 12), torch.randn(1, 2, 1)
    mask = torch.ones(1, 1, 12)
    mask[..., 9:] = 0
    y = net(x, mask, g)
    assert y.shape == x.shape and torch.all(y[..., 9:] == 0)
    assert not torch.equal(y, net(x, mask, None))  # the condition is added
    bare = wavenet.WaveNet(4, 3, 2, 0)
    assert bare.cond_layer is None and not any(k.startswith("cond_layer") for k in bare.state_dict())
    reflect = wavenet.WaveNet(4, 5, 2, 4, conv=conv.ReflectConv1d)
    assert "in_layers.1.conv.conv.weight" in reflect.state_dict()
    assert reflect(x, torch.ones(1, 1, 12), torch.randn(1, 4, 1)).shape == x.shape


def test_convnext_block_and_its_depthwise_conv() -> None:
    torch.manual_seed(0)
    block = _random_(convnext.ConvNeXtBlock(4, 6))
    assert set(block.state_dict()) == {"gamma", "dwconv.weight", "dwconv.bias", "norm.weight", "norm.bias",
                                       "pwconv1.weight", "pwconv1.bias", "pwconv2.weight", "pwconv2.bias"}
    x = torch.randn(1, 4, 11)
    assert block(x).shape == x.shape
    causal = _random_(convnext.ConvNeXtBlock(4, 6, conv.CausalConv1d(4, 4, 7)))
    later = x.clone()
    later[..., 6:] = torch.randn(1, 4, 5)
    assert torch.equal(causal(x)[..., :6], causal(later)[..., :6])
    assert not torch.equal(block(x)[..., :6], block(later)[..., :6])
    with torch.no_grad():
        block.gamma.zero_()
    assert torch.equal(block(x), x)


def test_nearest_codes_picks_the_closest_normalised_row() -> None:
    torch.manual_seed(0)
    book = torch.randn(6, 3)
    codes = torch.tensor([[4, 0, 5, 5], [1, 2, 3, 0]])
    z_e = (F.embedding(codes, book) * torch.rand(2, 4, 1) * 3 + 0.01).transpose(1, 2)  # scaled: same direction
    assert torch.equal(vq.nearest_codes(z_e, book), codes)


def _angles(positions: int, head_dim: int, base: float) -> torch.Tensor:
    """``pos * base ** (-2i / head_dim)`` in float64: the direct formula."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return torch.arange(positions, dtype=torch.float64)[:, None] * base ** (-2 * i / head_dim)[None, :]


def test_rotary_halves_against_the_formula() -> None:
    """Channel i turns with channel i + d/2 by angle pos * base^(-2i/d)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8)
    cos, sin = rotary.RotaryEmbedding(8, 100.0)(torch.arange(5)[None], torch.float32)
    got = rotary.apply_rotary(x, cos.unsqueeze(1), sin.unsqueeze(1)).double()
    a, b = x[..., :4].double(), x[..., 4:].double()
    c, s = _angles(5, 8, 100.0).cos(), _angles(5, 8, 100.0).sin()
    want = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_rotary_pairs_against_the_formula_both_forms() -> None:
    """Channels 2i and 2i+1 turn together; the table form (float32 math) equals the full-width
    cos/sin form bit for bit, and the table takes the dtype asked for."""
    torch.manual_seed(0)
    x = torch.randn(1, 5, 2, 8)  # (B, S, H, D)
    table = rotary.pair_table(torch.arange(5), 8, 100.0)
    assert table.shape == (5, 4, 2) and table.dtype == torch.float32
    torch.testing.assert_close(table.double(),
                               torch.stack((_angles(5, 8, 100.0).cos(), _angles(5, 8, 100.0).sin()), -1),
                               rtol=0, atol=1e-6)
    assert torch.equal(rotary.pair_table(torch.arange(5), 8, 100.0, torch.bfloat16), table.to(torch.bfloat16))

    got = rotary.apply_pair_table(x, table)
    a, b = x[..., 0::2].double(), x[..., 1::2].double()
    c, s = _angles(5, 8, 100.0).cos()[None, :, None], _angles(5, 8, 100.0).sin()[None, :, None]
    want = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)

    full_cos = table[..., 0].repeat_interleave(2, dim=-1)[None, :, None]
    full_sin = table[..., 1].repeat_interleave(2, dim=-1)[None, :, None]
    assert torch.equal(rotary.apply_rotary(x, full_cos, full_sin, "pairs"), got)
    assert rotary.apply_pair_table(x.to(torch.bfloat16), table).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="layout"):
        rotary.apply_rotary(x, full_cos, full_sin, "thirds")  # type: ignore[arg-type]


def test_conformer_layer_norm_eps_is_a_parameter() -> None:
    """WeNet's 1e-12 by default; IndexTTS-2's encoder asks 1e-5 for every norm, final included."""
    def layer(**kw: float) -> conformer.ConformerEncoderLayer:
        torch.manual_seed(0)
        return conformer.ConformerEncoderLayer(
            8, conformer.RelPositionMultiHeadedAttention(2, 8), conformer.PositionwiseFeedForward(8, 16),
            conformer.PositionwiseFeedForward(8, 16), conformer.ConvolutionModule(8, 3), **kw).eval()

    norms = ("norm_ff", "norm_mha", "norm_ff_macaron", "norm_conv", "norm_final")
    assert {getattr(layer(), n).eps for n in norms} == {1e-12}
    assert {getattr(layer(eps=0.5), n).eps for n in norms} == {0.5}
    x = torch.randn(1, 6, 8) * 0.1  # variance near eps: the eps shows in the output
    pos = torch.zeros(1, 6, 8)
    mask = torch.ones(1, 1, 6, dtype=torch.bool)
    assert not torch.allclose(layer()(x, mask, pos), layer(eps=0.5)(x, mask, pos))

    encoder = conformer.ConformerEncoder(9, 8, 16, 2, 2)
    assert {m.eps for m in encoder.modules() if isinstance(m, nn.LayerNorm)} == {1e-5}
    out, sub_mask = encoder(torch.randn(1, 11, 9), torch.tensor([11]))
    assert out.shape == (1, 5, 8) and sub_mask.shape == (1, 1, 5)
    with pytest.raises(ValueError, match="conv2d2"):
        conformer.ConformerEncoder(9, 8, 16, 2, 2, input_layer="linear")


@pytest.mark.parametrize("names", [feed_forward.LLAMA_NAMES, feed_forward.TRANSFORMERS_NAMES])
def test_swiglu_keys_and_formula(names: tuple[str, str, str]) -> None:
    """The checkpoint's own key names; ``down(silu(gate x) * up x)`` bit for bit."""
    torch.manual_seed(0)
    ff = feed_forward.SwiGLU(6, 10, names)
    gate, up, down = names
    assert list(ff.state_dict()) == [f"{gate}.weight", f"{up}.weight", f"{down}.weight"]
    assert ff.state_dict()[f"{down}.weight"].shape == (6, 10)
    x = torch.randn(3, 6)
    w = ff.state_dict()
    want = F.linear(F.silu(F.linear(x, w[f"{gate}.weight"])) * F.linear(x, w[f"{up}.weight"]), w[f"{down}.weight"])
    assert torch.equal(ff(x), want)
    with pytest.raises(ValueError, match="three distinct"):
        feed_forward.SwiGLU(6, 10, ("a", "a", "b"))


@pytest.mark.parametrize(("sinusoid", "mlp", "keys"), [
    ("sin_cos", "time_mlp", ["time_mlp.0.weight", "time_mlp.0.bias", "time_mlp.2.weight", "time_mlp.2.bias"]),
    ("sin_cos", None, ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]),
    ("cos_sin", "mlp", ["freqs", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"]),
])
def test_timestep_embedding_layouts_against_the_formula(sinusoid: timestep.Sinusoid, mlp: str | None,
                                                        keys: list[str]) -> None:
    """Each checkpoint's key layout; the sinusoid's order and frequency spacing (``half - 1``
    for "sin_cos", ``half`` for "cos_sin"); then ``Linear -> SiLU -> Linear``."""
    torch.manual_seed(0)
    embed = timestep.TimestepEmbedding(12, 16, sinusoid=sinusoid, mlp=mlp)
    assert list(embed.state_dict()) == keys
    t = torch.tensor([0.0, 0.25, 1.0])
    i = torch.arange(8, dtype=torch.float64)
    angles = 1000 * t.double()[:, None] * torch.exp(-math.log(10000) * i / (7 if sinusoid == "sin_cos" else 8))
    parts = (angles.sin(), angles.cos()) if sinusoid == "sin_cos" else (angles.cos(), angles.sin())
    want_emb = torch.cat(parts, dim=-1)
    w = {k.split(".", 1)[-1] if mlp else k: v for k, v in embed.state_dict().items()}
    first, second = ("0", "2") if mlp else ("linear_1", "linear_2")
    got_emb = (timestep.sinusoidal_embedding(t, 16) if sinusoid == "sin_cos"
               else torch.cat([torch.cos(1000 * t[:, None] * embed.freqs),
                               torch.sin(1000 * t[:, None] * embed.freqs)], -1))
    torch.testing.assert_close(got_emb.double(), want_emb, rtol=0, atol=2e-3)  # float32 angles up to 1000
    want = F.linear(F.silu(F.linear(got_emb, w[f"{first}.weight"], w[f"{first}.bias"])),
                    w[f"{second}.weight"], w[f"{second}.bias"])
    assert torch.equal(embed(t), want)
    with pytest.raises(ValueError, match="sinusoid"):
        timestep.TimestepEmbedding(12, 16, sinusoid="tan")  # type: ignore[arg-type]


def test_parse_dtype_by_name_or_dtype() -> None:
    assert {parse_dtype(name) for name in DTYPES} == set(DTYPE_NAMES)
    assert parse_dtype(torch.bfloat16) is torch.bfloat16
    assert DTYPE_NAMES[parse_dtype("float16")] == "float16"
    with pytest.raises(ArgumentError,
                       match="tiny checkpoint dtype must be one of float32, bfloat16, float16, got 'half'"):
        parse_dtype("half", "tiny checkpoint dtype")
    with pytest.raises(ValueError, match="got torch.float64"):
        parse_dtype(torch.float64)
