"""Parity: the card-generated GPT-NeoX equals Hugging Face's GPTNeoXForCausalLM number for number.

A small randomly initialised GPTNeoXForCausalLM (no download; 4 heads of width 16, rotary on the
first 8 columns of each head, biases on every projection, two LayerNorms per block with random
gains and biases, an untied unembedding) is copied into the model `cards/gptneox.card` compiles
to, through `cards/gptneox.hf.json`, whose fused query_key_value (per head: query, key, value) is
split into the card's W_q, W_k, W_v and their biases. Logits and gradients must agree to fp32
rounding, with parallel blocks (`GPTNeoX`, Pythia's) and sequential ones (`GPTNeoXSequential`);
the same weights with two heads swapped, the query_key_value layout misread, another rotary
width, or the other residual form must not. Cached decoding equals recomputation, and import →
export of a saved checkpoint is bit for bit.
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

V, D, N, H, D_F, CTX, THETA, EPS, PCT = 101, 64, 2, 4, 96, 64, 1e4, 1e-5, 0.5
HEAD = D // H
D_R = int(HEAD * PCT)  # 8 of each head's 16 columns turned
B, T = 3, 17
NAMES = {True: "GPTNeoX", False: "GPTNeoXSequential"}


def mapping_of(parallel: bool):
    return load_mapping(ROOT / "cards" / "gptneox.card", NAMES[parallel])


def make_hf(parallel: bool = True):
    config = transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        intermediate_size=D_F, max_position_embeddings=CTX, rotary_pct=PCT,
        rotary_emb_base=THETA, layer_norm_eps=EPS, use_parallel_residual=parallel,
        hidden_act="gelu", attention_dropout=0.0, hidden_dropout=0.0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPTNeoXForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # randomise everything, the LayerNorm gains and biases included
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def make_ours(parallel: bool = True, d_r: int = D_R):
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, ε=EPS, θ_base=THETA, d_r=d_r)
    model = build_model(str(ROOT / "cards" / "gptneox.card"), None, hypers,
                        name=NAMES[parallel], library=str(ROOT / "cards"))
    return model.float().eval()


def hf_state(hf) -> dict[str, torch.Tensor]:
    """The model's tensors under the names its checkpoints hold: transformers 5 loads
    `embed_out.weight` as `lm_head.weight` and saves it back so."""
    return {("embed_out." + n[len("lm_head."):] if n.startswith("lm_head.") else n): t
            for n, t in hf.state_dict().items()}


@pytest.fixture(scope="module", params=[True, False], ids=["parallel", "sequential"])
def pair(request):
    parallel = request.param
    hf, ours = make_hf(parallel), make_ours(parallel)
    state = to_card_state(mapping_of(parallel), hf_state(hf), ours.state_dict(), N, {"H": H})
    ours.load_state_dict(state, strict=True)
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    return hf, ours, idx, parallel


def grad_diffs(hf, ours, idx, parallel: bool) -> dict[str, float]:
    """HF name → max |gradient difference| of the next-token loss, our gradients fused back
    into Hugging Face's layout by the mapping file."""
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    hf(idx, labels=idx).loss.backward()
    ours(idx[:, :-1], idx[:, 1:])[1].backward()
    grads = from_card_state(mapping_of(parallel),
                            {n: p.grad for n, p in ours.named_parameters()}, N, {"H": H})
    theirs = {("embed_out." + n[len("lm_head."):] if n.startswith("lm_head.") else n): p
              for n, p in hf.named_parameters()}
    assert set(grads) == set(theirs)
    return {name: max_diff(grads[name], p.grad) for name, p in theirs.items()}


def test_logits_match(pair):
    hf, ours, idx, _ = pair
    diff = logits_diff(hf, ours, idx, (B, T, V))
    assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_next_token_loss_match(pair):
    hf, ours, idx, parallel = pair
    diffs = grad_diffs(hf, ours, idx, parallel)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-4, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"
    assert "gpt_neox.layers.0.attention.query_key_value.bias" in diffs


def _broken_copy(ours, parallel: bool, d_r: int = D_R):
    broken = make_ours(parallel, d_r)
    broken.load_state_dict(ours.state_dict(), strict=True)
    return broken


def test_swapped_query_heads_are_caught(pair):
    hf, ours, idx, parallel = pair
    broken = _broken_copy(ours, parallel)
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_q, 0, HEAD)
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"swapping query heads changed the logits by only {diff:.3e}"


def test_the_qkv_layout_is_what_parity_rests_on(pair):
    """A negative control: query_key_value read as all queries, then all keys, then all values
    (3 groups of H heads, not H groups of q, k, v) must not match."""
    hf, ours, idx, parallel = pair
    misread = _broken_copy(ours, parallel)
    attn = hf.gpt_neox.layers[0].attention.query_key_value
    w, b = attn.weight.detach().T, attn.bias.detach()
    with torch.no_grad():
        for k, name in enumerate("qkv"):
            getattr(misread.block[0].attn, f"W_{name}").copy_(w[:, k * D:(k + 1) * D])
            getattr(misread.block[0].attn, f"b_{name}").copy_(b[k * D:(k + 1) * D])
        diff = max_diff(misread(idx), hf(idx).logits)
    assert diff > 1e-3, f"a misread qkv layout changed the logits by only {diff:.3e}"


