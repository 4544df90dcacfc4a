"""What a mapping file can say beyond names: hyperparameters computed from config keys (exactly,
and solved back on export), fused tensors laid out head by head or group by group, and the
refusal of a config key nobody maps, fixes or knows to be harmless.

Most checks use synthetic configs and tensors; where `transformers` has the layout (GPT-NeoX,
Falcon), a random-weight model's own tensors are split and compared with what its module
computes.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch

from cardc.interop import (
    config_for,
    from_card_state,
    load_mapping,
    load_mappings,
    parse_mapping,
    preset_from_config,
    select_for_config,
    to_card_state,
)
from cardc.interop import expr as ex
from cardc.interop.harmless import HARMLESS_KEYS, NOT_HARMLESS_BASE_KEYS
from cardc.names import identifier
from cardc.runtime.errors import RuntimeInputError

try:
    import transformers
except ImportError:  # the synthetic checks run without it
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers")

ROOT = Path(__file__).resolve().parent.parent


def mapping(hypers: dict, tensors: dict | None = None, **more) -> object:
    raw = {"card": "X", "architecture": "XForCausalLM", "model_type": "x",
           "hyperparameters": hypers, "tensors": tensors or {"w": "W"}, **more}
    return parse_mapping(raw, "x.hf.json")


def bits(value) -> tuple[type, bytes]:
    return type(value), struct.pack("<d", value) if isinstance(value, float) else str(value).encode()


# ------------------------------------------------------------------ expressions


def test_expressions_parse_evaluate_and_render():
    e = ex.parse("rope_parameters.partial_rotary_factor · (hidden_size / num_heads) − 1")
    assert ex.names(e) == ["rope_parameters.partial_rotary_factor", "hidden_size", "num_heads"]
    env = {"rope_parameters.partial_rotary_factor": ex.exact(0.4), "hidden_size": ex.exact(80),
           "num_heads": ex.exact(4)}
    assert ex.evaluate(e, env) == 7  # 0.4 is 2/5 exactly: 2/5 · 20 − 1
    assert ex.render(e) == "(rope_parameters.partial_rotary_factor * (hidden_size / num_heads)) - 1"
    assert ex.evaluate(ex.parse("max(a // 3, min(2, -a))"), {"a": ex.exact(10)}) == 3
    assert ex.evaluate(ex.parse("1e3 * .5"), {}) == 500
    assert ex.names(ex.parse("θ_base × 2")) == ["θ_base"]  # a card's hyperparameter, Greek


@pytest.mark.parametrize("text, message", [
    ("", "empty expression"),
    ("a +", "expected a value but found the end"),
    ("(a", "expected ) but found the end"),
    ("a $ b", "unexpected '$'"),
    ("min(a b)", "expected ) but found 'b'"),
    ("3 4", "unexpected '4'"),
    ("__import__('os')", "unexpected '''"),
])
def test_bad_expressions_are_named(text, message):
    with pytest.raises(ex.ExprError, match=re.escape(message)):
        ex.parse(text)


@pytest.mark.parametrize("text, name, why", [
    ("a * a", "a", "'a' occurs 2 times"),
    ("b // a", "a", "'a' is inside //"),
    ("max(a, 1)", "a", "'a' is inside max()"),
    ("b + 1", "a", "it does not read 'a'"),
])
def test_what_cannot_be_solved(text, name, why):
    assert ex.solvable(ex.parse(text), name) == why


@pytest.mark.parametrize("text, value, others, want", [
    ("x + 1", 6, {}, 5), ("1 - x", 6, {}, -5), ("x - 1", 6, {}, 7), ("2 * x", 6, {}, 3),
    ("x / 4", 6, {}, 24), ("12 / x", 6, {}, 2), ("(x + b) * b", 20, {"b": 4}, 1), ("-x", 3, {}, -3),
])
def test_solving_inverts_every_operator(text, value, others, want):
    env = {k: ex.exact(v) for k, v in others.items()}
    got = ex.solve(ex.parse(text), "x", ex.exact(value), env)
    assert got == want and ex.evaluate(ex.parse(text), {**env, "x": got}) == value


def test_a_bad_expression_names_the_mapping_file_and_key():
    with pytest.raises(RuntimeInputError, match=re.escape(
            "x.hf.json: hyperparameter 'd_r': unexpected '^' in 'head_dim ^ 2'")):
        mapping({"d_r": {"expr": "head_dim ^ 2"}})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "x.hf.json: hyperparameter 'd_r': cannot solve 'a * a' for 'a': 'a' occurs 2 times")):
        mapping({"d_r": {"expr": "a * a", "solve": "a"}})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "hyperparameter 'd_r': 'a * b' reads 2 keys nothing else writes (a, b): 'solve' must "
            "name the one export writes")):
        mapping({"d_r": {"expr": "a * b"}})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "x.hf.json: fixed_config 'head_dim': expected a value but found the end in 'D /'")):
        mapping({"D": "hidden_size"}, fixed_config={"head_dim": {"expr": "D /"}})


# ------------------------------------------------------------------ computed hyperparameters

ROTARY = {"D": "hidden_size", "H": "num_attention_heads", "d": "head_dim",
          "d_r": {"expr": "head_dim * rope_parameters.partial_rotary_factor", "type": "float"}}


@pytest.mark.parametrize("head_dim, factor, d_r", [(16, 0.25, 4), (20, 0.4, 8), (10, 0.3, 3),
                                                   (64, 1.0, 64), (96, 0.5, 48)])
def test_computed_hyperparameter_round_trips_bit_exact(head_dim, factor, d_r):
    """d_r = head_dim · partial_rotary_factor; export solves partial_rotary_factor = d_r / head_dim.
    0.3 · 10 is 3.0000000000000004 in floating point: evaluated exactly it is 3."""
    m = mapping(ROTARY)
    config = {"hidden_size": 4 * head_dim, "num_attention_heads": 4, "head_dim": head_dim,
              "rope_parameters": {"partial_rotary_factor": factor}}
    hypers = preset_from_config(config, m)
    assert hypers["d_r"] == d_r and type(hypers["d_r"]) is int
    back = config_for(m, hypers)
    got = back["rope_parameters"]["partial_rotary_factor"]
    assert bits(got) == bits(factor), (got, factor)
    assert {k: back[k] for k in config} == config


def test_integer_keys_are_solved_back_as_integers():
    """G = num_attention_heads / num_key_value_heads: export writes num_key_value_heads = H / G."""
    m = mapping({"H": "num_attention_heads",
                 "G": {"expr": "num_attention_heads / num_key_value_heads"}})
    config = {"num_attention_heads": 12, "num_key_value_heads": 4}
    hypers = preset_from_config(config, m)
    assert hypers == {"H": 12, "G": 3}
    back = config_for(m, hypers)
    assert back["num_key_value_heads"] == 4 and type(back["num_key_value_heads"]) is int


def test_an_expression_with_no_free_key_is_checked_on_export():
    m = mapping({"D": "hidden_size", "H": "num_attention_heads",
                 "d": {"expr": "hidden_size / num_attention_heads"}})
    assert config_for(m, {"D": 64, "H": 4, "d": 16})["hidden_size"] == 64
    with pytest.raises(RuntimeInputError, match=re.escape(
            "the card's d = 8, but the config written gives hidden_size / num_attention_heads = 16")):
        config_for(m, {"D": 64, "H": 4, "d": 8})


def test_a_missing_key_is_named_with_the_hyperparameter():
    m = mapping(ROTARY)
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json lacks 'rope_parameters.partial_rotary_factor' (the card's d_r = "
            "head_dim * rope_parameters.partial_rotary_factor)")):
        preset_from_config({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}, m)
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json has head_dim = 'wide' (the card's d); expected a number")):
        preset_from_config({"hidden_size": 64, "num_attention_heads": 4, "head_dim": "wide",
                            "rope_parameters": {"partial_rotary_factor": 0.5}}, m)


def test_a_default_applies_when_a_key_is_absent():
    m = mapping({"D": "hidden_size", "H": "num_attention_heads",
                 "d_r": {"expr": "head_dim * partial_rotary_factor",
                         "default": "hidden_size / num_attention_heads * partial_rotary_factor",
                         "solve": "partial_rotary_factor"}})
    config = {"hidden_size": 64, "num_attention_heads": 4, "partial_rotary_factor": 0.25}
    assert preset_from_config(config, m)["d_r"] == 4
    assert preset_from_config({**config, "head_dim": 32}, m)["d_r"] == 8


def test_defaults_are_tried_in_order():
    """A list of defaults: the first whose keys are all present applies (a Falcon-7B config
    has neither rope_parameters nor rope_theta: transformers' own default, 10000, applies)."""
    m = mapping({"θ_base": {"key": "rope_parameters.rope_theta",
                            "default": ["rope_theta", "10000"]}})
    assert preset_from_config({"rope_parameters": {"rope_theta": 5e5}}, m)["θ_base"] == 5e5
    assert preset_from_config({"rope_theta": 1e6}, m)["θ_base"] == 1e6
    assert preset_from_config({}, m)["θ_base"] == 10000
    strict = mapping({"θ_base": {"key": "rope_parameters.rope_theta",
                                 "default": ["rope_theta", "base * 2"]}})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json lacks 'rope_theta' (the card's θ_base's default)")):
        preset_from_config({}, strict)


def test_a_default_list_holds_expressions():
    with pytest.raises(RuntimeInputError, match="'default' must be an expression or a list"):
        mapping({"D": {"key": "hidden_size", "default": [64]}})


# ------------------------------------------------------------------ the padding row's ID

PAD = {"V": "vocab_size", "P": {"expr": "pad_token_id + 1", "null": 0}}


@pytest.mark.parametrize("config, p", [
    ({"vocab_size": 50, "pad_token_id": None}, 0),
    ({"vocab_size": 50}, 0),
    ({"vocab_size": 50, "pad_token_id": 0}, 1),
    ({"vocab_size": 50, "pad_token_id": 49}, 50),
])
def test_pad_token_id_becomes_the_padding_row_and_back(config, p):
    """pad_token_id (0-based, null or absent for none) ↔ P: 0 for no padding row, k for the
    token with 1-based ID k."""
    m = mapping(PAD)
    hypers = preset_from_config(config, m)
    assert hypers == {"V": 50, "P": p}
    back = config_for(m, hypers)
    assert back["pad_token_id"] == config.get("pad_token_id")
    assert preset_from_config(back, m) == hypers


def test_computed_value_that_is_not_whole_is_refused_by_name():
    """GPT-2's D_f computed as n_embd · mlp_ratio: 48 · 3.5625 = 171 builds, · 3.51 does not."""
    from cardc.build import checked, find_card, library_roots
    from cardc.interop import check_sizes

    card = str(ROOT / "cards" / "gpt2.card")
    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    raw["hyperparameters"]["D_f"] = {"expr": "n_embd * mlp_ratio"}
    m = parse_mapping(raw, "gpt2.hf.json")
    config = {"vocab_size": 64, "n_embd": 48, "n_head": 4, "n_layer": 1, "n_positions": 16,
              "layer_norm_epsilon": 1e-5, "mlp_ratio": 3.5625}
    lib, checker, _ = checked([card], library_roots([card], None))
    info = checker.info(find_card(lib, checker, card, "GPT2"))
    held = {"w": torch.zeros(10**6)}
    hypers = preset_from_config(config, m)
    assert hypers["D_f"] == 171
    check_sizes(info, m, hypers, None, {}, held)
    hypers = preset_from_config({**config, "mlp_ratio": 3.51}, m)
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json gives n_embd * mlp_ratio = 168.48; the card's D_f must be a whole "
            "number")):
        check_sizes(info, m, hypers, None, {}, held)


