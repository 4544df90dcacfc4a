"""Parity: the card-generated BLOOM equals Hugging Face's BloomForCausalLM number for number.

A small randomly initialised BloomForCausalLM (no download; 4 heads of width 16, or 6, a head
count that is not a power of two; every LayerNorm gain and bias and every projection bias
random, tied embeddings) is copied into the model
`cards/bloom.card` compiles to, through `cards/bloom.hf.json`, whose fused query_key_value
(each head's query, key and value in turn) is split into the card's W_q, W_k and W_v. The card
writes ALiBi as the paper does, `∀t, t′: S[t, t′] ← S[t, t′] − m · (t − t′)` with the slope
m given to head h: `2^{−8h/c}` for the first c = 2^{⌊log₂ H⌋} heads, the odd-numbered slopes of
2c heads for the rest; transformers adds `m · t′` (the same after the softmax). Logits
and gradients must agree to fp32 rounding; the same weights with the layout misread, or against
transformers with its slopes removed or given to the wrong heads, must not. The generated
module batches the heads into SDPA with the bias as its float mask, and decodes through its KV
cache as recomputation does.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from decodecheck import check_incremental_decoding  # noqa: E402
from parity import max_diff  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import from_card_state, load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, EPS = 101, 64, 2, 4, 1e-5
B, T = 3, 17
SIZES = [(4, 64), (6, 96)]  # (heads, width): a power of two, and a count that is not one
MAPPING = load_mapping(ROOT / "cards" / "bloom.card")


def make_hf(heads: int = H, hidden: int = D):
    config = transformers.BloomConfig(
        vocab_size=V, hidden_size=hidden, n_layer=N, n_head=heads, layer_norm_epsilon=EPS,
        attention_dropout=0.0, hidden_dropout=0.0, pad_token_id=None, bos_token_id=None,
        eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.BloomForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if ("layernorm" in name or "ln_f" in name) and name.endswith("weight") \
                else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(heads: int = H, hidden: int = D):
    hypers = dict(V=V, D=hidden, H=heads, N=N, ε=EPS)
    model = build_model(str(ROOT / "cards" / "bloom.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def load(hf, ours) -> None:
    """The HF weights into ours through the mapping file (the fused qkv split), strictly."""
    state = to_card_state(MAPPING, hf.state_dict(), ours.state_dict(), N, {"H": ours.H})
    ours.load_state_dict(state, strict=True)


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"H={s[0]}")
def pair(request):
    hf, ours = make_hf(*request.param), make_ours(*request.param)
    load(hf, ours)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, idx


def grad_diffs(hf, ours, idx) -> dict[str, float]:
    """HF name → max |gradient difference| of the next-token loss, our gradients fused back
    into Hugging Face's layout by the mapping file."""
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    grads = from_card_state(MAPPING, {n: p.grad for n, p in ours.named_parameters()}, N,
                            {"H": ours.H})
    theirs = dict(hf.named_parameters())
    assert set(grads) == set(theirs)
    return {name: max_diff(grads[name], p.grad) for name, p in theirs.items()}


def test_logits_match(pair):
    hf, ours, idx = pair
    with torch.no_grad():
        diff = max_diff(ours(idx), hf(idx).logits)
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, idx = pair
    diffs = grad_diffs(hf, ours, idx)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", [torch.zeros_like, lambda m: m.flip(0)],
                         ids=["no slopes", "slopes of the wrong heads"])
def test_the_slopes_are_what_parity_rests_on(pair, monkeypatch, change):
    """A negative control: transformers without its ALiBi slopes, or with head h given another
    head's slope, must not match the card."""
    from transformers.models.bloom import modeling_bloom

    hf, ours, idx = pair
    slopes = modeling_bloom._get_alibi_slopes
    monkeypatch.setattr(modeling_bloom, "_get_alibi_slopes",
                        lambda heads, device: change(slopes(heads, device)))
    with torch.no_grad():
        diff = max_diff(ours(idx), hf(idx).logits)
    assert diff > 1e-3, f"changed slopes moved the logits by only {diff:.3e}"


def test_the_qkv_layout_is_what_parity_rests_on(pair):
    """A negative control: query_key_value read as all queries, then all keys, then all values
    (GPT-2's layout, not BLOOM's head by head) must not match."""
    hf, ours, idx = pair
    misread = make_ours(ours.H, ours.D)
    misread.load_state_dict(ours.state_dict(), strict=True)
    D = ours.D
    w = hf.transformer.h[0].self_attention.query_key_value.weight.detach().T
    b = hf.transformer.h[0].self_attention.query_key_value.bias.detach()
    with torch.no_grad():
        for k, role in enumerate("qkv"):
            getattr(misread.block[0].attn, f"W_{role}").copy_(w[:, k * D:(k + 1) * D])
            getattr(misread.block[0].attn, f"b_{role}").copy_(b[k * D:(k + 1) * D])
        diff = max_diff(misread(idx), hf(idx).logits)
    assert diff > 1e-3, f"a misread qkv layout changed the logits by only {diff:.3e}"


