"""`cardc import` then `cardc export` of Llama, Qwen2, Qwen3 (tied and untied), Mistral, OLMo 2,
StableLM 2, Falcon (tied and untied; its fused query_key_value split and joined back), Gemma 2
(its layers paired by the mapping's {2i} and {2i+1}) and BERT (BertModel and BertForMaskedLM), as
tests/test_interop.py does for GPT-2.

For each, a small randomly initialised transformers model (no download; every parameter random,
biases and norm gains included) is saved with `save_pretrained`, imported through the mapping
file beside its card (the card chosen by config.json: an untied checkpoint becomes LlamaUntied,
a BertForMaskedLM one BERTForMaskedLM), and exported again. The export must hold the very tensors
of the source under the very names, carry a config.json transformers loads without a warning
(`tie_word_embeddings` as the source had it; transformers 5's `rope_parameters` with its
`rope_type`), and `from_pretrained` of it must compute exactly what the source does.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from parity import max_diff  # noqa: E402
from test_interop import logits_of_run, run_main  # noqa: E402

from cardc.interop import (  # noqa: E402
    load_mapping,
    load_mappings,
    parse_mappings,
    preset_from_config,
    select_for_config,
)
from cardc.runtime.checkpoint import read_checkpoint  # noqa: E402
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

V, D, N, H, H_KV, D_F, CTX, TYPES = 101, 48, 2, 4, 2, 96, 64, 2
B, T = 3, 17


@dataclass(frozen=True)
class Family:
    card: str  # the card file
    name: str  # the card of it that import must choose
    cls: str  # the transformers class
    tied: bool


FAMILIES = {
    "llama-tied": Family("cards/llama.card", "Llama", "LlamaForCausalLM", True),
    "llama-untied": Family("cards/llama.card", "LlamaUntied", "LlamaForCausalLM", False),
    "qwen2-tied": Family("cards/qwen2.card", "Qwen2", "Qwen2ForCausalLM", True),
    "qwen2-untied": Family("cards/qwen2.card", "Qwen2Untied", "Qwen2ForCausalLM", False),
    "qwen3-tied": Family("cards/qwen3.card", "Qwen3", "Qwen3ForCausalLM", True),
    "qwen3-untied": Family("cards/qwen3.card", "Qwen3Untied", "Qwen3ForCausalLM", False),
    "mistral": Family("cards/mistral.card", "Mistral", "MistralForCausalLM", False),
    "olmo2": Family("cards/olmo2.card", "OLMo2", "Olmo2ForCausalLM", False),
    "stablelm2": Family("cards/stablelm2.card", "StableLM2", "StableLmForCausalLM", False),
    "falcon-tied": Family("cards/falcon.card", "Falcon", "FalconForCausalLM", True),
    "falcon-untied": Family("cards/falcon.card", "FalconUntied", "FalconForCausalLM", False),
    "gemma2": Family("cards/gemma2.card", "Gemma2", "Gemma2ForCausalLM", True),
    "cohere": Family("cards/cohere.card", "Cohere", "CohereForCausalLM", True),
    "cohereqk": Family("cards/cohere.card", "CohereQKNorm", "CohereForCausalLM", True),
    "granite-tied": Family("cards/granite.card", "Granite", "GraniteForCausalLM", True),
    "granite-untied": Family("cards/granite.card", "GraniteUntied", "GraniteForCausalLM", False),
    "granitebiased": Family("cards/granite.card", "GraniteBiased", "GraniteForCausalLM", True),
    "bert": Family("cards/bert.card", "BERT", "BertModel", True),
    "bert-mlm": Family("cards/bert.card", "BERTForMaskedLM", "BertForMaskedLM", True),
}
THETA = {"llama": 10000.0, "qwen2": 1e6, "qwen3": 1e6, "mistral": 1e4, "olmo2": 5e5, "stablelm2": 1e4,
         "gemma2": 1e4, "falcon": 1e4, "cohere": 1e4, "cohereqk": 1e4, "granite": 1e4,
         "granitebiased": 1e4}
EXTRA = {  # what each family's config sets beyond Llama's: heads wider than D/H, a window
    "qwen2": {"use_sliding_window": False},
    "qwen3": {"head_dim": 16},
    "mistral": {"head_dim": 16, "sliding_window": 5},
    "olmo2": {"pad_token_id": None, "eos_token_id": None},
    "stablelm2": {"partial_rotary_factor": 0.5, "use_qkv_bias": True, "pad_token_id": 5},
    "gemma2": {"head_dim": 16, "sliding_window": 5, "query_pre_attn_scalar": 20,
               "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
               "num_hidden_layers": 4},  # two (local, global) pairs
    "cohere": {"logit_scale": 0.25, "pad_token_id": 5, "bos_token_id": None, "eos_token_id": None},
    "cohereqk": {"logit_scale": 0.25, "use_qk_norm": True, "pad_token_id": 5,
                 "bos_token_id": None, "eos_token_id": None},  # a LayerNorm per head
    "granite": {"embedding_multiplier": 3.7, "residual_multiplier": 0.6,  # its multipliers
                "attention_multiplier": 0.09, "logits_scaling": 2.3, "pad_token_id": 5},
    "granitebiased": {"embedding_multiplier": 3.7, "residual_multiplier": 0.6,
                      "attention_multiplier": 0.09, "logits_scaling": 2.3, "pad_token_id": 5,
                      "attention_bias": True, "mlp_bias": True},  # every projection biased
}
EPS_KEY = {"stablelm2": "layer_norm_eps",  # the config key of ε where it is not rms_norm_eps
           "cohere": "layer_norm_eps", "cohereqk": "layer_norm_eps"}


def config_of(key: str, fam: Family, **changes):
    if fam.cls.startswith("Bert"):
        return transformers.BertConfig(
            vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
            intermediate_size=D_F, max_position_embeddings=CTX, type_vocab_size=TYPES,
            hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    family = key.split("-")[0]
    if family == "falcon":  # its own config keys: one key/value head, ffn_hidden_size
        return transformers.FalconConfig(
            vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
            ffn_hidden_size=D_F, max_position_embeddings=CTX, rope_theta=THETA[family],
            layer_norm_epsilon=1e-5, tie_word_embeddings=fam.tied, attention_dropout=0.0,
            hidden_dropout=0.0, pad_token_id=5, **changes)
    extra = EXTRA.get(family, {})
    cfg = getattr(transformers, fam.cls.replace("ForCausalLM", "Config"))
    common = dict(vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
                  num_key_value_heads=H_KV, intermediate_size=D_F, max_position_embeddings=CTX,
                  rope_theta=THETA[family], tie_word_embeddings=fam.tied, attention_dropout=0.0,
                  **{EPS_KEY.get(family, "rms_norm_eps"): 1e-5})
    return cfg(**{**common, **extra, **changes})


def make_hf(key: str, fam: Family):
    torch.manual_seed(0)
    hf = getattr(transformers, fam.cls)(config_of(key, fam)).float().eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # biases start at zero and gains at one in HF: randomise them all
        for name, p in hf.named_parameters():
            mean = 1.0 if name.endswith(("norm.weight", "LayerNorm.weight")) else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf


def outputs(model, x, s) -> dict[str, torch.Tensor]:
    """What a transformers model computes: logits, or BertModel's hidden states and pooler."""
    with torch.no_grad():
        if isinstance(model, transformers.BertModel):
            out = model(input_ids=x, token_type_ids=s)
            return {"hidden": out.last_hidden_state, "pooled": out.pooler_output}
        if isinstance(model, transformers.BertForMaskedLM):
            return {"logits": model(input_ids=x, token_type_ids=s).logits}
        return {"logits": model(x).logits}


