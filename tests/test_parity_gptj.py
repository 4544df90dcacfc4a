"""Parity: the card-generated GPT-J equals Hugging Face's GPTJForCausalLM number for number.

A small randomly initialised GPTJForCausalLM (no download; 4 heads of width 16, rotary on
interleaved pairs of the first 8 columns of each head, or of all 16, attention projections without biases,
one LayerNorm per block that attention and the MLP both read, a tanh-GELU MLP, an untied
unembedding with a bias) is copied into the model `cards/gptj.card` compiles to, through
`cards/gptj.hf.json`. Every parameter is randomised, the LayerNorm gains and biases and the
logits' bias included. Logits and gradients must agree to fp32 rounding; the same weights with
two query heads swapped, the rotary pairs read as halves, another rotary width or the logits'
bias left out must not. Chunks decoded through the cache equal the whole sequence at once, and
greedy decoding through it picks what transformers' `generate` picks; import → export of a saved
checkpoint is bit for bit, and GPT-J 6B's config.json reads as transformers reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import logits_diff, max_diff, swap_columns  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import from_card_state, load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, D_F, CTX, EPS = 101, 64, 2, 4, 96, 64, 1e-5
HEAD = D // H
D_R = 8  # 8 of each head's 16 columns turned
B, T = 3, 17
MAPPING = load_mapping(ROOT / "cards" / "gptj.card")


def make_hf(d_r: int = D_R):
    config = transformers.GPTJConfig(
        vocab_size=V, n_embd=D, n_layer=N, n_head=H, n_inner=D_F, n_positions=CTX,
        rotary_dim=d_r, layer_norm_epsilon=EPS, activation_function="gelu_new", attn_pdrop=0.0,
        embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPTJForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if ".ln_" in name and name.endswith("weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(d_r: int = D_R):
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, ε=EPS, d_r=d_r)
    model = build_model(str(ROOT / "cards" / "gptj.card"), None, hypers,
                        library=str(ROOT / "cards"))
    return model.float().eval()


def copy_of(ours, d_r: int):
    twin = make_ours(d_r)
    twin.load_state_dict(ours.state_dict(), strict=True)
    return twin


@pytest.fixture(scope="module", params=[D_R, HEAD], ids=["partial", "whole-head"])
def pair(request):
    """(transformers' model, ours with its weights, tokens, the rotary width): rotary on 8
    columns of each head, or on all 16 (rotary_dim = the head's width, nothing passed)."""
    d_r = request.param
    hf, ours = make_hf(d_r), make_ours(d_r)
    state = to_card_state(MAPPING, hf.state_dict(), ours.state_dict(), N, {"H": H})
    ours.load_state_dict(state, strict=True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, idx, d_r


def test_logits_match(pair):
    hf, ours, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    """HF name → max |gradient difference| of the next-token loss, ours mapped back into
    Hugging Face's names by the mapping file; every parameter compared."""
    hf, ours, idx, _ = pair
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    grads = from_card_state(MAPPING, {n: p.grad for n, p in ours.named_parameters()}, N, {"H": H})
    theirs = dict(hf.named_parameters())
    assert set(grads) == set(theirs)
    diffs = {name: max_diff(grads[name], p.grad) for name, p in theirs.items()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    assert {"lm_head.bias", "transformer.h.0.ln_1.bias"} <= set(diffs)


def test_swapped_query_heads_are_caught(pair):
    hf, ours, idx, d_r = pair
    broken = copy_of(ours, d_r)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_rotary_pairs_read_as_halves_are_caught(pair):
    """A negative control: the turned columns of each query and key head reordered from
    interleaved pairs (2i, 2i + 1) to halves (i, d_r/2 + i), as GPT-NeoX's rotate-half lays
    them out. Without RoPE the scores would not change (queries and keys permuted alike); with
    GPT-J's interleaved rotary they must."""
    hf, ours, idx, d_r = pair
    order = torch.cat([torch.arange(0, d_r, 2), torch.arange(1, d_r, 2), torch.arange(d_r, HEAD)])
    broken = copy_of(ours, d_r)
    attn = broken.block[0].attn
    with torch.no_grad():
        for w in (attn.W_q, attn.W_k):
            w.copy_(w.unflatten(-1, (H, HEAD))[..., order].flatten(-2))
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"reading the rotary pairs as halves changed the logits by {diff:.3e}"


def test_another_rotary_width_is_caught(pair):
    """A negative control: rotary on half the columns of each head that rotary_dim says."""
    hf, ours, idx, d_r = pair
    broken = copy_of(ours, d_r // 2)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"halving the rotary width changed the logits by only {diff:.3e}"


def test_the_logits_bias_is_used(pair):
    """A negative control: lm_head's bias left out."""
    hf, ours, idx, d_r = pair
    broken = copy_of(ours, d_r)
    with torch.no_grad():
        broken.b_u.zero_()
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"dropping the logits' bias changed them by only {diff:.3e}"


def test_kv_cache_decoding_equals_full_recomputation(pair):
    """Chunks fed through `new_cache()` give the logits of the whole sequence at once, and
    greedy decoding through the cache picks what transformers' cached `generate` picks."""
    hf, ours, idx, _ = pair
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
                           do_sample=False, pad_token_id=0)
        cache, x, got = ours.new_cache(), prompt, prompt
        for _ in range(12):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            got, x = torch.cat([got, nxt], dim=-1), nxt
    assert torch.equal(got, want)


def test_generated_forward_has_no_loop_over_heads():
    """The committed module batches the heads into one SDPA call and turns the partial
    interleaved rotary by the fused helper: no Python loop in any forward but the stack of
    layers."""
    from test_heads import _loops

    text = (ROOT / "generated" / "gptj.py").read_text()
    assert _loops(text) == []
    assert "scaled_dot_product_attention" in text and "def new_cache" in text
    assert "rotate_pairs(X, theta_base, width=d_r" in text


GPT_J_6B = {  # EleutherAI/gpt-j-6b's config.json, as transformers 4 wrote it
    "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "gradient_checkpointing": False, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_inner": None, "n_layer": 28,
    "n_positions": 2048, "resid_pdrop": 0.0, "rotary": True, "rotary_dim": 64,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50,
                                                 "temperature": 1.0}},
    "tie_word_embeddings": False, "tokenizer_class": "GPT2Tokenizer",
    "transformers_version": "4.18.0.dev0", "use_cache": True, "vocab_size": 50400}


def test_the_mapping_reads_what_gpt_j_6b_config_holds():
    """GPT-J 6B's config.json imports as the preset gpt-j-6b (n_inner null is 4 n_embd); a
    config whose computation the card does not have is refused by name."""
    from cardc.interop import preset_from_config
    from cardc.interop.config import check_config
    from cardc.runtime.errors import RuntimeInputError

    check_config(GPT_J_6B, MAPPING)
    hypers = preset_from_config(GPT_J_6B, MAPPING)
    assert hypers == {"V": 50400, "D": 4096, "H": 16, "N": 28, "ctx": 2048, "ε": 1e-5,
                      "D_f": 16384, "d_r": 64}
    for key, value in [("activation_function", "gelu"), ("tie_word_embeddings", True)]:
        with pytest.raises(RuntimeInputError, match=key):
            check_config({**GPT_J_6B, key: value}, MAPPING)
    with pytest.raises(RuntimeInputError, match="rotary_dim = 63"):  # no pairs to turn
        preset_from_config({**GPT_J_6B, "rotary_dim": 63}, MAPPING)
    with pytest.raises(RuntimeInputError, match="rotary_dim = 258"):  # wider than a head
        preset_from_config({**GPT_J_6B, "rotary_dim": 258}, MAPPING)
    assert preset_from_config({**GPT_J_6B, "rotary_dim": 256}, MAPPING)["d_r"] == 256
    with pytest.raises(RuntimeInputError, match="d_r that is ≤ D / H = 256"):
        preset_from_config({**GPT_J_6B, "rotary_dim": None}, MAPPING)  # n_embd: one head only


def test_the_gpt_j_6b_preset_counts_what_transformers_counts():
    """`cardc info --preset gpt-j-6b` equals GPTJForCausalLM's count on the meta device at
    EleutherAI/gpt-j-6b's config.json."""
    from test_interop import cardc

    cfg = transformers.GPTJConfig(**{k: v for k, v in GPT_J_6B.items()
                                     if k not in ("rotary", "scale_attn_weights")})
    with torch.device("meta"):
        hf = transformers.GPTJForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 6_050_882_784
    r = cardc("info", "cards/gptj.card", "--preset", "gpt-j-6b")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout


def test_import_then_export_of_a_saved_checkpoint_is_bit_exact(tmp_path, capsys):
    """`cardc import` of a saved GPTJForCausalLM matches its logits; `cardc export` gives back
    the very tensors under the very names, and a config.json transformers loads to the same
    numbers."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main

    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code, _, err = run_main(capsys, "import", "cards/gptj.card", "--from",
                                str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
        assert code == 0, err
        with torch.no_grad():
            diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
        assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"
        code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                                  str(tmp_path / "out"))
    assert code == 0, err
    assert "as GPTJForCausalLM" in out
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    assert not [n for n in source if not torch.equal(exported[n], source[n])]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rotary_dim"] == D_R and config["tie_word_embeddings"] is False
    back = transformers.GPTJForCausalLM.from_pretrained(tmp_path / "out").eval()
    want = transformers.GPTJForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert torch.equal(back(idx).logits, want(idx).logits)


def test_a_tiny_gptj_trains_and_samples(tmp_path, cli):
    """`cardc train cards/gptj.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/gptj.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training GPTJ (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr
