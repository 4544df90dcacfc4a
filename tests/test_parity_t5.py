"""Parity: the card-generated T5 v1.1 equals Hugging Face's T5ForConditionalGeneration.

A small randomly initialised Hugging Face model with T5 v1.1's settings (gated-GELU feed-forward
network, `tie_word_embeddings=False`: unscaled logits; no download) is copied into the model that
`cards/t5.card` compiles to, through `cards/t5.hf.json` (nn.Linear weights transposed; each
stack's relative_attention_bias, held by its first block there, is the card's table of that
side). The sequences are longer than the maximum distance, so the logarithmic buckets and the
last bucket of each half are read. Logits and the gradients of a loss agree to fp32 rounding;
broken copies do not; `cardc import` and `cardc export` carry the weights both ways bit for
bit; configs the card does not compute are refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import max_diff  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from cardc.build import build_model, rebuild_model  # noqa: E402
from cardc.interop import load_mapping, to_card_state  # noqa: E402
from cardc.runtime.checkpoint import load_state, read_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "t5.card"

V, D, N, H, D_KV, D_F, N_B, D_MAX = 99, 32, 2, 4, 6, 37, 8, 6  # heads of width 6: H d ≠ D
B, T_Z, T = 3, 13, 11  # both past d_max; source and target of different lengths
TOL = 1e-4

MAPPING = load_mapping(CARD)


def config(**changes):
    settings = dict(
        vocab_size=V, d_model=D, d_kv=D_KV, d_ff=D_F, num_layers=N, num_decoder_layers=N,
        num_heads=H, relative_attention_num_buckets=N_B, relative_attention_max_distance=D_MAX,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
        attn_implementation="eager")
    return transformers.T5Config(**{**settings, **changes})


def randomise(hf):
    """Every parameter random, RMS-norm gains around 1, so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            mean = 1.0 if "layer_norm" in name else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
        for name in ("encoder", "decoder"):  # the tables larger: the buckets must matter
            table = getattr(hf, name).block[0].layer[0].SelfAttention.relative_attention_bias
            table.weight.mul_(10.0)
    return hf.eval()


def make_ours():
    hypers = dict(V=V, D=D, H=H, d=D_KV, D_f=D_F, N=N, N_b=N_B, d_max=D_MAX)
    model = build_model(str(CARD), None, hypers, library=str(ROOT / "cards"), name="T5")
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
    hf = randomise(transformers.T5ForConditionalGeneration(config()))
    assert hf.lm_head.weight is hf.shared.weight and not hf.config.scale_decoder_outputs
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
    hf, ours = models
    z, x, y = inputs
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    want = hf(input_ids=z, decoder_input_ids=x, labels=y)
    got, loss = ours(z, x, y)
    assert abs(loss.item() - want.loss.item()) <= 1e-5
    want.loss.backward()
    loss.backward()
    grads = {n: p.grad for n, p in hf.named_parameters()}
    want_grads = to_card_state(MAPPING, grads, ours.state_dict(), N)
    got_grads = {n: p.grad for n, p in ours.named_parameters()}
    assert set(got_grads) == set(want_grads)
    diffs = {n: max_diff(got_grads[n], want_grads[n]) for n in want_grads}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    for table in ("W_enc_b", "W_dec_b"):  # every layer's bias reaches the shared table
        assert got_grads[table].abs().max().item() > 1e-3, table


def broken_copy(ours, change):
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        change(broken)
    return broken


def _swap_encoder_heads_tables(model) -> None:
    """The encoder's bias columns of two heads exchanged."""
    model.W_enc_b.copy_(model.W_enc_b[:, [1, 0, 2, 3]])


def _last_buckets_merged(model) -> None:
    """The decoder's last bucket (distances from d_max on) read as the one before it."""
    model.W_dec_b[-1] = model.W_dec_b[-2]


def _far_encoder_buckets_merged(model) -> None:
    """The encoder's last bucket of the keys after the query read as the one before it."""
    model.W_enc_b[-1] = model.W_enc_b[-2]


@pytest.mark.parametrize("change", [_swap_encoder_heads_tables, _last_buckets_merged,
                                    _far_encoder_buckets_merged])