def from_pretrained(fam: Family, path: Path):
    """transformers' model of `path`; any warning it gives (Python's or its logger's) fails."""
    logger = logging.getLogger("transformers")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = getattr(transformers, fam.cls).from_pretrained(path).eval()
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in records] + [str(w.message) for w in caught
                                                if not issubclass(w.category, ResourceWarning)]
    assert not said, f"loading {path.name} warned: {said}"
    return model


@pytest.fixture(scope="module", params=list(FAMILIES), ids=list(FAMILIES))
def case(request, tmp_path_factory):
    """(key, family, source folder, the source as transformers loads it, the imported run)."""
    key = request.param
    fam = FAMILIES[key]
    root = tmp_path_factory.mktemp(key)
    make_hf(key, fam).save_pretrained(root / "hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        from cardc.cli import main
        assert main(["import", fam.card, "--from", str(root / "hf"), "--out",
                     str(root / "run")]) == 0
    return key, fam, root / "hf", from_pretrained(fam, root / "hf"), root / "run"


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(0, V, (B, T), generator=gen)
    s = (torch.arange(T) >= T // 2).long().expand(B, T).clone()  # two segments (BERT)
    return x, s


def test_import_chooses_the_card_and_matches(case, inputs):
    key, fam, _, hf, run = case
    x, s = inputs
    meta, _ = read_checkpoint(run)
    assert meta["name"] == fam.name
    assert meta["hf"]["mapping"]["architecture"] == fam.cls
    want = outputs(hf, x, s)
    got = logits_of_run(run, x) if not fam.cls.startswith("Bert") else _bert_run(run, x, s)
    diff = max_diff(got, want["hidden"] if "hidden" in want else want["logits"])
    tol = 1e-5 if fam.cls == "BertForMaskedLM" else 1e-4
    assert diff <= tol, f"{key}: max |output diff| = {diff:.3e}"


def _bert_run(run: Path, x, s) -> torch.Tensor:
    from cardc.build import rebuild_model
    from cardc.runtime.checkpoint import load_state

    meta, state = read_checkpoint(run)
    model = rebuild_model(meta)
    load_state(model, state)
    with torch.no_grad():
        return model.eval()(x, s)


def test_export_is_bit_exact(case, inputs, tmp_path, capsys):
    key, fam, source_dir, hf, run = case
    x, s = inputs
    dest = tmp_path / "exported"
    code, out, err = run_main(capsys, "export", str(run), "--to", str(dest))
    assert code == 0, err
    assert f"as {fam.cls}" in out
    assert sorted(p.name for p in dest.iterdir()) == [".cardc-manifest", "config.json",
                                                      "model.safetensors"]
    source = load_file(source_dir / "model.safetensors")
    exported = load_file(dest / "model.safetensors")
    assert sorted(exported) == sorted(source)
    changed = [n for n in source if exported[n].dtype != source[n].dtype
               or not torch.equal(exported[n], source[n])]
    assert not changed, f"{key}: changed by import → export: {changed}"

    config = json.loads((dest / "config.json").read_text())
    assert config["architectures"] == [fam.cls]
    if fam.cls != "BertModel":  # which has no unembedding to tie
        assert config["tie_word_embeddings"] is fam.tied
    family = key.split("-")[0]
    if family in THETA:  # partial_rotary_factor is solved back from the card's d_r
        rope = {k: v for k, v in EXTRA.get(family, {}).items() if k == "partial_rotary_factor"}
        assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": THETA[family],
                                             **rope}

    back = from_pretrained(fam, dest)
    assert type(back).__name__ == fam.cls
    assert back.config.tie_word_embeddings is fam.tied
    if hasattr(back, "lm_head"):
        shared = back.lm_head.weight is back.get_input_embeddings().weight
        assert shared is fam.tied
    if fam.cls == "BertForMaskedLM":
        assert back.cls.predictions.decoder.weight is back.bert.embeddings.word_embeddings.weight
    want, got = outputs(hf, x, s), outputs(back, x, s)
    for what in want:
        assert torch.equal(got[what], want[what]), \
            f"{key}: {what} differ by {max_diff(got[what], want[what]):.3e}"


def test_trained_checkpoint_exports_by_its_card(tmp_path, capsys):
    """A checkpoint no import wrote (as `cardc train` saves) finds its card's own mapping: an
    untied Llama exports untied, with its lm_head."""
    from cardc.build import build_model
    from cardc.runtime.checkpoint import save_checkpoint

    hypers = dict(V=V, D=D, H=H, H_kv=H_KV, D_f=D_F, N=N, ctx=CTX)
    model = build_model("cards/llama.card", None, hypers, name="LlamaUntied")
    save_checkpoint(tmp_path / "run", model, model.card_meta)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code, _, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                                str(tmp_path / "hf"))
    assert code == 0, err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert "lm_head.weight" in load_file(tmp_path / "hf" / "model.safetensors")