# ------------------------------------------------------------------ fused tensors

D, H, HKV, HD = 8, 4, 2, 3  # model width, query heads, key/value heads, head width


def fused_mapping(groups: str, parts: list) -> object:
    tensors = {"qkv.weight": {"fused": {"axis": 1, "groups": groups, "parts": parts},
                              "transpose": True},
               "qkv.bias": {"fused": {"axis": 0, "groups": groups, "parts": parts_of_bias(parts)}}}
    return mapping({"H": "n_head", "H_kv": "n_kv"}, tensors)


def parts_of_bias(parts: list) -> list:
    return [p.replace("W_", "b_") if isinstance(p, str) else [p[0].replace("W_", "b_"), p[1]]
            for p in parts]


def card_state(widths: dict[str, int]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, width in widths.items():
        out[f"W_{name}"] = torch.randn(D, width, generator=gen)
        out[f"b_{name}"] = torch.randn(width, generator=gen)
    return out


def reference_layout(state, order: list[list[tuple[str, int]]]) -> torch.Tensor:
    """The fused (out, in) weight built by hand: for each group, the listed (role, head) rows."""
    rows = [state[f"W_{role}"][:, h * HD:(h + 1) * HD].T for group in order for role, h in group]
    return torch.cat(rows, dim=0)


LAYOUTS = {
    # GPT-NeoX and Falcon (classic): per head, its q, k and v
    "per-head": ("H", ["W_q", "W_k", "W_v"], {"q": H * HD, "k": H * HD, "v": H * HD},
                 [[("q", h), ("k", h), ("v", h)] for h in range(H)]),
    # Falcon's new architecture: per key/value group, its H/H_kv query heads, one k, one v
    "per-group": ("H_kv", ["W_q", "W_k", ["W_v", "3"]],
                  {"q": H * HD, "k": HKV * HD, "v": HKV * HD},
                  [[*[("q", g * 2 + j) for j in range(2)], ("k", g), ("v", g)]
                   for g in range(HKV)]),
    # Falcon's multi-query: every query head, then one k, then one v
    "multi-query": ("1", ["W_q", "W_k", "W_v"], {"q": H * HD, "k": HD, "v": HD},
                    [[*[("q", h) for h in range(H)], ("k", 0), ("v", 0)]]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_layouts_split_and_join_bit_exact(layout):
    groups, parts, widths, order = LAYOUTS[layout]
    m = fused_mapping(groups, parts)
    state = card_state(widths)
    hypers = {"H": H, "H_kv": HKV}
    hf = from_card_state(m, state, 0, hypers)
    assert torch.equal(hf["qkv.weight"], reference_layout(state, order))
    back = to_card_state(m, hf, state, 0, hypers)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_a_card_tensor_named_by_several_parts_is_cut_in_order():
    """A fused card W_qkv = [Q | K | V] from GPT-NeoX's per-head layout."""
    m = mapping({"H": "n_head"}, {"qkv.weight": {"fused": {"axis": 1, "groups": "H", "parts": [
        "W_qkv", "W_qkv", "W_qkv"]}, "transpose": True}})
    w = torch.randn(D, 3 * H * HD, generator=torch.Generator().manual_seed(2))
    hf = from_card_state(m, {"W_qkv": w}, 0, {"H": H})
    per_head = hf["qkv.weight"].reshape(H, 3, HD, D)
    for h in range(H):
        for r in range(3):
            assert torch.equal(per_head[h, r], w[:, r * H * HD + h * HD:][:, :HD].T)
    assert torch.equal(to_card_state(m, hf, {"W_qkv": w}, 0, {"H": H})["W_qkv"], w)


def test_bad_fused_tensors_are_named():
    groups, parts, widths, _ = LAYOUTS["per-group"]
    m = fused_mapping(groups, parts)
    state = card_state(widths)
    hf = from_card_state(m, state, 0, {"H": H, "H_kv": HKV})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "tensor 'qkv.weight' has shape (23, 8); the card's W_q, W_k, W_v need (24, 8)")):
        to_card_state(m, {**hf, "qkv.weight": hf["qkv.weight"][1:]}, state, 0,
                      {"H": H, "H_kv": HKV})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "tensor 'qkv.weight': the card's W_k has 6 along axis 1, not 1 × 4 groups of 1.5")):
        from_card_state(m, state, 0, {"H": H, "H_kv": 4})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "tensor 'qkv.weight': 'H_kv' reads 'H_kv', which is no hyperparameter of the card")):
        from_card_state(m, state, 0, {"H": H})
    wrong = fused_mapping(groups, ["W_q", "W_k", ["W_v", "HD - 1"]])
    with pytest.raises(RuntimeInputError, match=re.escape(
            "tensor 'qkv.weight': 'HD - 1' reads 'HD', which is no hyperparameter of the card")):
        from_card_state(wrong, state, 0, {"H": H, "H_kv": HKV})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "tensor 'qkv.weight': the card's W_v has 6 along axis 1, not 1 × 2 groups of 2")):
        from_card_state(wrong, state, 0, {"H": H, "H_kv": HKV, "HD": HD})
    with pytest.raises(RuntimeInputError, match="tensor 'w': 'fused' names its card tensors"):
        mapping({"H": "n"}, {"w": {"card": "W", "fused": {"parts": ["a", "b"]}}})
    with pytest.raises(RuntimeInputError, match="'fused' 'parts' must list two or more"):
        mapping({"H": "n"}, {"w": {"fused": {"parts": ["a"]}}})


