"""Parity: the card-generated ModernBERT equals Hugging Face's ModernBertModel and
ModernBertForMaskedLM number for number.

Small randomly initialised transformers models (no download; eager attention, no padding, so no
unpadding) of 8 layers with global_attn_every_n_layers = 3: layers 0, 3 and 6 (from 0, as
transformers counts them) global, over every position with rotary base 1 000 000, the five
others local, each position seeing the local_attention // 2 = 3 positions either side of it in
sequences of 17, with rotary base 10 000, so that each kind occurs more than once and a local
layer follows the last global one. Every parameter is randomised (the LayerNorm gains, which
have no bias, around one), and copied into the models `cards/modernbert.card` compiles to
through `cards/modernbert.hf.json` and its variant for ModernBERTForMaskedLM: transformers'
layer 0, whose attention reads the normalised embeddings without a LayerNorm of its own, is the
card's `first`, its layer i + 1 the card's block.{i}. Hidden states, MLM logits and gradients
must agree to fp32 rounding, the padding row's gradient included; the same weights with
another layer pattern, with no window, with the rotary bases exchanged, with a LayerNorm before
the first layer's attention, with two heads swapped or with a gain reset must not. An encoder
has no KV cache. Import of saved checkpoints computes what they do, and export gives back the
very tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import max_diff, swap_columns  # noqa: E402

from cardc.build import build_model  # noqa: E402
from cardc.interop import load_mapping, to_card_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "modernbert.card"

V, D, N, H, D_F, CTX, WINDOW, EPS = 101, 48, 8, 4, 96, 64, 6, 1e-5
HEAD = D // H
PERIOD = 3  # layers 0, 3 and 6 global: each kind more than once, a local one last
THETA_LOCAL, THETA_GLOBAL = 1e4, 1e6
B, T = 3, 17
PAD = 5  # a pad token (0-based, as transformers counts) that the input holds
TOL = 1e-4

MAPPING = load_mapping(CARD)  # ModernBertModel → ModernBERT
MLM_MAPPING = load_mapping(CARD, "ModernBERTForMaskedLM")  # its variant: the MLM head


def kinds(period: int, layers: int = N) -> list[str]:
    """transformers' default layer_types: layer i (from 0) is full attention when period
    divides i."""
    return ["sliding_attention" if i % period else "full_attention" for i in range(layers)]


KINDS = kinds(PERIOD)
assert KINDS.count("full_attention") == 3 and KINDS[-1] == "sliding_attention"


def make_config(period: int = PERIOD, layers: int = N):
    config = transformers.ModernBertConfig(
        vocab_size=V, hidden_size=D, intermediate_size=D_F, num_hidden_layers=layers,
        num_attention_heads=H, max_position_embeddings=CTX, local_attention=WINDOW,
        global_attn_every_n_layers=period, global_rope_theta=THETA_GLOBAL,
        local_rope_theta=THETA_LOCAL, norm_eps=EPS, pad_token_id=PAD, bos_token_id=None,
        eos_token_id=None, cls_token_id=None, sep_token_id=None)
    assert config.layer_types == kinds(period, layers), config.layer_types
    assert config.sliding_window == WINDOW // 2
    assert not (config.norm_bias or config.attention_bias or config.mlp_bias)
    return config


def randomise(hf):
    """Every parameter random, the LayerNorm gains around one, so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf.float().eval()


def make_hf(cls: str = "ModernBertModel", period: int = PERIOD, layers: int = N):
    config = make_config(period, layers)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomise(getattr(transformers, cls)(config))


def make_ours(name: str = "ModernBERT", period: int = PERIOD, window: int = WINDOW,
              theta_local: float = THETA_LOCAL, theta_global: float = THETA_GLOBAL,
              v_pad: int = PAD + 1):  # the card counts IDs from 1
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, w=window, p=period, ε=EPS,
                  θ_local=theta_local, θ_global=theta_global, v_pad=v_pad)
    model = build_model(str(CARD), None, hypers, library=str(ROOT / "cards"), name=name)
    return model.float().eval()


def copy_into(mapping, hf, ours) -> None:
    """Every HF parameter into `ours` through the mapping, strictly: none left over, none
    missing (the tied decoder weight is the embeddings)."""
    layers = mapping.layer_count(ours.card_meta["hyperparameters"])
    assert layers == N - 1
    names = {e.hf.removeprefix(mapping.base_prefix) if mapping.base_model else e.hf
             for e in mapping.entries(layers)}
    hf_params = set(dict(hf.named_parameters(remove_duplicate=False)))
    assert hf_params == names | set(mapping.tied), hf_params ^ (names | set(mapping.tied))
    state = to_card_state(mapping, hf.state_dict(), ours.state_dict(), layers)
    ours.load_state_dict(state, strict=True)