def test_variants_merge_into_the_top_level():
    """A variant is a JSON merge patch: what it names replaces, null removes, the rest stays."""
    bert, mlm = load_mappings(ROOT / "cards" / "bert.card")
    assert (bert.card, mlm.card) == ("BERT", "BERTForMaskedLM")
    assert load_mapping(ROOT / "cards" / "bert.card", "BERTForMaskedLM") == mlm
    names = {e.hf for e in mlm.entries(1)}
    assert "bert.pooler.dense.weight" not in names and "cls.predictions.bias" in names
    assert {e.hf for e in bert.entries(1)} - names == {"bert.pooler.dense.weight",
                                                       "bert.pooler.dense.bias"}
    assert mlm.hyperparameters == bert.hyperparameters and mlm.base_prefix == "bert."
    assert bert.base_model and not mlm.base_model
    llama, untied = load_mappings(ROOT / "cards" / "llama.card")
    assert llama.tied and not untied.tied
    assert untied.fixed_config["tie_word_embeddings"] == [False]
    assert untied.fixed_config["hidden_act"] == ["silu"]


def test_name_overrides_the_choice_and_a_wrong_one_is_named(tmp_path, capsys):
    fam = FAMILIES["llama-untied"]
    make_hf("llama-untied", fam).save_pretrained(tmp_path / "hf")
    code, _, err = run_main(capsys, "import", fam.card, "--from", str(tmp_path / "hf"), "--out",
                            str(tmp_path / "run"), "--name", "Llama")
    assert code == 1 and "config.json has tie_word_embeddings = False" in err, err
    code, _, err = run_main(capsys, "import", fam.card, "--from", str(tmp_path / "hf"), "--out",
                            str(tmp_path / "run"), "--name", "Nope")
    assert code == 1 and "maps no card 'Nope' (it maps Llama, LlamaUntied)" in err, err
    assert not (tmp_path / "run").exists()


