"""Parity: the card-generated Falcon equals Hugging Face's FalconForCausalLM number for number.

A small randomly initialised FalconForCausalLM in Falcon-7B's layout (no download; 4 query heads
of width 16 sharing one key and one value head, parallel attention and MLP reading one LayerNorm
with random gain and bias, tied embeddings, a pad token the input holds) is copied into the model
`cards/falcon.card` compiles to, through `cards/falcon.hf.json`, whose fused query_key_value is
split into the card's W_q, W_k and W_v. Logits and gradients must agree to fp32 rounding; the
same weights with the query_key_value layout misread, or with a padding row Falcon does not
have, must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import logits_diff, max_diff  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import from_card_state, load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, D_F, CTX, THETA, EPS = 101, 64, 2, 4, 96, 64, 1e4, 1e-5
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
MAPPING = load_mapping(ROOT / "cards" / "falcon.card")


def make_hf(tied: bool = True):
    config = transformers.FalconConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        ffn_hidden_size=D_F, max_position_embeddings=CTX, rope_theta=THETA,
        layer_norm_epsilon=EPS, new_decoder_architecture=False, multi_query=True,
        parallel_attn=True, alibi=False, bias=False, tie_word_embeddings=tied,
        attention_dropout=0.0, hidden_dropout=0.0, pad_token_id=PAD)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.FalconForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if "ln" in name.split(".")[-2] or "layernorm" in name else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(v_pad: int = 0, name: str | None = None):
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA, v_pad=v_pad)
    model = build_model(str(ROOT / "cards" / "falcon.card"), None, hypers, name=name,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def load(hf, ours) -> None:
    """The HF weights into ours through the mapping file (the fused qkv split), strictly."""
    state = to_card_state(MAPPING, hf.state_dict(), ours.state_dict(), N)
    ours.load_state_dict(state, strict=True)


@pytest.fixture(scope="module")
def pair():
    hf, ours = make_hf(), make_ours()
    load(hf, ours)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD  # the pad token's row is read, so its gradient is compared
    return hf, ours, idx


def grad_diffs(hf, ours, idx) -> dict[str, float]:
    """HF name → max |gradient difference| of the next-token loss, our gradients fused back
    into Hugging Face's layout by the mapping file."""
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    grads = from_card_state(MAPPING, {n: p.grad for n, p in ours.named_parameters()}, N)
    theirs = dict(hf.named_parameters())
    assert set(grads) == set(theirs)
    return {name: max_diff(grads[name], p.grad) for name, p in theirs.items()}