def card_grads(mapping, hf, ours) -> dict[str, torch.Tensor]:
    """HF's gradients renamed and transposed exactly as its weights are."""
    grads = {n: p.grad for n, p in hf.named_parameters()}
    return to_card_state(mapping, grads, ours.state_dict(), N - 1)


def grad_diffs(mapping, hf, ours) -> dict[str, float]:
    want = card_grads(mapping, hf, ours)
    got = {n: p.grad for n, p in ours.named_parameters()}
    assert set(got) == set(want)
    return {n: max_diff(got[n], want[n]) for n in want}


@pytest.fixture(scope="module")
def idx():
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(7))
    x[:, ::4] = PAD  # the padding row is read, so its gradient is compared
    return x


@pytest.fixture(scope="module")
def base():
    hf, ours = make_hf(), make_ours()
    copy_into(MAPPING, hf, ours)
    return hf, ours


@pytest.fixture(scope="module")
def mlm():
    hf = make_hf("ModernBertForMaskedLM")
    assert hf.decoder.weight is hf.model.embeddings.tok_embeddings.weight
    ours = make_ours("ModernBERTForMaskedLM")
    copy_into(MLM_MAPPING, hf, ours)
    return hf, ours


def hidden(hf, x) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=x).last_hidden_state


def test_each_layer_is_built_as_transformers_layer_types_says(base):
    """The card's layer 0 (`first`) and block i (transformers' layer i + 1) are windowed and
    turned by θ_local exactly where transformers' layer is sliding attention; transformers'
    layer 0 has no attention LayerNorm, and its sliding window is local_attention // 2."""
    hf, ours = base
    built = [(ours.first.lambda_, ours.first.theta_base)] + \
        [(b.lambda_, b.theta_base) for b in ours.block]
    want = [(1, THETA_LOCAL) if k == "sliding_attention" else (0, THETA_GLOBAL) for k in KINDS]
    assert built == want
    assert [layer.attention_type for layer in hf.layers] == KINDS
    assert isinstance(hf.layers[0].attn_norm, torch.nn.Identity)
    assert not hasattr(ours.first, "gamma1")


def test_hidden_states_match(base, idx):
    hf, ours = base
    with torch.no_grad():
        got = ours(idx)
    want = hidden(hf, idx)
    assert got.shape == want.shape == (B, T, D)
    diff = max_diff(got, want)
    assert diff <= TOL, f"max |hidden diff| = {diff:.3e}"


def test_an_all_ones_attention_mask_changes_nothing(base, idx):
    """transformers with an attention mask of ones (its padding path) computes what the card
    does, which has no padding."""
    hf, ours = base
    with torch.no_grad():
        want = hf(input_ids=idx, attention_mask=torch.ones(B, T, dtype=torch.long))
        diff = max_diff(ours(idx), want.last_hidden_state)
    assert diff <= TOL, f"max |hidden diff| = {diff:.3e}"


def test_base_gradients_match(base, idx):
    hf, ours = base
    weight = torch.randn(B, T, D, generator=torch.Generator().manual_seed(11))
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    (hf(input_ids=idx).last_hidden_state * weight).sum().backward()
    (ours(idx) * weight).sum().backward()
    diffs = grad_diffs(MAPPING, hf, ours)
    assert {"first.attn.W_qkv", "block.6.gamma1", "W_e"} <= set(diffs)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_mlm_logits_and_gradients_match(mlm, idx):
    hf, ours = mlm
    labels = torch.full((B, T), -100)
    labels[:, 3] = idx[:, 3]  # a masked-LM loss on two positions per row
    labels[:, 10] = idx[:, 10]
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    want = hf(input_ids=idx, labels=labels)
    got, loss = ours(idx, labels)
    assert got.shape == want.logits.shape == (B, T, V)
    diff = max_diff(got, want.logits)
    assert diff <= TOL, f"max |MLM logits diff| = {diff:.3e}"
    assert abs(loss.item() - want.loss.item()) <= 1e-5
    want.loss.backward()
    loss.backward()
    diffs = grad_diffs(MLM_MAPPING, hf, ours)
    assert {"W_t", "gamma_t", "b_u"} <= set(diffs)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


@pytest.mark.parametrize("change", [
    dict(window=CTX), dict(window=WINDOW - 2), dict(window=WINDOW + 2), dict(period=N + 1),
    dict(period=2), dict(theta_local=THETA_GLOBAL, theta_global=THETA_LOCAL),
    dict(theta_global=THETA_LOCAL)],
    ids=["no window", "narrower window", "wider window", "every layer but the first local",
         "period 2", "bases exchanged", "one base"])
