"""Parity: the card-generated BART equals Hugging Face's BartForConditionalGeneration.

A small randomly initialised Hugging Face model (no download) is copied into the model that
`cards/bart.card` compiles to, through `cards/bart.hf.json` (nn.Linear weights transposed, the
separate q/k/v projections joined into the card's fused W_qkv, final_logits_bias reshaped from
its (1, V) buffer). Logits and the gradients of a loss must agree to fp32 rounding; broken
copies must not; `cardc import` and `cardc export` carry the weights both ways bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import max_diff, swap_columns  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from cardc.build import build_model, rebuild_model  # noqa: E402
from cardc.interop import load_mapping, to_card_state  # noqa: E402
from cardc.runtime.checkpoint import load_state, read_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "bart.card"

V, D, N, H, D_F, CTX = 99, 32, 2, 4, 37, 64
B, T_Z, T = 3, 13, 11  # source and target of different lengths: a transposed cross-attention shows
TOL = 1e-4

MAPPING = load_mapping(CARD)


def config():
    return transformers.BartConfig(
        vocab_size=V, d_model=D, encoder_layers=N, decoder_layers=N, encoder_attention_heads=H,
        decoder_attention_heads=H, encoder_ffn_dim=D_F, decoder_ffn_dim=D_F,
        max_position_embeddings=CTX, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        classifier_dropout=0.0, attn_implementation="eager")


def randomise(hf):
    """Every parameter random (biases, layer norms and the logits bias too), layer-norm gains
    around 1, so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            mean = 1.0 if "layer_norm.weight" in name or "layernorm_embedding.weight" in name \
                else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
        hf.final_logits_bias.copy_(0.1 * torch.randn(hf.final_logits_bias.shape, generator=gen))
    return hf.eval()


def make_ours():
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX)
    model = build_model(str(CARD), None, hypers, library=str(ROOT / "cards"), name="BART")
    return model.float().eval()


def copy_into(hf_state, ours) -> None:
    ours.load_state_dict(to_card_state(MAPPING, hf_state, ours.state_dict(), N), strict=True)


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(7)
    z = torch.randint(0, V, (B, T_Z), generator=gen)
    x = torch.randint(0, V, (B, T), generator=gen)
    y = torch.randint(0, V, (B, T), generator=gen)  # next-token targets of the decoder
    return z, x, y


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    hf = randomise(transformers.BartForConditionalGeneration(config()))
    assert hf.lm_head.weight is hf.model.shared.weight
    ours = make_ours()
    copy_into(hf.state_dict(), ours)
    return hf, ours


def hf_logits(hf, z, x):
    return hf(input_ids=z, decoder_input_ids=x).logits


def test_logits_match(models, inputs):
    hf, ours = models
    z, x, _ = inputs
    with torch.no_grad():
        want, got = hf_logits(hf, z, x), ours(z, x)
    assert got.shape == want.shape == (B, T, V)
    diff = max_diff(got, want)
    assert diff <= TOL, f"max |logits diff| = {diff:.3e}"


def test_gradients_match(models, inputs):
    """Cross-entropy of the decoder's predictions; final_logits_bias, a buffer in transformers,
    is made to take a gradient so the card's b_f is checked too."""
    hf, ours = models
    z, x, y = inputs
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf.final_logits_bias.grad = None
    hf.final_logits_bias.requires_grad_(True)
    try:
        want = hf(input_ids=z, decoder_input_ids=x, labels=y)
        got, loss = ours(z, x, y)
        assert abs(loss.item() - want.loss.item()) <= 1e-5
        want.loss.backward()
        loss.backward()
        grads = {n: p.grad for n, p in hf.named_parameters()}
        grads["final_logits_bias"] = hf.final_logits_bias.grad
    finally:
        hf.final_logits_bias.requires_grad_(False)
    want_grads = to_card_state(MAPPING, grads, ours.state_dict(), N)
    got_grads = {n: p.grad for n, p in ours.named_parameters()}
    assert set(got_grads) == set(want_grads)
    diffs = {n: max_diff(got_grads[n], want_grads[n]) for n in want_grads}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    assert max(g.abs().max().item() for g in got_grads.values()) > 1e-3  # not all vanishing


def broken_copy(ours, change):
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        change(broken)
    return broken


def _swap_cross_heads(model) -> None:
    """Exchange two heads' key columns in the first decoder block's cross-attention."""
    d = D // H
    swap_columns(model.dec[0].cross.W_qkv, D, d)


def _no_position_offset(model) -> None:
    """Positions read from row 1 rather than row 3, as if the offset of 2 were forgotten."""
    for table in (model.W_enc_p, model.W_dec_p):
        table.copy_(table.roll(2, dims=0))


def _no_cross_query_bias(model) -> None:
    model.dec[1].cross.b_qkv[:D] = 0.0