def test_logits_match(pair):
    hf, ours, idx = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, idx = pair
    diffs = grad_diffs(hf, ours, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    assert "transformer.word_embeddings.weight" in diffs  # the pad row's gradient included


def test_a_padding_row_falcon_lacks_is_caught(pair):
    """A negative control: transformers' Falcon gives the pad token's row a gradient (its
    embedding has no padding_idx), so a card that declares that row padding must not match."""
    hf, ours, idx = pair
    broken = make_ours(v_pad=PAD + 1)
    broken.load_state_dict(ours.state_dict(), strict=True)
    diffs = grad_diffs(hf, broken, idx)
    assert diffs["transformer.word_embeddings.weight"] > 1e-3
    assert max(d for n, d in diffs.items() if "word_embeddings" not in n) <= 1e-4


def test_the_qkv_layout_is_what_parity_rests_on(pair):
    """A negative control: the fused query_key_value read as keys first (the key head, the value
    head, then the query heads) must not match."""
    hf, ours, idx = pair
    misread = make_ours()
    misread.load_state_dict(ours.state_dict(), strict=True)
    w = hf.transformer.h[0].self_attention.query_key_value.weight.detach().T
    d = D // H
    with torch.no_grad():
        misread.block[0].attn.W_q.copy_(w[:, 2 * d:])
        misread.block[0].attn.W_k.copy_(w[:, :d])
        misread.block[0].attn.W_v.copy_(w[:, d:2 * d])
        diff = max_diff(misread(idx), hf(idx).logits)
    assert diff > 1e-3, f"a misread qkv layout changed the logits by only {diff:.3e}"


def test_an_untied_falcon_matches_through_its_variant():
    hf, ours = make_hf(tied=False), make_ours(name="FalconUntied")
    mapping = load_mapping(ROOT / "cards" / "falcon.card", "FalconUntied")
    ours.load_state_dict(to_card_state(mapping, hf.state_dict(), ours.state_dict(), N),
                         strict=True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        diff = max_diff(ours(idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_kv_cache_decoding_equals_full_recomputation(pair):
    """Chunks fed through `new_cache()` give the logits of the whole sequence at once, and
    greedy decoding through the cache picks what transformers' cached `generate` picks."""
    hf, ours, idx = pair
    with torch.no_grad():
        full = ours(idx)
        cache = ours.new_cache()
        chunks = [idx[:, :6], idx[:, 6:7], idx[:, 7:8], idx[:, 8:13], idx[:, 13:]]
        rows = torch.cat([ours(c, cache=cache) for c in chunks], dim=-2)
    assert cache.pos == T
    diff = max_diff(rows, full)
    assert diff <= 1e-5, f"cached decoding differs from recomputation by {diff:.3e}"

    prompt = idx[:1, :5]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                           do_sample=False, pad_token_id=PAD)  # the pad token is a token here
        cache, x, got = ours.new_cache(), prompt, prompt
        for _ in range(12):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            got, x = torch.cat([got, nxt], dim=-1), nxt
    assert torch.equal(got, want)


def test_generated_forward_has_no_loop_over_heads():
    """The committed module batches the heads into one SDPA call: no Python loop in any
    forward but the stack of layers."""
    from test_heads import _loops

    text = (ROOT / "generated" / "falcon.py").read_text()
    assert _loops(text) == []
    assert "scaled_dot_product_attention" in text and "def new_cache" in text


def test_the_mapping_reads_what_falcon_7b_config_holds():
    """ffn_hidden_size defaults to 4 × hidden_size; pad_token_id and num_kv_heads change nothing
    in this layout; a config of another layout is refused by name."""
    from cardc.interop.config import check_config, preset_from_config
    from cardc.runtime.errors import RuntimeInputError

    config = make_hf().config.to_dict()
    hypers = preset_from_config(config, MAPPING)
    assert (hypers["D_f"], hypers["v_pad"], hypers["H"]) == (D_F, 0, H)
    del config["ffn_hidden_size"]
    assert preset_from_config(config, MAPPING)["D_f"] == 4 * D
    for key, value in [("new_decoder_architecture", True), ("multi_query", False),
                       ("parallel_attn", False), ("alibi", True), ("bias", True),
                       ("num_ln_in_parallel_attn", 2), ("activation", "relu")]:
        with pytest.raises(RuntimeInputError, match=key):
            check_config({**config, key: value}, MAPPING)


def test_cardc_import_of_a_saved_falcon_matches_its_logits(tmp_path):
    from test_interop import cardc, logits_of_run

    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/falcon.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    idx[:, ::4] = PAD
    with torch.no_grad():
        diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_a_tiny_falcon_trains_and_samples(tmp_path, cli):
    """`cardc train cards/falcon.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/falcon.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training Falcon (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
    assert s.stdout.strip()


def test_the_falcon_7b_preset_counts_what_transformers_counts():
    """`cardc info --preset falcon-7b` equals FalconForCausalLM's count on the meta device at
    tiiuae/falcon-7b's config.json."""
    from test_interop import cardc

    cfg = transformers.FalconConfig(
        vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
        max_position_embeddings=2048, new_decoder_architecture=False, multi_query=True,
        parallel_attn=True, alibi=False, bias=False, tie_word_embeddings=True)
    with torch.device("meta"):
        hf = transformers.FalconForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 6_921_720_704
    r = cardc("info", "cards/falcon.card", "--preset", "falcon-7b")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout


MAP_SITE_ROPE = """1 Q ← X W_q  ▷ Q ∈ ℝ^{T×D}
2 K ← RoPE(X W_k | θ_base = θ_base)  ▷ K ∈ ℝ^{T×d}
3 V ← X W_v  ▷ V ∈ ℝ^{T×d}
4 for h ∈ [H] : Y^h ← CausalHead(RoPE(Q[:, (h − 1) d + 1 : h d] | θ_base = θ_base), K, V)
5 Y ← [Y^1, Y^2, …, Y^H]  ▷ Y ∈ ℝ^{T×D}
6 return Y W_o
"""


def test_rotary_written_at_the_head_map_decodes_with_a_cache(tmp_path):
    """The same attention with RoPE applied where the heads are mapped, not inside the callee
    (the card's AttentionGroup): cached decoding must still equal recomputation."""
    text = (ROOT / "cards" / "falcon.card").read_text()
    body = text[text.index("1 Q ← X W_q"):text.index("Algorithm: Y ← GELUMLP")]
    card = tmp_path / "falcon_map_site.card"
    card.write_text(text.replace(body, MAP_SITE_ROPE + "\n"))
    model = build_model(str(card), "tiny", dict(D=32, D_f=64, N=1), library=str(ROOT / "cards"))
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        for p in model.parameters():  # far from the small initial weights, as trained ones are
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        full = model.eval()(x)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :5], cache=cache), model(x[:, 5:], cache=cache)], dim=-2)
    assert max_diff(rows, full) <= 1e-5