def test_another_rotary_width_is_caught(pair):
    """A negative control: rotary on 4 columns of each head, not the 8 the config says."""
    hf, ours, idx, parallel = pair
    broken = _broken_copy(ours, parallel, d_r=D_R // 2)
    with torch.no_grad():
        diff = max_diff(broken(idx), hf(idx).logits)
    assert diff > 1e-3, f"halving the rotary width changed the logits by only {diff:.3e}"


def test_the_other_residual_form_is_caught(pair):
    """A negative control: the same weights in the other block (parallel ↔ sequential)."""
    hf, ours, idx, parallel = pair
    other = _broken_copy(ours, not parallel)
    with torch.no_grad():
        diff = max_diff(other(idx), hf(idx).logits)
    assert diff > 1e-3, f"the other residual form changed the logits by only {diff:.3e}"


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
    """The committed module batches the heads into one SDPA call: no Python loop in any
    forward but the stack of layers."""
    from test_heads import _loops

    text = (ROOT / "generated" / "gptneox.py").read_text()
    assert _loops(text) == []
    assert "scaled_dot_product_attention" in text and "def new_cache" in text


PYTHIA_160M = {  # EleutherAI/pythia-160m's config.json, as transformers 4 wrote it
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
    "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
    "use_parallel_residual": True, "vocab_size": 50304}


def test_the_mapping_reads_what_a_pythia_config_holds():
    """transformers 4's rotary_pct and rotary_emb_base (every Pythia's config.json) read as
    transformers reads them, and so do transformers 5's rope_parameters; neither given means
    transformers' 0.25 and 10000; the sequential form picks the variant; another layout is
    refused by name."""
    from cardc.interop import load_mappings, preset_from_config, select_for_config
    from cardc.interop.config import check_config
    from cardc.runtime.errors import RuntimeInputError

    mappings = load_mappings(ROOT / "cards" / "gptneox.card")
    mapping = select_for_config(mappings, PYTHIA_160M)
    assert mapping.card == "GPTNeoX"
    hypers = preset_from_config(PYTHIA_160M, mapping)
    want = transformers.GPTNeoXConfig(**PYTHIA_160M)
    assert hypers["d_r"] == int(want.hidden_size // want.num_attention_heads
                                * want.rope_parameters["partial_rotary_factor"]) == 16
    assert hypers["θ_base"] == want.rope_parameters["rope_theta"] == 10000
    bare = {k: v for k, v in PYTHIA_160M.items() if not k.startswith("rotary")}
    assert preset_from_config(bare, mapping)["d_r"] == 16
    assert preset_from_config(bare, mapping)["θ_base"] == 10000
    new = make_hf().config.to_dict()
    assert preset_from_config(new, mapping)["d_r"] == D_R
    assert select_for_config(mappings, make_hf(parallel=False).config.to_dict()).card == \
        "GPTNeoXSequential"
    for key, value in [("hidden_act", "gelu_new"), ("attention_bias", False),
                       ("tie_word_embeddings", True)]:
        with pytest.raises(RuntimeInputError, match=key):
            check_config({**PYTHIA_160M, key: value}, mapping)
    with pytest.raises(RuntimeInputError, match="19.2"):  # 64 × 0.3 is no whole width
        preset_from_config({**PYTHIA_160M, "rotary_pct": 0.3}, mapping)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_import_then_export_of_a_saved_checkpoint_is_bit_exact(parallel, tmp_path, capsys):
    """`cardc import` of a saved GPTNeoXForCausalLM picks the card by use_parallel_residual and
    matches its logits; `cardc export` gives back the very tensors under the very names, and a
    config.json transformers loads to the same numbers."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main

    hf = make_hf(parallel)
    hf.save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code, _, err = run_main(capsys, "import", "cards/gptneox.card", "--from",
                                str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
        assert code == 0, err
        idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            diff = max_diff(logits_of_run(tmp_path / "run", idx), hf(idx).logits)
        assert diff <= 1e-4, f"max |logits diff| = {diff:.3e}"
        code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                                  str(tmp_path / "out"))
    assert code == 0, err
    assert "as GPTNeoXForCausalLM" in out
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    assert not [n for n in source if not torch.equal(exported[n], source[n])]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["use_parallel_residual"] is parallel
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": THETA,
                                         "partial_rotary_factor": PCT}
    back = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "out").eval()
    want = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert torch.equal(back(idx).logits, want(idx).logits)


def test_a_tiny_gptneox_trains_and_samples(tmp_path, cli):
    """`cardc train cards/gptneox.card` trains it (val loss falls); the run samples."""
    from test_interop import cardc

    r = cardc("train", "cards/gptneox.card", "--preset", "tiny", "--set", "D=32",
              "--set", "D_f=64", "--set", "N=1", "--steps", "12", "--eval-every", "12",
              "--batch-size", "4", "--block-size", "16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "training GPTNeoX (" in r.stdout
    first, last = (float(x) for x in r.stdout.split("val loss ")[1].split(" after")[0].split(" -> "))
    assert last < first, r.stdout
    s = cli("sample", str(tmp_path), "--seed", "0", "--tokens", "8")
    assert s.returncode == 0, s.stderr


def test_the_pythia_160m_preset_counts_what_transformers_counts():
    """`cardc info --preset pythia-160m` equals GPTNeoXForCausalLM's count on the meta device
    at EleutherAI/pythia-160m's config.json."""
    from test_interop import cardc

    cfg = transformers.GPTNeoXConfig(**PYTHIA_160M)
    with torch.device("meta"):
        hf = transformers.GPTNeoXForCausalLM(cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert theirs == 162_322_944
    r = cardc("info", "cards/gptneox.card", "--preset", "pythia-160m")
    assert r.returncode == 0, r.stderr
    assert f"parameters: {theirs:,}" in r.stdout