@needs_transformers
def test_gpt_neox_query_key_value_splits_into_what_its_module_computes(monkeypatch):
    """GPT-NeoX's query_key_value is per head (q, k, v): the split W_q, W_k, W_v (and biases)
    project a random input to exactly the queries, keys and values its attention receives."""
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    config = transformers.GPTNeoXConfig(vocab_size=50, hidden_size=D * 2, num_attention_heads=H,
                                        num_hidden_layers=1, intermediate_size=32,
                                        attn_implementation="eager")
    torch.manual_seed(0)
    attn = transformers.GPTNeoXForCausalLM(config).gpt_neox.layers[0].attention.eval()
    hd = 2 * D // H
    m = mapping({"H": "num_attention_heads"}, {
        "w": {"fused": {"axis": 1, "groups": "H", "parts": ["W_q", "W_k", "W_v"]},
              "transpose": True},
        "b": {"fused": {"axis": 0, "groups": "H", "parts": ["b_q", "b_k", "b_v"]}}})
    expected = {f"{p}_{r}": torch.empty(2 * D, H * hd) if p == "W" else torch.empty(H * hd)
                for p in "Wb" for r in "qkv"}
    hf = {"w": attn.query_key_value.weight.detach(), "b": attn.query_key_value.bias.detach()}
    card = to_card_state(m, hf, expected, 0, {"H": H})
    seen = {}

    def capture(module, query, key, value, *args, **kwargs):
        seen.update(q=query, k=key, v=value)
        return torch.zeros(query.shape[0], query.shape[2], H, hd), None

    monkeypatch.setattr(neox, "eager_attention_forward", capture)
    x = torch.randn(2, 5, 2 * D)
    no_rotation = (torch.ones(2, 5, hd), torch.zeros(2, 5, hd))  # position 0's angles
    with torch.no_grad():
        attn(x, attention_mask=None, position_embeddings=no_rotation)
    for r in "qkv":
        mine = (x @ card[f"W_{r}"] + card[f"b_{r}"]).reshape(2, 5, H, hd).transpose(1, 2)
        assert torch.allclose(mine, seen[r], atol=1e-6), r
    assert torch.equal(from_card_state(m, card, 0, {"H": H})["w"], hf["w"])