def test_broken_copies_are_caught(models, inputs, change):
    """Negative controls: each mistake must move the logits well past the tolerance."""
    hf, ours = models
    z, x, _ = inputs
    with torch.no_grad():
        diff = max_diff(broken_copy(ours, change)(z, x), hf_logits(hf, z, x))
    assert diff > 1e-3, f"{change.__name__} changed the logits by only {diff:.3e}"


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory):
    """save_pretrained, then `cardc import` of the folder."""
    from test_interop import cardc

    hf, _ = models
    root = tmp_path_factory.mktemp("t5")
    hf.save_pretrained(root / "hf")
    r = cardc("import", "cards/t5.card", "--from", str(root / "hf"), "--out", str(root / "run"))
    assert r.returncode == 0, r.stderr
    return root


def test_cardc_import_of_a_saved_t5_matches(models, inputs, saved):
    hf, _ = models
    z, x, _ = inputs
    meta, state = read_checkpoint(saved / "run")
    hypers = meta["hyperparameters"]
    assert (hypers["N"], hypers["d"], hypers["N_b"], hypers["d_max"]) == (N, D_KV, N_B, D_MAX)
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
        dest, attn_implementation="eager").eval()
    assert type(back).__name__ == "T5ForConditionalGeneration"
    assert not back.config.scale_decoder_outputs
    with torch.no_grad():
        assert torch.equal(hf_logits(back, z, x), hf_logits(hf, z, x))


@pytest.mark.parametrize(("changes", "message"), [
    (dict(num_decoder_layers=N + 1), "num_decoder_layers = 3 but num_layers = 2"),
    (dict(feed_forward_proj="relu"), "feed_forward_proj"),
    (dict(tie_word_embeddings=True), "scale_decoder_outputs"),
    (dict(relative_attention_num_buckets=7), "relative_attention_num_buckets"),
    (dict(relative_attention_max_distance=4), "relative_attention_max_distance"),
])
def test_configs_the_card_does_not_compute_are_refused_by_name(tmp_path, changes, message):
    """Other depths for the two sides, T5 v1.0's ReLU network, scaled logits (the original
    T5's), an odd bucket count, or a maximum distance within the causal buckets' exact half
    (a logarithm of 1 would divide): refused at import, naming the key, nothing written."""
    from test_interop import cardc

    transformers.T5ForConditionalGeneration(config(**changes)).save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/t5.card", "--from", str(tmp_path / "hf"), "--out",
              str(tmp_path / "run"))
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_t5_v1_1_small_parameter_count():
    """`cardc info --preset t5-v1_1-small` counts transformers' T5ForConditionalGeneration of
    google/t5-v1_1-small's sizes (lm_head tied there), on the meta device."""
    from test_interop import cardc

    cfg = config(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8,
                 num_decoder_layers=8, num_heads=6, relative_attention_num_buckets=32,
                 relative_attention_max_distance=128)
    with torch.device("meta"):
        hf = transformers.T5ForConditionalGeneration(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    r = cardc("info", "cards/t5.card", "--preset", "t5-v1_1-small")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout


def hf_greedy(hf, z, start, n):
    """transformers' greedy generate, n tokens after `start`: no end token, no other rule
    that would stop it early or change a token."""
    settings = transformers.GenerationConfig(
        max_new_tokens=n, min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=None,
        pad_token_id=0, decoder_start_token_id=int(start[0, 0]), forced_bos_token_id=None,
        forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0)
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


def test_a_separate_lm_head_is_refused_by_name_as_transformers_ties_it(models):
    """transformers' T5Config forces tie_word_embeddings to true (it reads false as
    scale_decoder_outputs = false), so T5ForConditionalGeneration never holds a head of its own:
    a checkpoint whose lm_head.weight differs from shared.weight (an original T5 v1.1 file) has
    no transformers model to agree with. Import refuses it by name rather than drop the head."""
    from cardc.runtime.errors import RuntimeInputError

    assert transformers.T5Config(tie_word_embeddings=False).tie_word_embeddings is True
    hf, ours = models
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = state["shared.weight"] + 1
    with pytest.raises(RuntimeInputError, match=r"^tensor 'lm_head\.weight' differs from "
                                                r"'shared\.weight', but the card T5 ties them$"):
        to_card_state(MAPPING, state, ours.state_dict(), N)