@pytest.mark.parametrize("change", [_swap_cross_heads, _no_position_offset, _no_cross_query_bias])
def test_broken_copies_are_caught(models, inputs, change):
    """Negative controls: each mistake must move the logits well past the tolerance."""
    hf, ours = models
    z, x, _ = inputs
    with torch.no_grad():
        diff = max_diff(broken_copy(ours, change)(z, x), hf_logits(hf, z, x))
    assert diff > 1e-3, f"{change.__name__} changed the logits by only {diff:.3e}"


def test_positions_past_the_table_are_refused(models):
    _, ours = models
    long = torch.zeros(1, CTX + 1, dtype=torch.long)
    with pytest.raises(ValueError, match=f"exceeds the model's {CTX} positions"):
        ours(long, long[:, :3])
    ours(long[:, :CTX], long[:, :CTX])  # ctx positions fit: rows 3 … ctx + 2


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory):
    """save_pretrained, then `cardc import` of the folder."""
    from test_interop import cardc

    hf, _ = models
    root = tmp_path_factory.mktemp("bart")
    hf.save_pretrained(root / "hf")
    r = cardc("import", "cards/bart.card", "--from", str(root / "hf"), "--out", str(root / "run"))
    assert r.returncode == 0, r.stderr
    return root


def test_cardc_import_of_a_saved_bart_matches(models, inputs, saved):
    hf, _ = models
    z, x, _ = inputs
    meta, state = read_checkpoint(saved / "run")
    assert meta["hyperparameters"]["N"] == N and meta["hyperparameters"]["ctx"] == CTX
    model = rebuild_model(meta)
    load_state(model, state)
    with torch.no_grad():
        diff = max_diff(model.eval()(z, x), hf_logits(hf, z, x))
    assert diff <= TOL, f"max |logits diff| = {diff:.3e}"


def test_cardc_export_is_bit_exact_and_loads(models, inputs, saved):
    """import → export gives back every saved tensor unchanged, and from_pretrained the same
    logits."""
    from test_interop import cardc

    hf, _ = models
    z, x, _ = inputs
    dest = saved / "exported"
    r = cardc("export", str(saved / "run"), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    source, exported = load_file(saved / "hf" / "model.safetensors"), \
        load_file(dest / "model.safetensors")
    assert set(exported) == set(source)
    unequal = [name for name in source if not torch.equal(source[name], exported[name])]
    assert not unequal, f"changed by import → export: {unequal}"
    back = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        dest, attn_implementation="eager").eval()  # as the original, so rounding agrees too
    assert type(back).__name__ == "BartForConditionalGeneration"
    assert back.lm_head.weight is back.model.shared.weight
    with torch.no_grad():
        assert torch.equal(hf_logits(back, z, x), hf_logits(hf, z, x))


def test_unequal_encoder_and_decoder_depths_are_refused(tmp_path):
    """The card has one N for both sides; a config with other depths is refused by name."""
    from test_interop import cardc

    cfg = config()
    cfg.decoder_layers = N + 1
    transformers.BartForConditionalGeneration(cfg).save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/bart.card", "--from", str(tmp_path / "hf"), "--out",
              str(tmp_path / "run"))
    assert r.returncode != 0
    assert "decoder_layers = 3 but encoder_layers = 2" in r.stderr
    assert not (tmp_path / "run").exists()


def test_bart_base_parameter_count():
    """`cardc info --preset bart-base` counts transformers' BartModel (139,420,416 on the meta
    device) plus final_logits_bias, a (1, V) buffer there and the parameter b_f in the card."""
    from test_interop import cardc

    cfg = transformers.BartConfig(
        vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
        decoder_ffn_dim=3072, max_position_embeddings=1024)
    with torch.device("meta"):
        hf = transformers.BartModel(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 139_420_416
    r = cardc("info", "cards/bart.card", "--preset", "bart-base")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs + cfg.vocab_size:,}" in r.stdout


def hf_greedy(hf, z, start, n):
    """transformers' greedy generate, n tokens after `start`: no end token, no other rule
    that would stop it early or change a token."""
    settings = transformers.GenerationConfig(
        max_new_tokens=n, min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=None,
        pad_token_id=0, decoder_start_token_id=int(start[0, 0]), forced_bos_token_id=None,
        forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0)
    hf.generation_config.forced_eos_token_id = None  # BartConfig's 2 at the last token
    hf.generation_config.eos_token_id = None
    return hf.generate(input_ids=z, decoder_input_ids=start, generation_config=settings)


def test_greedy_generate_draws_transformers_tokens(models, inputs):
    """generate(source, start, n) at temperature 0, through the cache (the source encoded
    once), draws the tokens transformers' greedy generate draws, as full recomputation does."""
    hf, ours = models
    z, x, _ = inputs
    start = x[:, :2]
    with torch.no_grad():
        want = hf_greedy(hf, z, start, 9)
        got = ours.generate(z, start, 9, temperature=0)
        plain = start
        for _ in range(9):  # greedy over full recomputation, without a cache
            plain = torch.cat([plain, ours(z, plain)[:, -1:].argmax(-1)], dim=1)
    assert got.shape == (B, 11) and torch.equal(got, plain)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