@needs_transformers
@pytest.mark.parametrize("new_arch, n_kv", [(True, 2), (False, 1), (False, None)])
def test_falcon_query_key_value_splits_into_what_its_module_computes(new_arch, n_kv):
    """Falcon's three layouts: grouped (new architecture, H_kv groups), multi-query (one group),
    and classic per head. The split projections equal its own `_split_heads`."""
    multi_query = n_kv == 1
    config = transformers.FalconConfig(
        vocab_size=50, hidden_size=2 * D, num_attention_heads=H, num_hidden_layers=1,
        new_decoder_architecture=new_arch, multi_query=multi_query,
        num_kv_heads=n_kv if new_arch else None, bias=True)
    torch.manual_seed(0)
    attn = transformers.FalconForCausalLM(config).transformer.h[0].self_attention.eval()
    hd, kv = 2 * D // H, (n_kv or H)
    groups = {True: "H_kv", False: "1"}[new_arch] if n_kv else "H"
    m = mapping({"H": "num_attention_heads", "H_kv": "num_kv_heads"}, {
        "w": {"fused": {"axis": 1, "groups": groups, "parts": ["W_q", "W_k", "W_v"]},
              "transpose": True},
        "b": {"fused": {"axis": 0, "groups": groups, "parts": ["b_q", "b_k", "b_v"]}}})
    widths = {"q": H * hd, "k": kv * hd, "v": kv * hd}
    expected = {f"{p}_{r}": torch.empty(2 * D, widths[r]) if p == "W" else torch.empty(widths[r])
                for p in "Wb" for r in "qkv"}
    hf = {"w": attn.query_key_value.weight.detach(), "b": attn.query_key_value.bias.detach()}
    hypers = {"H": H, "H_kv": kv}
    card = to_card_state(m, hf, expected, 0, hypers)
    x = torch.randn(2, 5, 2 * D)
    with torch.no_grad():
        q, k, v = attn._split_heads(attn.query_key_value(x))
    want = {"q": q.reshape(2, 5, H, hd)}
    for r, t in (("k", k), ("v", v)):  # the new architecture repeats each group's k, v per query
        t = t.reshape(2, 5, -1, hd)
        want[r] = t[:, :, ::H // kv] if new_arch else t
    for r in "qkv":
        mine = (x @ card[f"W_{r}"] + card[f"b_{r}"]).reshape(2, 5, -1, hd)
        assert torch.allclose(mine, want[r], atol=1e-6), r
    back = from_card_state(m, card, 0, hypers)
    assert torch.equal(back["w"], hf["w"]) and torch.equal(back["b"], hf["b"])


# ------------------------------------------------------------------ no silent mis-import


@needs_transformers
def test_harmless_keys_cover_the_base_config():
    """Every key of a default PretrainedConfig is decided: harmless, or left to each mapping."""
    base = set(transformers.PretrainedConfig().to_dict())
    assert base - HARMLESS_KEYS - NOT_HARMLESS_BASE_KEYS == set()


TINY = dict(vocab_size=50, max_position_embeddings=32)
CONFIGS = {
    "gpt2": ("GPT2Config", dict(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2)),
    "llama": ("LlamaConfig", dict(TINY, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", dict(TINY, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2)),
    "bert": ("BertConfig", dict(TINY, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                num_attention_heads=4)),
    "bart": ("BartConfig", dict(TINY, d_model=16, encoder_layers=1, decoder_layers=1,
                                encoder_attention_heads=2, decoder_attention_heads=2,
                                encoder_ffn_dim=24, decoder_ffn_dim=24)),
}


def full_config(family: str, **changes) -> dict:
    cls, sizes = CONFIGS[family]
    return getattr(transformers, cls)(**sizes, **changes).to_dict()


@needs_transformers
@pytest.mark.parametrize("family", list(CONFIGS))
def test_default_configs_of_each_family_import(family):
    """A default config of each architecture, every key as to_dict() has it, is understood."""
    mappings = load_mappings(ROOT / "cards" / f"{family}.card")
    config = full_config(family)
    m = select_for_config(mappings, config)
    assert preset_from_config(config, m)


LLAMA_REFUSED = [
    (dict(attention_bias=True), "config.json has attention_bias = True, but the card Llama computes "),
    (dict(mlp_bias=True), "config.json has mlp_bias = True"),
    (dict(head_dim=8), "config.json has head_dim = 8, but the card LlamaUntied computes head_dim = "
                       "hidden_size / num_attention_heads = 4"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "config.json has rope_parameters.rope_type = 'linear'"),
]


@needs_transformers
@pytest.mark.parametrize("changes, message", LLAMA_REFUSED)
def test_llama_configs_that_change_the_math_are_refused(changes, message):
    with pytest.raises(RuntimeInputError, match=re.escape(message)):
        select_for_config(load_mappings(ROOT / "cards" / "llama.card"),
                          full_config("llama", **changes))


@needs_transformers
@pytest.mark.parametrize("family, key, value, shown", [
    ("llama", "rope_parameters.partial_rotary_factor", 0.5, "0.5"),
    ("llama", "sliding_window", 16, "16"),
    ("qwen2", "qk_layernorm", True, "True"),
    ("gpt2", "n_embd_scale", 2, "2"),
    ("bert", "position_embedding_type", "relative_key", None),
    ("bart", "relative_attention_num_buckets", 32, "32"),
])
def test_a_key_nobody_understands_is_refused_by_name(family, key, value, shown):
    config = full_config(family)
    mappings = load_mappings(ROOT / "cards" / f"{family}.card")
    source = select_for_config(mappings, config).source
    *path, last = key.split(".")
    obj = config
    for part in path:
        obj = obj[part]
    obj[last] = value
    with pytest.raises(RuntimeInputError) as err:
        preset_from_config(config, select_for_config(mappings, config))
    if shown is None:  # fixed by the mapping: refused as a fixed value
        assert f"config.json has {key} = {value!r}" in str(err.value)
        return
    assert str(err.value) == (
        f"config key '{key}' = {shown} is not understood by {source}: it maps it "
        "to no hyperparameter, fixes no value for it and does not list it as harmless")


@needs_transformers
def test_a_refused_key_is_one_line_from_the_command_line(tmp_path, capsys):
    """`cardc import` of a Llama whose config has partial rotary: exit 1, one line, the key."""
    from test_interop_families import FAMILIES, make_hf

    from cardc.cli import main

    fam = FAMILIES["llama-tied"]
    make_hf("llama-tied", fam).save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # its progress bar
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["rope_parameters"]["partial_rotary_factor"] = 0.5
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code = main(["import", fam.card, "--from", str(tmp_path / "hf"), "--out",
                     str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("cardc: error: config key 'rope_parameters.partial_rotary_factor' = "
                          "0.5 is not understood by cards/llama.hf.json")
    assert not (tmp_path / "run").exists()


@needs_transformers
def test_a_fused_per_group_checkpoint_imports_into_a_card_and_back():
    """A Llama checkpoint whose q, k and v are fused per key/value group (Falcon's layout) imports
    into cards/llama.card's separate W_q, W_k, W_v through a mapping alone: the same logits as
    transformers', and export fuses the very tensors back."""
    from test_interop_families import FAMILIES, H_KV, H, N, V, make_hf

    from cardc.build import build_model
    from cardc.runtime.checkpoint import load_state

    hf_model = make_hf("llama-tied", FAMILIES["llama-tied"])
    state = dict(hf_model.state_dict())
    hd, g = hf_model.config.hidden_size // H, H // H_KV
    for i in range(N):
        pre = f"model.layers.{i}.self_attn."
        q, k, v = (state.pop(pre + f"{r}_proj.weight") for r in "qkv")
        groups = [q.reshape(H_KV, g * hd, -1), k.reshape(H_KV, hd, -1), v.reshape(H_KV, hd, -1)]
        state[pre + "qkv.weight"] = torch.cat(groups, dim=1).reshape(-1, q.shape[1])
    raw = json.loads((ROOT / "cards" / "llama.hf.json").read_text())
    tensors = {k: v for k, v in raw["tensors"].items() if not re.search(r"\.[qkv]_proj\.", k)}
    tensors["model.layers.{i}.self_attn.qkv.weight"] = {"transpose": True, "fused": {
        "axis": 1, "groups": "H_kv", "parts": ["block.{i}.attn.W_q", "block.{i}.attn.W_k",
                                               "block.{i}.attn.W_v"]}}
    m = parse_mapping({**raw, "tensors": tensors}, "fused.hf.json")
    config = hf_model.config.to_dict()
    hypers = preset_from_config(config, select_for_config([m], config))
    model = build_model(str(ROOT / "cards" / "llama.card"), None, hypers, name="Llama").eval()
    recorded = model.card_meta["hyperparameters"]
    load_state(model, to_card_state(m, state, model.state_dict(), N, recorded))
    x = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (model(x) - hf_model(x).logits).abs().max().item()
    assert diff <= 1e-4, diff
    back = from_card_state(m, model.state_dict(), N, recorded)
    assert set(back) == set(state) - {"lm_head.weight"}
    assert all(torch.equal(back[k], state[k]) for k in back)


def test_every_unknown_key_is_listed():
    m = mapping({"D": "hidden_size"})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config key 'a' = [1, 2] is not understood by x.hf.json: it maps it to no "
            "hyperparameter, fixes no value for it and does not list it as harmless (nor are "
            "b, d)")):
        preset_from_config({"hidden_size": 8, "a": [1, 2], "b": {"c": None}, "d": 1,
                            "use_cache": True, "_commit_hash": "x"}, m)
    assert preset_from_config({"hidden_size": 8, "b": {"c": 1}}, mapping(
        {"D": "hidden_size"}, harmless=["b.c"])) == {"D": 8}


# keys a default config leaves null where transformers' own forward needs a number (DeepSeek-V2's
# top-k: torch.topk(k=None) fails): the mapping refuses null, naming the key
UNRUNNABLE_DEFAULTS = {"deepseek_v2": {"num_experts_per_tok": 6}}


@needs_transformers
@pytest.mark.parametrize("path", sorted((ROOT / "cards").rglob("*.hf.json")),
                         ids=lambda p: p.name)
def test_every_mapping_understands_its_default_config(path):
    """Each mapping (each variant too) takes the default config transformers makes for its
    model_type, with the values the mapping fixes set: every key is mapped, fixed or harmless."""
    from cardc.interop.config import store

    for m in load_mappings(path.with_name(path.name.removesuffix(".hf.json") + ".card")):
        config = transformers.AutoConfig.for_model(m.model_type).to_dict()
        config.update(UNRUNNABLE_DEFAULTS.get(m.model_type, {}))
        for key, accepted in m.fixed_config.items():
            store(config, key, accepted[0])
        config["architectures"] = [m.architecture]
        assert select_for_config([m], config) is m
        assert set(preset_from_config(config, m)) == set(m.hyperparameters)


def test_a_key_in_either_place_transformers_has_kept_it():
    """transformers 5 nests partial_rotary_factor in rope_parameters, 4 kept it at the top: the
    expression reads the nested key, its default the top-level one; export writes the nested."""
    m = mapping({"D": "hidden_size", "H": "num_attention_heads", "d_r": {
        "expr": "hidden_size / num_attention_heads * rope_parameters.partial_rotary_factor",
        "default": "hidden_size / num_attention_heads * partial_rotary_factor",
        "type": "float"}})
    old = {"hidden_size": 80, "num_attention_heads": 4, "partial_rotary_factor": 0.4}
    new = {"hidden_size": 80, "num_attention_heads": 4,
           "rope_parameters": {"partial_rotary_factor": 0.4}}
    assert preset_from_config(old, m) == preset_from_config(new, m) == {"D": 80, "H": 4, "d_r": 8}
    back = config_for(m, {"D": 80, "H": 4, "d_r": 8})
    assert bits(back["rope_parameters"]["partial_rotary_factor"]) == bits(0.4)


# ------------------------------------------------------------------ layer indices


PAIRED = {"model.layers.{2i}.w": "local.{i}.W", "model.layers.{2*i + 1}.w": "global_.{i}.W",
          "model.layers.{2·i+1}.b": "global_.{i}.b", "final.{3i + 2}": "extra.{i}.F"}


def test_layer_indices_are_affine_in_the_card_layer():
    """{2i} and {2i+1} (in any spelling) name Hugging Face's even and odd layers from the
    card's pair i; `layers` counts the pairs, an expression of the hyperparameters."""
    m = mapping({"N": "num_hidden_layers"}, PAIRED, layers="N/2",
                ignore=["model.layers.{2i+1}.rotary.inv_freq"])
    assert m.layer_count({"N": 6}) == 3
    got = {e.hf: e.card for e in m.entries(3)}
    assert got["model.layers.4.w"] == "local.2.W" and got["model.layers.5.w"] == "global_.2.W"
    assert got["model.layers.3.b"] == "global_.1.b" and got["final.8"] == "extra.2.F"
    assert sorted(h for h in got if h.endswith(".w")) == [f"model.layers.{k}.w" for k in range(6)]
    assert m.ignored("model.layers.7.rotary.inv_freq")
    assert not m.ignored("model.layers.x.rotary.inv_freq")


def test_a_layer_count_that_is_not_whole_is_refused_by_name():
    m = mapping({"N": "num_hidden_layers"}, PAIRED, layers="N/2")
    with pytest.raises(RuntimeInputError, match=re.escape(
            "the layers of x.hf.json number N / 2 = 2.5 (N = 5), not a whole number")):
        m.layer_count({"N": 5})


@pytest.mark.parametrize("name, message", [
    ("l.{2i+}.w", "tensor 'l.{2i+}.w': layer index '{2i+}' in 'l.{2i+}.w': expected a value"),
    ("l.{j}.w", "layer index '{j}' in 'l.{j}.w': an index may only read the layer i, not 'j'"),
    ("l.{i/2}.w", "layer index '{i/2}' in 'l.{i/2}.w': 'i/2' is not a·i + b with whole a, b ≥ 0"),
    ("l.{i*i}.w", "'i*i' is not a·i + b"),
    ("l.{1 - i}.w", "'1 - i' is not a·i + b"),
])
def test_a_malformed_layer_index_is_one_clear_error(name, message):
    with pytest.raises(RuntimeInputError) as err:
        mapping({"N": "num_hidden_layers"}, {name: "b.{i}.W"}, layers="N")
    assert str(err.value).startswith("x.hf.json: ") and message in str(err.value), err.value


@pytest.mark.parametrize("layers, message", [
    ("M/2", "'layers': 'M' is not a hyperparameter of this mapping"),
    ("N/", "'layers': expected a value but found the end in 'N/'"),
    (None, "names with {i} need 'layers', the hyperparameter (or an expression"),
])
def test_a_bad_layer_count_is_named(layers, message):
    more = {} if layers is None else {"layers": layers}
    with pytest.raises(RuntimeInputError, match=re.escape(message)):
        mapping({"N": "num_hidden_layers"}, PAIRED, **more)


def test_two_indices_that_name_one_tensor_are_refused():
    m = mapping({"N": "num_hidden_layers"}, {"l.{2i}.w": "a.{i}.W", "l.{i}.w": "b.{i}.W"},
                layers="N")
    with pytest.raises(RuntimeInputError, match=re.escape(
            "'l.0.w' is named twice (as the card's a.0.W and b.0.W)")):
        m.entries(3)


def test_paired_layers_import_and_export_bit_exact():
    """Tensors move between Hugging Face's layers 0…3 and the card's two stacks of two."""
    m = mapping({"N": "num_hidden_layers"}, {"l.{2i}.w": "local.{i}.W",
                                             "l.{2i+1}.w": {"card": "global_.{i}.W",
                                                            "transpose": True}}, layers="N/2")
    hf = {f"l.{k}.w": torch.randn(3, 2) * (k + 1) for k in range(4)}
    expected = {f"{s}.{i}.W": torch.empty(3, 2) if s == "local" else torch.empty(2, 3)
                for s in ("local", "global_") for i in range(2)}
    state = to_card_state(m, hf, expected, m.layer_count({"N": 4}))
    assert torch.equal(state["global_.1.W"], hf["l.3.w"].T)
    assert torch.equal(state["local.1.W"], hf["l.2.w"])
    back = from_card_state(m, state, 2, {})
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)


CYCLE = {"layer_types": {"cycle": ["sliding_attention", "full_attention"],
                         "length": "num_hidden_layers"}}


@pytest.mark.parametrize("types, ok", [
    (None, True), (["sliding_attention", "full_attention"] * 2, True),
    (["full_attention"] * 4, False), (["sliding_attention", "full_attention"], False),
    (["full_attention", "sliding_attention"] * 2, False),
])
def test_a_per_layer_list_must_cycle_as_the_card_computes(types, ok):
    m = mapping({"N": "num_hidden_layers"}, fixed_config=CYCLE)
    config = {"num_hidden_layers": 4, **({} if types is None else {"layer_types": types})}
    if ok:
        assert preset_from_config(config, m) == {"N": 4}
        return
    with pytest.raises(RuntimeInputError, match=re.escape(
            f"config.json has layer_types = {types!r}, but the card X computes "
            "'sliding_attention', 'full_attention' in turn, layer after layer")):
        preset_from_config(config, m)


def test_a_cycle_is_written_on_export():
    m = mapping({"N": "num_hidden_layers"}, fixed_config=CYCLE)
    assert config_for(m, {"N": 3})["layer_types"] == ["sliding_attention", "full_attention",
                                                      "sliding_attention"]
    with pytest.raises(RuntimeInputError, match="'cycle' must be a non-empty list"):
        mapping({"N": "num_hidden_layers"}, fixed_config={"t": {"cycle": [], "length": "1"}})


@needs_transformers
def test_gemma2_refuses_layers_that_do_not_alternate():
    """The card pairs a sliding layer with a full one: any other layer_types is refused."""
    ms = load_mappings(ROOT / "cards" / "gemma2.card")
    config = transformers.Gemma2Config(num_hidden_layers=4,
                                       layer_types=["full_attention"] * 4).to_dict()
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json has layer_types = ['full_attention', 'full_attention', 'full_attention', "
            "'full_attention'], but the card Gemma2 computes")):
        select_for_config(ms, config)
    m = select_for_config(ms, transformers.Gemma2Config(num_hidden_layers=4).to_dict())
    assert m.layer_count(preset_from_config(
        transformers.Gemma2Config(num_hidden_layers=4).to_dict(), m)) == 2


# ------------------------------------------------------------------ one place per value


@pytest.mark.parametrize("more, message", [
    (dict(fixed_config={"n_head": [1, 2]}),
     "x.hf.json: config key 'n_head' is both hyperparameter 'H' and in 'fixed_config': a value "
     "is set in one place"),
    (dict(export_config={"n_head": 4}),
     "x.hf.json: config key 'n_head' is both hyperparameter 'H' and in 'export_config': a value "
     "is set in one place"),
    (dict(fixed_config={"n_head": {"expr": "n_embd / 4"}}),
     "x.hf.json: config key 'n_head' is both hyperparameter 'H' and in 'fixed_config'"),
    (dict(fixed_config={"attn": None}, hyperparameters={"H": "attn.n_head"}),
     "x.hf.json: config key 'attn.n_head' is both hyperparameter 'H' and in 'fixed_config' (as "
     "'attn')"),
    (dict(fixed_config={"d_head": 4}, hyperparameters={"d": {"expr": "n_embd / d_head",
                                                             "solve": "d_head"}}),
     "x.hf.json: config key 'd_head' is both hyperparameter 'd' and in 'fixed_config'"),
])
def test_a_key_set_in_two_places_is_a_load_error_naming_both(more, message):
    hypers = more.pop("hyperparameters", {"H": "n_head"})
    with pytest.raises(RuntimeInputError) as err:
        mapping({"D": "n_embd", **hypers}, **more)
    assert str(err.value).startswith(message)


def test_a_variant_that_fixes_a_hyperparameter_key_is_refused():
    from cardc.interop import parse_mappings

    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text())
    raw["variants"] = {"GPT2Heads": {"fixed_config": {"n_head": [1, 2]}}}
    with pytest.raises(RuntimeInputError, match=re.escape(
            "gpt2.hf.json (variant GPT2Heads): config key 'n_head' is both hyperparameter 'H' "
            "and in 'fixed_config'")):
        parse_mappings(raw, "gpt2.hf.json")