LLAMA_CONFIG = {"vocab_size": V, "hidden_size": D, "num_attention_heads": H,
                "num_key_value_heads": H_KV, "intermediate_size": D_F, "num_hidden_layers": N,
                "max_position_embeddings": CTX, "rms_norm_eps": 1e-5}


@pytest.mark.parametrize("extra, card", [
    ({"rope_theta": 5e5, "rope_scaling": None, "tie_word_embeddings": False}, "LlamaUntied"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "Llama"),
    ({"rope_theta": 5e5, "architectures": ["LlamaModel"]}, "Llama"),
])
def test_config_chooses_the_card(extra, card):
    """transformers 4's config (rope_theta at the top) and 5's (in rope_parameters) both read;
    an architecture no mapping has chooses nothing but refuses nothing."""
    mapping = select_for_config(load_mappings(ROOT / "cards" / "llama.card"),
                                {**LLAMA_CONFIG, **extra})
    assert mapping.card == card
    assert preset_from_config({**LLAMA_CONFIG, **extra}, mapping)["θ_base"] == 5e5


@pytest.mark.parametrize("extra, message", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "config.json has rope_scaling"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
     "config.json has rope_parameters.rope_type = 'yarn', but the card Llama computes "
     "rope_parameters.rope_type = 'default'"),
])
def test_scaled_rope_is_refused(extra, message):
    """The cards compute plain RoPE: a checkpoint that scales it (Llama 3.1's llama3, YaRN)
    would import silently wrong."""
    with pytest.raises(RuntimeInputError, match=re.escape(message)):
        select_for_config(load_mappings(ROOT / "cards" / "llama.card"),
                          {**LLAMA_CONFIG, "rope_theta": 1e4, **extra})


@pytest.mark.parametrize("variants, message", [
    ([], "'variants' must map card names to objects"),
    ({"Llama": {}}, "card 'Llama' is mapped twice"),
    ({"LlamaUntied": {"tensor": {}}}, "llama.hf.json (variant LlamaUntied): unknown key 'tensor'"),
    ({"LlamaUntied": {"tensors": {"lm_head.weight": {"card": "W_u", "chunk": [2, 2]}}}},
     "(variant LlamaUntied): tensor 'lm_head.weight': 'chunk' must be"),
])
def test_malformed_variants_are_reported(variants, message):
    raw = json.loads((ROOT / "cards" / "llama.hf.json").read_text())
    with pytest.raises(RuntimeInputError) as err:
        parse_mappings({**raw, "variants": variants}, "llama.hf.json")
    assert message in str(err.value)


@pytest.mark.parametrize("changes, message", [
    ({"num_hidden_layers": 3},
     "the layers of cards/gemma2.hf.json number N / 2 = 1.5 (N = 3), not a whole number"),
    ({"layer_types": ["sliding_attention"] * 4},
     "config.json has layer_types = ['sliding_attention', 'sliding_attention', "
     "'sliding_attention', 'sliding_attention'], but the card Gemma2 computes"),
])
def test_gemma2_that_the_card_cannot_pair_is_one_line(changes, message, tmp_path, capsys):
    """The card pairs a sliding layer with a full one: an odd layer count, or layers that do
    not alternate, is refused from the command line with one line, and nothing is written."""
    fam = FAMILIES["gemma2"]
    torch.manual_seed(0)
    transformers.Gemma2ForCausalLM(config_of("gemma2", fam, **changes)).save_pretrained(
        tmp_path / "hf")
    capsys.readouterr()  # what saving printed
    code, _, err = run_main(capsys, "import", fam.card, "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 1 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()
