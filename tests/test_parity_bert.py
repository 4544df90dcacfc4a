"""Parity: the card-generated BERT equals Hugging Face's BertModel and BertForMaskedLM.

Small randomly initialised Hugging Face models (no download) are copied into the models that
`cards/bert.card` compiles to, through `cards/bert.hf.json` and its variant for BERTForMaskedLM
(nn.Linear weights transposed, the separate query/key/value joined into the card's fused W_qkv). Hidden states, the pooled vector,
MLM logits and the gradients of a loss must agree to fp32 rounding; broken copies must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from parity import max_diff, swap_columns  # noqa: E402

from cardc.build import build_model, rebuild_model  # noqa: E402
from cardc.interop import load_mapping, parse_mapping, to_card_state  # noqa: E402
from cardc.runtime.checkpoint import load_state, read_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "bert.card"

V, CTX, D, N, H, TYPES = 101, 32, 48, 2, 4, 2
D_F = 4 * D
B, T = 3, 17
TOL = 1e-4

MAPPING = load_mapping(CARD)  # BertModel (pooler included) → BERT
MLM_MAPPING = load_mapping(CARD, "BERTForMaskedLM")  # its variant: no pooler, the MLM head


def config():
    return transformers.BertConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=N, num_attention_heads=H,
        intermediate_size=D_F, max_position_embeddings=CTX, type_vocab_size=TYPES,
        hidden_act="gelu", layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager")


def randomise(hf):
    """Every parameter random, layer-norm gains around 1, so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            mean = 1.0 if "LayerNorm.weight" in name else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf.eval()


def make_ours(name: str):
    hypers = dict(V=V, D=D, H=H, D_f=D_F, N=N, ctx=CTX, types=TYPES)
    model = build_model(str(CARD), None, hypers, library=str(ROOT / "cards"), name=name)
    return model.float().eval()


def copy_into(mapping, hf_state, ours) -> None:
    ours.load_state_dict(to_card_state(mapping, hf_state, ours.state_dict(), N), strict=True)