# ------------------------------------------------------------------ constraints


CONSTRAINED = {"D": "hidden_size", "H": "num_attention_heads", "d_r": "rotary_dim"}


@pytest.mark.parametrize("constraint, config, why", [
    ({"H": {"power_of_two": True}}, dict(num_attention_heads=6),
     "config.json has num_attention_heads = 6, but x.hf.json maps only a card's H that is a "
     "power of two"),
    ({"d_r": {"max": "D / H - 1"}}, dict(rotary_dim=16),
     "config.json has rotary_dim = 16, but x.hf.json maps only a card's d_r that is ≤ D / H - 1 "
     "= 15"),
    ({"d_r": {"min": 2}}, dict(rotary_dim=1),
     "config.json has rotary_dim = 1, but x.hf.json maps only a card's d_r that is ≥ 2"),
    ({"d_r": {"multiple_of": "2"}}, dict(rotary_dim=5),
     "config.json has rotary_dim = 5, but x.hf.json maps only a card's d_r that is a whole "
     "multiple of 2"),
    ({"H": {"one_of": [1, 2, 4]}}, dict(num_attention_heads=3),
     "config.json has num_attention_heads = 3, but x.hf.json maps only a card's H that is one "
     "of 1, 2, 4"),
])
def test_a_config_outside_the_constraints_is_refused_by_name(constraint, config, why):
    m = mapping(CONSTRAINED, constraints=constraint)
    ok = {"hidden_size": 64, "num_attention_heads": 4, "rotary_dim": 8}
    assert preset_from_config(ok, m) == {"D": 64, "H": 4, "d_r": 8}
    with pytest.raises(RuntimeInputError) as err:
        preset_from_config({**ok, **config}, m)
    assert str(err.value) == why
    with pytest.raises(RuntimeInputError) as err:  # and export refuses such a model
        config_for(m, {"D": 64, "H": 4, "d_r": 8, **{
            {"num_attention_heads": "H", "rotary_dim": "d_r"}[k]: v for k, v in config.items()}})
    assert "but x.hf.json maps only a card's" in str(err.value)