def test_what_makes_it_modernbert_matters(base, idx, change):
    """Negative controls: the local layers unwindowed or windowed one position narrower or
    wider either side, the global layers elsewhere, or the rotary bases confused, must break
    parity."""
    hf, ours = base
    broken = make_ours(**change)
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        diff = max_diff(broken(idx), hidden(hf, idx))
    assert diff > 1e-3, f"{change} changed the hidden states by only {diff:.3e}"


def test_the_first_layers_identity_norm_matters(base, idx):
    """A negative control: transformers' layer 0 given a LayerNorm before its attention (its
    next layer's gains) no longer computes what the card's first block does."""
    hf, ours = base
    broken = make_hf()
    broken.load_state_dict(hf.state_dict(), strict=True)
    norm = torch.nn.LayerNorm(D, eps=EPS, bias=False)
    with torch.no_grad():
        norm.weight.copy_(hf.layers[1].attn_norm.weight)
    broken.layers[0].attn_norm = norm
    with torch.no_grad():
        diff = max_diff(ours(idx), hidden(broken.eval(), idx))
    assert diff > 1e-3, f"a LayerNorm before layer 0's attention changed only {diff:.3e}"


@pytest.mark.parametrize("where", ["first", "block.2", "block.5"])
def test_swapped_heads_are_caught(base, idx, where):
    """A negative control: two query heads of the first (global) layer, or of a local layer,
    swapped in the fused projection."""
    hf, ours = base
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        swap_columns(broken.get_submodule(where).attn.W_qkv, 0, HEAD)
        diff = max_diff(broken(idx), hidden(hf, idx))
    assert diff > 1e-3, f"swapping query heads in {where} changed only {diff:.3e}"


@pytest.mark.parametrize("gain", ["gamma_e", "block.3.gamma1", "first.gamma2", "gamma_f"])
def test_reset_gains_are_caught(base, idx, gain):
    """A negative control: a LayerNorm's gains reset to one."""
    hf, ours = base
    broken = make_ours()
    broken.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        broken.get_parameter(gain).fill_(1.0)
        diff = max_diff(broken(idx), hidden(hf, idx))
    assert diff > 1e-3, f"resetting {gain} changed only {diff:.3e}"


def test_a_card_without_the_padding_row_is_caught(base, idx):
    """A negative control: with v_pad = 0 the pad row takes a gradient transformers does not."""
    hf, ours = base
    broken = make_ours(v_pad=0)
    broken.load_state_dict(ours.state_dict(), strict=True)
    weight = torch.randn(B, T, D, generator=torch.Generator().manual_seed(11))
    hf.zero_grad(set_to_none=True)
    broken.zero_grad(set_to_none=True)
    (hf(input_ids=idx).last_hidden_state * weight).sum().backward()
    (broken(idx) * weight).sum().backward()
    diff = grad_diffs(MAPPING, hf, broken)["W_e"]
    assert diff > 1e-3, "a card without the padding row matched its gradient"


def test_an_encoder_has_no_cache(base, mlm):
    _, ours = base
    _, ours_mlm = mlm
    assert not hasattr(ours, "new_cache") and not hasattr(ours_mlm, "new_cache")


@pytest.mark.parametrize("cls, name", [("ModernBertModel", "ModernBERT"),
                                       ("ModernBertForMaskedLM", "ModernBERTForMaskedLM")])
def test_import_then_export_is_bit_exact(tmp_path, capsys, idx, cls, name):
    """`cardc import` of a saved model of transformers' default period (3, so 8 layers: global
    at 0, 3, 6) chooses the card by its architecture and computes its outputs; `cardc export`
    writes back the very tensors and a config.json transformers loads to the same outputs."""
    from safetensors.torch import load_file
    from test_interop import logits_of_run, run_main

    from cardc.runtime.checkpoint import read_checkpoint

    hf = make_hf(cls)
    hf.save_pretrained(tmp_path / "hf")
    code, _, err = run_main(capsys, "import", "cards/modernbert.card", "--from",
                            str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    meta, _ = read_checkpoint(tmp_path / "run")
    assert meta["name"] == name
    with torch.no_grad():
        want = hf(input_ids=idx)
        want = want.logits if cls.endswith("MaskedLM") else want.last_hidden_state
        diff = max_diff(logits_of_run(tmp_path / "run", idx), want)
    assert diff <= TOL, f"max |output diff| = {diff:.3e}"

    code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                              str(tmp_path / "back"))
    assert code == 0, err
    assert f"as {cls}" in out
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    changed = [n for n in source if exported[n].dtype != source[n].dtype
               or not torch.equal(exported[n], source[n])]
    assert not changed, f"changed by import → export: {changed}"
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["architectures"] == [cls]
    assert config["layer_types"] == KINDS
    assert config["local_attention"] == WINDOW and config["pad_token_id"] == PAD
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == THETA_LOCAL
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == THETA_GLOBAL
    source_model = getattr(transformers, cls).from_pretrained(tmp_path / "hf").eval()
    back = getattr(transformers, cls).from_pretrained(tmp_path / "back").eval()
    assert back.config.layer_types == KINDS
    with torch.no_grad():  # each as transformers loads it, the same attention kernel
        a, b = source_model(input_ids=idx), back(input_ids=idx)
        key = "logits" if cls.endswith("MaskedLM") else "last_hidden_state"
        assert torch.equal(a[key], b[key])