def test_kv_cache_decoding_equals_full_recomputation(pair):
    """Chunks fed through `new_cache()` give the logits of the whole sequence at once (the
    bias follows the decoded positions), with gradients; greedy decoding through the cache
    picks what transformers' cached `generate` picks."""
    hf, ours, idx = pair
    with torch.no_grad():
        full = ours(idx)
        cache = ours.new_cache()
        chunks = [idx[:, :6], idx[:, 6:7], idx[:, 7:8], idx[:, 8:13], idx[:, 13:]]
        rows = torch.cat([ours(c, cache=cache) for c in chunks], dim=-2)
    assert cache.pos == T
    diff = max_diff(rows, full)
    assert diff <= 1e-5, f"cached decoding differs from recomputation by {diff:.3e}"
    check_incremental_decoding(ours, [idx])

    prompt = idx[:1, :5]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                           do_sample=False, pad_token_id=0)
        cache, x, got = ours.new_cache(), prompt, prompt
        for _ in range(12):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            got, x = torch.cat([got, nxt], dim=-1), nxt
    assert torch.equal(got, want)


def test_generated_forward_has_no_loop_over_heads():
    """The committed module batches the heads into one SDPA call with the bias as its float
    mask: no Python loop in any forward but the stack of layers, and a KV cache."""
    from test_heads import _loops

    text = (ROOT / "generated" / "bloom.py").read_text()
    assert _loops(text) == []
    assert "def new_cache" in text
    head = next(ast.unparse(f) for f in ast.parse(text).body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("ALiBiCausalHead"))
    assert "grouped_sdpa(Q, K, V, attn_mask=" in head and "softmax" not in head


def test_a_head_count_not_a_power_of_two_is_read_from_the_config():
    """A config with six heads is read as it is, nothing refused; six heads are the case whose
    slopes are not 2^{−8h/H}: transformers gives heads 1–4 those of four heads, 2^{−2h}, and
    heads 5 and 6 the first and third of eight heads', 2^{−1} and 2^{−3} (the parity tests
    above compare the logits those slopes make)."""
    from transformers.models.bloom import modeling_bloom

    from cardc.interop.config import preset_from_config

    assert preset_from_config(make_hf(6, 96).config.to_dict(), MAPPING)["H"] == 6
    want = torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])
    torch.testing.assert_close(modeling_bloom._get_alibi_slopes(6, "cpu").float(), want)


def test_the_mapping_reads_what_a_bloom_config_holds():
    """BLOOM checkpoints' Megatron switches change nothing transformers computes; a config of
    another layout is refused by name."""
    from cardc.interop.config import check_config, preset_from_config
    from cardc.runtime.errors import RuntimeInputError

    config = make_hf().config.to_dict()
    assert preset_from_config(config, MAPPING) == {"V": V, "D": D, "H": H, "N": N, "ε": EPS}
    megatron = dict(attention_softmax_in_fp32=True, bias_dropout_fusion=True,
                    masked_softmax_fusion=True, skip_bias_add=True, skip_bias_add_qkv=False,
                    offset_alibi=100, n_inner=None, unk_token_id=0, pretraining_tp=4)
    check_config({**config, **megatron}, MAPPING)
    for key, value in [("apply_residual_connection_post_layernorm", True),
                       ("slow_but_exact", True), ("tie_word_embeddings", False)]:
        with pytest.raises(RuntimeInputError, match=key):
            check_config({**config, key: value}, MAPPING)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"H={s[0]}")
def test_import_then_export_is_bit_exact(tmp_path, capsys, sizes):
    """`cardc import` of a saved BLOOM computes its logits; `cardc export` gives back the very
    tensors under the very names (query_key_value fused again, head by head), and a config
    transformers loads into a model that computes exactly what the source does."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main
    from test_interop_families import from_pretrained

    hf = make_hf(*sizes)
    hf.save_pretrained(tmp_path / "hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code, _, err = run_main(capsys, "import", "cards/bloom.card", "--from",
                                str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
        assert code == 0, err
        code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                                  str(tmp_path / "out"))
    assert code == 0, err
    assert "as BloomForCausalLM" in out
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = hf(idx).logits
        assert max_diff(logits_of_run(tmp_path / "run", idx), want) <= 1e-4
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    assert all(torch.equal(exported[n], source[n]) for n in source)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["architectures"], config["n_head"], config["tie_word_embeddings"]) == \
        (["BloomForCausalLM"], sizes[0], True)
    family = type("Family", (), {"cls": "BloomForCausalLM"})
    back = from_pretrained(family, tmp_path / "out")
    with torch.no_grad():
        assert torch.equal(back(idx).logits, want)


def test_a_tiny_bloom_trains_and_samples(tmp_path, cli):
    """`cardc train cards/bloom.card` trains it (val loss falls) and the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/bloom.card", "--preset", "tiny", "--set", "D=32",
              "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training BLOOM (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
    assert s.stdout.strip()


def test_the_bloom_560m_preset_counts_what_transformers_counts():
    """`cardc info --preset bloom-560m` equals BloomForCausalLM's count on the meta device at
    bigscience/bloom-560m's config.json."""
    from test_interop import cardc

    cfg = transformers.BloomConfig(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16)
    with torch.device("meta"):
        hf = transformers.BloomForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 559_214_592
    r = cardc("info", "cards/bloom.card", "--preset", "bloom-560m")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout


def test_six_heads_compute_what_the_interpreter_says_the_card_means(tmp_path):
    """At six heads (c = 4: two heads of the interleaved slopes), the generated module, fused
    and literal, equals the reference interpreter, values and gradients in float64."""
    from test_reproducers import B as EXAMPLES
    from test_reproducers import Built

    built = Built(tmp_path, (ROOT / "cards" / "bloom.card").read_text(encoding="utf-8"),
                  V=13, D=12, H=6, N=1)
    x = torch.randint(0, 13, (EXAMPLES, 5), generator=torch.Generator().manual_seed(3))
    built.agree(x, tokens=True)