@pytest.mark.parametrize("constraint, message", [
    ({"Q": {"min": 1}}, "'constraints': 'Q' is not a hyperparameter of this mapping"),
    ({"H": {"min": "Q"}}, "'constraints': 'H' reads 'Q', which is not a hyperparameter"),
    ({"H": {"least": 1}}, "'constraints': constraint of 'H' must be an object of 'min', 'max', "
                          "'multiple_of', 'power_of_two', 'one_of'"),
    ({"H": {"min": "1 +"}}, "'constraints': expected a value but found the end in '1 +'"),
    ({"H": {"power_of_two": 1}}, "'power_of_two' must be true or false"),
    ({"H": {"one_of": []}}, "'one_of' must be a non-empty list of numbers"),
    ({"H": {"one_of": ["a"]}}, "'a' is not a number"),
    (["H"], "'constraints' must map hyperparameters to objects"),
])
def test_a_malformed_constraint_is_named(constraint, message):
    with pytest.raises(RuntimeInputError) as err:
        mapping(CONSTRAINED, constraints=constraint)
    assert str(err.value).startswith("x.hf.json: ") and message in str(err.value)


def test_stablelm2_refuses_a_rotary_width_wider_than_the_head(tmp_path, capsys):
    """partial_rotary_factor 1.5 asks d_r = 12 columns of a head of 8: the mapping's
    constraint names the config key at import; without it, the card's own size check does.
    (A factor of 1, d_r = d, is legal: tests/test_parity_stablelm2.py imports it.)"""
    from cardc.build import build_model
    from cardc.cli import main
    from cardc.interop import load_mapping, write_model_hf

    sizes = dict(V=16, D=16, H=2, H_kv=1, D_f=8, N=1, ctx=8, d_r=4)
    model = build_model(str(ROOT / "cards" / "stablelm2.card"), None, sizes)
    write_model_hf(load_mapping(ROOT / "cards" / "stablelm2.card"), model.state_dict(),
                   model.card_meta["hyperparameters"], tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5  # d_r = 4 of d = 8
    config["rope_parameters"]["partial_rotary_factor"] = 1.5
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    cards = tmp_path / "cards"
    cards.mkdir()
    raw = json.loads((ROOT / "cards" / "stablelm2.hf.json").read_text())
    shutil.copy(ROOT / "cards" / "stablelm2.card", cards)
    del raw["constraints"]
    (cards / "stablelm2.hf.json").write_text(json.dumps(raw))
    errors = []
    for card in ("cards/stablelm2.card", cards / "stablelm2.card"):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(ROOT)
            code = main(["import", str(card), "--from", str(tmp_path / "hf"), "--out",
                         str(tmp_path / "run"), "--library", str(ROOT / "cards")])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and not (tmp_path / "run").exists(), err
        errors.append(err)
    assert errors[0] == (
        "cardc: error: config.json gives hidden_size / num_attention_heads * "
        "rope_parameters.partial_rotary_factor = 12, but cards/stablelm2.hf.json maps only a "
        "card's d_r that is ≤ D / H = 8\n")
    assert errors[1].startswith("cardc: error: config.json has hidden_size = 16: d − d_r = -4 "
                                "(d = 8, d_r = 12) is not positive"), errors[1]


def test_a_model_is_built_by_card_name_and_a_bad_override_is_named():
    import cardc
    from cardc.presets import OverrideError

    model = cardc.model(str(ROOT / "cards" / "llama.card"), name="LlamaUntied", V=16, D=8, H=2,
                        H_kv=1, D_f=8, N=1, ctx=8)
    assert model.card_meta["name"] == "LlamaUntied"
    with pytest.raises(OverrideError) as err:
        cardc.model(str(ROOT / "cards" / "gpt2.card"), preset="tiny", D="wide")
    assert str(err.value) == "D='wide': a hyperparameter's value is a number, not str"


# ------------------------------------------------------------------ shared lists: harmless, renamed


def test_keys_that_only_set_initialisation_or_loading_never_block_an_import():
    """One shared list (cardc/interop/harmless.py): no mapping names them."""
    m = mapping({"D": "hidden_size"})
    config = {"hidden_size": 8, "init_std": 0.02, "initializer_range": 0.02,
              "initializer_factor": 1.0, "auto_map": {"AutoConfig": "x.XConfig"},
              "torch_dtype": "float32", "transformers_version": "4.44.0",
              "architectures": ["XForCausalLM"], "custom_pipelines": {}}
    assert preset_from_config(config, m) == {"D": 8}
    bart = json.loads((ROOT / "cards" / "bart.hf.json").read_text())
    assert "init_std" not in bart["harmless"] and "init_std" in HARMLESS_KEYS


ROPE = {"D": "hidden_size", "H": "num_attention_heads",
        "θ_base": {"key": "rope_parameters.rope_theta", "default": "10000"},
        "d_r": {"expr": "hidden_size / num_attention_heads * rope_parameters.partial_rotary_factor",
                "type": "float"}}
V5 = {"hidden_size": 64, "num_attention_heads": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                          "partial_rotary_factor": 0.25}}
V4 = [{"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 500.0, "rope_scaling": None,
       "partial_rotary_factor": 0.25},
      {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 500.0,
       "rope_scaling": {"type": "default"}, "partial_rotary_factor": 0.25}]