@pytest.mark.parametrize("change, named", [
    ({"global_attn_every_n_layers": 2, "layer_types": None}, "global_attn_every_n_layers"),
    ({"layer_types": kinds(2)}, "layer_types"),
    ({"norm_bias": True}, "norm_bias"),
    ({"hidden_activation": "gelu_pytorch_tanh"}, "hidden_activation"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": THETA_GLOBAL},
                          "sliding_attention": {"rope_type": "default",
                                                "rope_theta": THETA_LOCAL}}}, "rope_type"),
])
def test_import_refuses_what_the_card_does_not_compute(tmp_path, capsys, change, named):
    """Another layer pattern, LayerNorm biases, another activation or a scaled rotary is
    refused by name, not imported silently wrong."""
    from test_interop import run_main

    make_hf().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, _, err = run_main(capsys, "import", "cards/modernbert.card", "--from",
                            str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    assert code == 1 and named in err, err
    assert not (tmp_path / "run").exists()


MODERNBERT_BASE = {  # answerdotai/ModernBERT-base's sizes in a config.json of transformers 4's keys
    "architectures": ["ModernBertForMaskedLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 50281, "classifier_activation": "gelu",
    "classifier_bias": False, "classifier_dropout": 0.0, "classifier_pooling": "mean",
    "cls_token_id": 50281, "decoder_bias": True, "deterministic_flash_attn": False,
    "embedding_dropout": 0.0, "eos_token_id": 50282, "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0, "gradient_checkpointing": False, "hidden_activation": "gelu",
    "hidden_size": 768, "initializer_cutoff_factor": 2.0, "initializer_range": 0.02,
    "intermediate_size": 1152, "layer_norm_eps": 1e-05, "local_attention": 128,
    "local_rope_theta": 10000.0, "max_position_embeddings": 8192, "mlp_bias": False,
    "mlp_dropout": 0.0, "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05,
    "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283,
    "position_embedding_type": "absolute", "reference_compile": True,
    "repad_logits_with_grad": False, "sep_token_id": 50282, "sparse_pred_ignore_index": -100,
    "sparse_prediction": False, "torch_dtype": "float32", "transformers_version": "4.48.0.dev0",
    "vocab_size": 50368}
MODERNBERT_LARGE = {**MODERNBERT_BASE, "hidden_size": 1024, "intermediate_size": 2624,
                    "num_attention_heads": 16, "num_hidden_layers": 28}


@pytest.mark.parametrize("preset, config, counts", [
    ("modernbert-base", MODERNBERT_BASE, (149_014_272, 149_655_232)),
    ("modernbert-large", MODERNBERT_LARGE, (394_781_696, 395_881_664))])
def test_the_presets_are_the_published_models(preset, config, counts):
    """The mapping reads each published config.json as the preset's sizes, and `cardc info
    --preset` counts what transformers counts on the meta device at that config, the base
    model and the one with its MLM head."""
    from test_interop import cardc

    from cardc.interop import preset_from_config

    hypers = preset_from_config(config, MLM_MAPPING)
    for (name, cls), count in zip([("ModernBERT", "ModernBertModel"),
                                   ("ModernBERTForMaskedLM", "ModernBertForMaskedLM")],
                                  counts, strict=True):
        r = cardc("info", "cards/modernbert.card", "--preset", preset, "--name", name)
        assert r.returncode == 0, r.stderr
        line = r.stdout.split("hyperparameters: ")[1].splitlines()[0]
        card = {k: float(v) for k, v in (item.split(" = ") for item in line.split(", "))}
        assert {k: float(v) for k, v in hypers.items()} == card
        cfg = transformers.ModernBertConfig(**config)
        with torch.device("meta"):
            theirs = sum(p.numel() for p in getattr(transformers, cls)(cfg).parameters())
        assert theirs == count
        assert f"parameters: {theirs:,}" in r.stdout