@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(0, V, (B, T), generator=gen)
    s = (torch.arange(T) >= T // 2).long().expand(B, T).clone()  # two segments
    assert s.any() and not s.all()
    return x, s


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    hf = randomise(transformers.BertModel(config()))
    ours = make_ours("BERT")
    copy_into(MAPPING, hf.state_dict(), ours)
    return hf, ours


def pooled(ours, E: torch.Tensor) -> torch.Tensor:
    """The card BERTPooler, run on BERT's own pooler parameters."""
    pool = build_model(str(CARD), None, dict(D=D), library=str(ROOT / "cards"), name="BERTPooler")
    pool.W_pool, pool.b_pool = ours.W_pool, ours.b_pool  # shared, so gradients reach BERT
    return pool(E)


def test_hidden_states_and_pooler_match(base, inputs):
    hf, ours = base
    x, s = inputs
    with torch.no_grad():
        want = hf(input_ids=x, token_type_ids=s)
        got = ours(x, s)
        got_pooled = pooled(ours, got)
    assert got.shape == want.last_hidden_state.shape == (B, T, D)
    diff = max_diff(got, want.last_hidden_state)
    assert diff <= TOL, f"max |hidden diff| = {diff:.3e}"
    diff = max_diff(got_pooled, want.pooler_output)
    assert diff <= TOL, f"max |pooled diff| = {diff:.3e}"


def grads_as_card(mapping, hf, ours) -> dict[str, torch.Tensor]:
    """HF's gradients renamed and reshaped exactly as its weights are."""
    grads = {n: p.grad for n, p in hf.named_parameters()}
    return to_card_state(mapping, grads, ours.state_dict(), N)


def assert_grads_match(mapping, hf, ours) -> None:
    want = grads_as_card(mapping, hf, ours)
    got = {n: p.grad for n, p in ours.named_parameters()}
    assert set(got) == set(want)
    diffs = {n: max_diff(got[n], want[n]) for n in want}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_base_gradients_match(base, inputs):
    hf, ours = base
    x, s = inputs
    weight = torch.randn(B, T, D, generator=torch.Generator().manual_seed(11))
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    out = hf(input_ids=x, token_type_ids=s)
    ((out.last_hidden_state * weight).sum() + out.pooler_output.sum()).backward()
    E = ours(x, s)
    ((E * weight).sum() + pooled(ours, E).sum()).backward()
    assert_grads_match(MAPPING, hf, ours)


@pytest.fixture(scope="module")
def mlm():
    torch.manual_seed(0)
    hf = randomise(transformers.BertForMaskedLM(config()))
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
    ours = make_ours("BERTForMaskedLM")
    mapping = MLM_MAPPING
    copy_into(mapping, hf.state_dict(), ours)
    return hf, ours, mapping


def test_mlm_logits_and_gradients_match(mlm, inputs):
    hf, ours, mapping = mlm
    x, s = inputs
    labels = torch.full((B, T), -100)
    labels[:, 3] = x[:, 3]  # a masked-LM loss on one position per row
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    want = hf(input_ids=x, token_type_ids=s, labels=labels)
    got, loss = ours(x, s, labels)
    assert got.shape == want.logits.shape == (B, T, V)
    diff = max_diff(got, want.logits)
    assert diff <= TOL, f"max |MLM logits diff| = {diff:.3e}"
    assert abs(loss.item() - want.loss.item()) <= 1e-5
    want.loss.backward()
    loss.backward()
    assert_grads_match(mapping, hf, ours)


def test_swapped_heads_are_caught(base, inputs):
    """Negative control: exchanging two heads' query columns must break parity."""
    hf, ours = base
    x, s = inputs
    broken = make_ours("BERT")
    broken.load_state_dict(ours.state_dict(), strict=True)
    d = D // H
    with torch.no_grad():
        swap_columns(broken.block[0].attn.W_qkv, 0, d)
        diff = max_diff(broken(x, s), hf(input_ids=x, token_type_ids=s).last_hidden_state)
    assert diff > 1e-3, f"swapping query heads changed the hidden states by only {diff:.3e}"


def test_missing_transpose_is_caught(base, inputs):
    """Negative control: the value projection copied without its transpose must not match."""
    hf, ours = base
    x, s = inputs
    raw = dict(MAPPING.raw)
    key = "bert.encoder.layer.{i}.attention.self.value.weight"
    raw["tensors"] = {**raw["tensors"], key: {"card": "block.{i}.attn.W_qkv", "chunk": [2, 3],
                                              "axis": 1}}
    broken = make_ours("BERT")
    copy_into(parse_mapping(raw, "no transpose"), hf.state_dict(), broken)
    with torch.no_grad():
        diff = max_diff(broken(x, s), hf(input_ids=x, token_type_ids=s).last_hidden_state)
    assert diff > 1e-3, f"an untransposed value projection changed the output by only {diff:.3e}"


def test_cardc_import_of_a_saved_bert_matches(base, inputs, tmp_path):
    """`cardc import` reads a saved BertModel (names without bert., buffers ignored)."""
    from test_interop import cardc

    hf, _ = base
    x, s = inputs
    hf.save_pretrained(tmp_path / "hf")
    r = cardc("import", "cards/bert.card", "--from", str(tmp_path / "hf"),
              "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    meta, state = read_checkpoint(tmp_path / "run")
    model = rebuild_model(meta)
    load_state(model, state)
    with torch.no_grad():
        diff = max_diff(model.eval()(x, s), hf(input_ids=x, token_type_ids=s).last_hidden_state)
    assert diff <= TOL, f"max |hidden diff| = {diff:.3e}"


def test_only_vocabulary_scores_take_targets(base, inputs):
    """BERT's output is D-wide hidden states, not scores over its V tokens: its forward takes
    no targets (a cross-entropy of them would mean nothing); BERTForMaskedLM's does, and the
    log-likelihood of targets at rows (cardc.lower.likelihood). Both still
    refuse a sequence longer than their learned positions."""
    import inspect

    _, ours = base
    mlm = make_ours("BERTForMaskedLM")
    assert list(inspect.signature(ours.forward).parameters) == ["x", "s"]
    assert list(inspect.signature(mlm.forward).parameters) == ["x", "s", "targets", "nll"]
    long = torch.zeros(1, CTX + 1, dtype=torch.long)
    for model in (ours, mlm):
        with pytest.raises(ValueError, match=f"sequence length {CTX + 1} exceeds"):
            model(long, long)