FIXED_V5 = {"rope_parameters.rope_type": "default"}
FIXED_V4 = {"rope_scaling": None, "rope_scaling.rope_type": [None, "default"]}


@pytest.mark.parametrize("fixed", [FIXED_V5, FIXED_V4], ids=["v5-mapping", "v4-mapping"])
@pytest.mark.parametrize("config", [V5, *V4], ids=["v5", "v4-null", "v4-type"])
def test_both_spellings_of_a_renamed_key_are_read_and_the_current_one_written(fixed, config):
    m = mapping(ROPE, fixed_config=fixed)
    assert preset_from_config(config, m) == {"D": 64, "H": 4, "θ_base": 500.0, "d_r": 4}
    back = config_for(m, {"D": 64, "H": 4, identifier("θ_base"): 500.0, "d_r": 4})
    assert back == {"architectures": ["XForCausalLM"], "model_type": "x", **V5} or \
        back == {"architectures": ["XForCausalLM"], "model_type": "x",
                 **{**V5, "rope_parameters": {k: v for k, v in V5["rope_parameters"].items()
                                              if k != "rope_type"}}}  # left to its default
    assert "rope_scaling" not in back and "rope_theta" not in back


def test_a_value_given_two_ways_that_differ_is_refused():
    m = mapping(ROPE, fixed_config=FIXED_V5)
    with pytest.raises(RuntimeInputError) as err:
        preset_from_config({**V5, "rope_theta": 10000.0}, m)
    assert str(err.value) == ("config.json has rope_theta = 10000.0 and "
                              "rope_parameters.rope_theta = 500.0: two spellings of one value "
                              "that differ")
    with pytest.raises(RuntimeInputError, match=re.escape(
            "config.json has rope_scaling.type = 'linear', but the card X computes "
            "rope_parameters.rope_type = 'default'")):
        preset_from_config({**V4[0], "rope_scaling": {"type": "linear", "factor": 2.0}}, m)


def test_no_nested_null_is_exported():
    """A nested key whose accepted values start with null is left out: never {rope_type: null},
    which from_pretrained refuses."""
    m = mapping({"D": "hidden_size"}, fixed_config={"rope_parameters.rope_type":
                                                     [None, "default"]})
    assert config_for(m, {"D": 8}) == {"architectures": ["XForCausalLM"], "model_type": "x",
                                       "hidden_size": 8}


@needs_transformers
def test_a_transformers_4_llama_config_imports_as_its_transformers_5_spelling():
    """What transformers 4.44 wrote for a Llama (top-level rope_theta, rope_scaling null) and
    what the installed transformers writes give the same hyperparameters; export writes the
    installed spelling, which from_pretrained reads back with the same rotary base."""
    import tempfile

    mappings = load_mappings(ROOT / "cards" / "llama.card")
    new = full_config("llama", rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    old.update(rope_theta=500.0, rope_scaling=None)
    m = select_for_config(mappings, old)
    hypers = preset_from_config(old, m)
    assert hypers == preset_from_config(new, select_for_config(mappings, new))
    written = config_for(m, {identifier(k): v for k, v in hypers.items()})
    assert "rope_scaling" not in written and written["rope_parameters"] == {
        "rope_type": "default", "rope_theta": 500.0}
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(written))
        assert transformers.AutoConfig.from_pretrained(folder).rope_parameters == {
            "rope_type": "default", "rope_theta": 500.0}


def test_a_solved_factor_a_float_cannot_hold_is_refused_on_export():
    """d_r = 3 of a head of 7 needs partial_rotary_factor = 3/7, which no JSON number holds:
    import would read back a d_r that is not whole. Export refuses instead of writing it."""
    m = mapping({"D": "hidden_size", "H": "num_attention_heads", "d_r": {
        "expr": "hidden_size / num_attention_heads * partial_rotary_factor", "type": "float"}})
    with pytest.raises(RuntimeInputError) as err:
        config_for(m, {"D": 28, "H": 4, "d_r": 3})
    assert str(err.value) == (
        "cannot write the card's d_r = 3 as hidden_size / num_attention_heads * "
        f"partial_rotary_factor: partial_rotary_factor would be 3/7 = {3 / 7!r}, which "
        "config.json cannot hold exactly")
    written = config_for(m, {"D": 28, "H": 4, "d_r": 7})  # in the current spelling
    assert written["rope_parameters"]["partial_rotary_factor"] == 1.0


# ------------------------------------------------------------------ further indices (experts)


EXPERTS = {"model.layers.{i}.moe.experts.{j}.w1.weight": {"card": "block.{i}.moe.theta.{j}.W_1",
                                                          "transpose": True},
           "model.layers.{i}.moe.gate.weight": {"card": "block.{i}.moe.W_g", "transpose": True},
           "shared.{2j + 1}.w": "shared.{j}.W"}


def test_a_second_index_expands_each_expert_of_each_layer():
    """`indices` {"j": "E"}: one line maps every expert of every layer."""
    m = mapping({"N": "num_hidden_layers", "E": "num_local_experts"}, EXPERTS, layers="N",
                indices={"j": "E"})
    counts = m.index_counts({"N": 2, "E": 3})
    assert counts == {"j": 3}
    got = {e.hf: e.card for e in m.entries(2, counts)}
    assert got["model.layers.1.moe.experts.2.w1.weight"] == "block.1.moe.theta.2.W_1"
    assert got["model.layers.0.moe.gate.weight"] == "block.0.moe.W_g"
    assert got["shared.5.w"] == "shared.2.W"
    assert len(got) == 2 * 3 + 2 + 3


def test_experts_import_and_export_bit_exact_and_a_missing_one_is_named():
    m = mapping({"N": "num_hidden_layers", "E": "num_local_experts"},
                {"l.{i}.e.{j}.w": {"card": "b.{i}.t.{j}.W", "transpose": True}}, layers="N",
                indices={"j": "E"})
    hf = {f"l.{i}.e.{j}.w": torch.randn(3, 2) * (i + 2 * j + 1) for i in range(2)
          for j in range(3)}
    expected = {f"b.{i}.t.{j}.W": torch.empty(2, 3) for i in range(2) for j in range(3)}
    state = to_card_state(m, hf, expected, 2, {"N": 2, "E": 3})
    assert torch.equal(state["b.1.t.2.W"], hf["l.1.e.2.w"].T)
    back = from_card_state(m, state, 2, {"N": 2, "E": 3})
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    with pytest.raises(RuntimeInputError, match=re.escape(
            "missing tensor 'l.0.e.3.w' (the card's b.0.t.3.W): the checkpoint's sizes give 4 "
            "members of 'j' (E)")):
        to_card_state(m, hf, expected, 2, {"N": 2, "E": 4})
    with pytest.raises(RuntimeInputError, match=re.escape(
            "the checkpoint's sizes give 1,000,000,000 members of 'j' (E), but it holds 6 "
            "tensors")):
        to_card_state(m, hf, expected, 2, {"N": 2, "E": 10**9})


LATER = {"l.{i}.w": "dense.{i}.W", "l.{m + N_d}.w": {"card": "moe.{m}.W", "transpose": True},
         "l.{m + N_d}.e.{j}.w": "moe.{m}.t.{j}.W"}
LATER_HYPERS = {"N": "num_hidden_layers", "N_d": "first_k_dense_replace", "E": "n_experts"}


def test_an_index_may_start_after_a_hyperparameter():
    """Two block kinds in one layer list: the first N_d layers are the card's dense.{i}, the
    rest, `l.{m + N_d}`, its moe.{m} counted from 0; import and export bit exact."""
    m = mapping(LATER_HYPERS, LATER, layers="N_d", indices={"m": "N - N_d", "j": "E"})
    hypers = {"N": 4, "N_d": 1, "E": 2}
    hf = {"l.0.w": torch.randn(2, 2), **{f"l.{k}.w": torch.randn(3, 2) for k in (1, 2, 3)},
          **{f"l.{k}.e.{j}.w": torch.randn(2) for k in (1, 2, 3) for j in (0, 1)}}
    expected = {"dense.0.W": torch.empty(2, 2), **{f"moe.{k}.W": torch.empty(2, 3)
                                                   for k in range(3)},
                **{f"moe.{k}.t.{j}.W": torch.empty(2) for k in range(3) for j in (0, 1)}}
    state = to_card_state(m, hf, expected, 1, hypers)
    assert torch.equal(state["dense.0.W"], hf["l.0.w"])
    assert torch.equal(state["moe.0.W"], hf["l.1.w"].T)
    assert torch.equal(state["moe.2.t.1.W"], hf["l.3.e.1.w"])
    back = from_card_state(m, state, 1, hypers)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    none_dense = {k.replace("moe.", "x."): v for k, v in state.items() if k != "dense.0.W"}
    got = from_card_state(m, {k.replace("x.", "moe."): v for k, v in none_dense.items()}, 0,
                          {"N": 3, "N_d": 0, "E": 2})
    assert sorted(got) == sorted(f"l.{k - 1}.{rest}" for k in (1, 2, 3)
                                 for rest in ("w", "e.0.w", "e.1.w"))
    with pytest.raises(RuntimeInputError, match=re.escape(
            "missing tensor 'l.4.w' (the card's moe.3.W): the checkpoint's sizes give 4 members "
            "of 'm' (N - N_d)")):
        to_card_state(m, hf, expected, 1, {"N": 5, "N_d": 1, "E": 2})


@pytest.mark.parametrize("tensors, message", [
    ({"l.{N_d + m}.w": "moe.{m}.W"}, "index '{N_d + m}' in 'l.{N_d + m}.w': 'N_d + m' reads "
                                     "a hyperparameter before its index: write m first"),
    ({"l.{m + F}.w": "moe.{m}.W"}, "index '{m + F}' in 'l.{m + F}.w': an index reads one of "
                                   "i or m or j, not 'F'"),
    ({"l.{m - N_d}.w": "moe.{m}.W"}, "index '{m - N_d}' in 'l.{m - N_d}.w': 'm - N_d' is "
                                     "not a·m + b + c·N_d with whole a, b, c ≥ 0"),
    ({"l.{m * N_d}.w": "moe.{m}.W"}, "index '{m * N_d}' in 'l.{m * N_d}.w': 'm * N_d' is "
                                     "not a·m + b + c·N_d with whole a, b, c ≥ 0"),
])
def test_a_bad_hyperparameter_in_an_index_is_one_clear_error(tensors, message):
    with pytest.raises(RuntimeInputError) as err:
        mapping(LATER_HYPERS, tensors, layers="N_d", indices={"m": "N - N_d", "j": "E"})
    assert str(err.value) == f"x.hf.json: tensor '{next(iter(tensors))}': {message}"


@pytest.mark.parametrize("indices, tensors, message", [
    ({"j": "F"}, EXPERTS, "x.hf.json: 'indices' 'j': 'F' is not a hyperparameter of this "
                          "mapping"),
    ({"i": "E"}, EXPERTS, "x.hf.json: 'indices': 'i' cannot name an index"),
    ({"j k": "E"}, EXPERTS, "x.hf.json: 'indices': 'j k' cannot name an index"),
    ({"j": 3}, EXPERTS, "x.hf.json: 'indices' 'j': its count must be a string"),
    (["j"], EXPERTS, "x.hf.json: 'indices' must be an object: index → its count"),
    ({"j": "E"}, {"l.{i}.e.{k}.w": "b.{i}.t.{k}.W"},
     "x.hf.json: tensor 'l.{i}.e.{k}.w': index '{k}' in 'l.{i}.e.{k}.w': an index reads one "
     "of i or j, not 'k'"),
    ({"j": "E"}, {"l.{i}.e.{j}.w": "b.{i}.t.W"},
     "x.hf.json: tensor 'l.{i}.e.{j}.w': index '{j}' is in only one of it and the card's "
     "'b.{i}.t.W'"),
    ({"j": "E"}, {"l.{i + j}.w": "b.{i}.t.{j}.W"},
     "x.hf.json: tensor 'l.{i + j}.w': index '{i + j}' in 'l.{i + j}.w': an index reads one "
     "of i or j, not 'j'"),
])
def test_a_bad_second_index_is_one_clear_error(indices, tensors, message):
    with pytest.raises(RuntimeInputError) as err:
        mapping({"N": "num_hidden_layers", "E": "num_local_experts"}, tensors, layers="N",
                indices=indices)
    assert str(err.value) == message or str(err.value).startswith(message), err.value


def test_a_misspelt_entry_key_is_refused(tmp_path):
    """`"tranpose": true` must not load the square matrix untransposed without a word."""
    import json

    from cardc.interop.mapping import parse_mapping

    raw = json.loads((ROOT / "cards" / "gpt2.hf.json").read_text(encoding="utf-8"))
    raw["tensors"]["transformer.wte.weight"] = {"card": "W_e", "tranpose": True}
    with pytest.raises(Exception, match=r"tensor 'transformer.wte.weight': unknown key "
                                        r"'tranpose' \(an entry takes axis, card, chunk, row, "
                                        r"shape, transpose\)"):
        parse_mapping(raw, str(tmp_path / "x.hf.json"))


def test_a_refused_value_names_the_default_that_gave_it():
    """A transformers 4 config.json of GPT-NeoX has rotary_pct, not rope_parameters: a rotary
    width it makes fractional is refused naming rotary_pct, the key the value came from."""
    config = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
              "vocab_size": 101, "hidden_size": 48, "num_attention_heads": 3,
              "intermediate_size": 96, "num_hidden_layers": 2, "max_position_embeddings": 64,
              "layer_norm_eps": 1e-5, "rotary_pct": 0.3, "rotary_emb_base": 10000,
              "use_parallel_residual": True, "hidden_act": "gelu", "tie_word_embeddings": False}
    with pytest.raises(RuntimeInputError) as err:
        preset_from_config(config, load_mapping(ROOT / "cards" / "gptneox.card"))
    assert str(err.value).startswith(
        "config.json has no rope_parameters.partial_rotary_factor (or null), and gives "
        "(hidden_size / num_attention_heads) * rotary_pct = 4.8, but ")
