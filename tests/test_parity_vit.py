"""Parity: the card-generated ViT equals Hugging Face's ViTForImageClassification.

A small randomly initialised transformers model (no download; every parameter random, biases,
norm gains, the class token and the positions included) is copied into the model that
`cards/vit.card` compiles to through `cards/vit.hf.json`: the convolution's weight (D, C, p, p)
is the card's W_p transposed and reshaped, the class token and position table lose their
leading axis, q/k/v join into W_qkv, and the class count K is the number of labels in
id2label. Logits and the gradients of a loss agree to fp32 rounding; a broken copy does not.
`cardc import` of a saved model and `cardc export` of the run give the very tensors back, and a
config.json transformers loads with the same class count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from parity import max_diff  # noqa: E402
from test_interop import run_main  # noqa: E402

from cardc.build import build_model, rebuild_model  # noqa: E402
from cardc.interop import check_config, load_mapping, preset_from_config, to_card_state  # noqa: E402
from cardc.runtime.checkpoint import load_state, read_checkpoint  # noqa: E402
from cardc.runtime.errors import RuntimeInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "cards" / "vit.card"
MAPPING = load_mapping(CARD)

C, S, P, D, H, D_F, N, K = 3, 24, 6, 32, 4, 64, 2, 7
B = 3
TOL = 1e-4


def config():
    return transformers.ViTConfig(
        hidden_size=D, num_hidden_layers=N, num_attention_heads=H, intermediate_size=D_F,
        image_size=S, patch_size=P, num_channels=C, num_labels=K, hidden_act="gelu",
        layer_norm_eps=1e-12, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager")


def make_hf():
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(config())
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # every parameter random, so a wrong mapping shows
        for name, p in hf.named_parameters():
            mean = 1.0 if "layernorm" in name and name.endswith("weight") else 0.0
            p.copy_(mean + 0.1 * torch.randn(p.shape, generator=gen))
    return hf.eval()


def make_ours():
    hypers = preset_from_config(config().to_dict(), MAPPING)
    model = build_model(str(CARD), None, hypers, library=str(ROOT / "cards"), name="ViT")
    return model.float().eval()


def saved_names(hf, folder: Path) -> dict[str, str]:
    """Each parameter's name in memory → its name in the checkpoint file (transformers 5
    renames ViT's layers in memory and saves the published names, which the mapping reads);
    matched by value, every parameter being random."""
    hf.save_pretrained(folder)
    saved = load_file(folder / "model.safetensors")
    out = {}
    for name, p in hf.named_parameters():
        (match,) = [k for k, t in saved.items() if torch.equal(t, p.detach())]
        out[name] = match
    return out


def card_state(tensors: dict[str, torch.Tensor], names: dict[str, str], ours) -> dict:
    """HF tensors (named as in memory) in the card's state dict, through the mapping."""
    return to_card_state(MAPPING, {names[n]: t for n, t in tensors.items()},
                         {n: t.detach() for n, t in ours.state_dict().items()}, N,
                         ours.card_meta["hyperparameters"])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf, ours = make_hf(), make_ours()
    names = saved_names(hf, tmp_path_factory.mktemp("vit"))
    ours.load_state_dict(card_state(dict(hf.named_parameters()), names, ours), strict=True)
    return hf, ours, names


@pytest.fixture(scope="module")
def images():
    return torch.randn(B, C, S, S, generator=torch.Generator().manual_seed(7))


def test_the_class_count_is_read_from_id2label():
    hypers = preset_from_config(config().to_dict(), MAPPING)
    assert hypers["K"] == K
    assert (hypers["C"], hypers["S"], hypers["p"], hypers["D"]) == (C, S, P, D)


def test_logits_match(pair, images):
    hf, ours, _ = pair
    with torch.no_grad():
        want = hf(pixel_values=images).logits
        got = ours(images)
    assert got.shape == (B, K)
    diff = max_diff(got, want)
    assert diff <= TOL, f"max |logits diff| = {diff:.3e}"


def test_gradients_of_a_classification_loss_match(pair, images):
    hf, ours, names = pair
    labels = torch.tensor([0, 3, K - 1])
    for m in (hf, ours):
        m.zero_grad()
    hf(pixel_values=images, labels=labels).loss.backward()
    torch.nn.functional.cross_entropy(ours(images), labels).backward()
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    want = card_state(hf_grads, names, ours)
    assert set(want) == set(ours_grads)
    worst = max((max_diff(ours_grads[n], want[n]), n) for n in want)
    assert worst[0] <= TOL, f"max |grad diff| = {worst[0]:.3e} at {worst[1]}"


def test_a_patch_embedding_copied_without_its_reshape_breaks_parity(pair, images):
    """The conv weight's (C, p, p) order is what parity rests on: p and C swapped fails."""
    hf, ours, _ = pair
    broken = make_ours()
    broken.load_state_dict(ours.state_dict())
    with torch.no_grad():
        w = hf.vit.embeddings.patch_embeddings.projection.weight  # (D, C, p, p)
        broken.W_p.copy_(w.permute(0, 2, 3, 1).reshape(D, -1).T)
        assert max_diff(broken(images), hf(pixel_values=images).logits) > 1e-2


def test_the_forward_has_no_loop_over_heads_or_patches():
    text = (ROOT / "generated" / "vit.py").read_text(encoding="utf-8")
    forward = text[text.index("class ViT("):text.index("# Helpers the code above calls")]
    assert " for " not in forward.replace("for block in self.block", "") \
        .replace("for _ in range(N)", "")


LABELS = ["tabby cat", "dog", "ölkanne", "ship", "truck", "LABEL_0", "frog"][:K]


def test_import_then_export_is_bit_exact(tmp_path, capsys, images):
    """Tensors and the labels' names come back as they were (export once wrote LABEL_i)."""
    hf = make_hf()
    hf.config.id2label = dict(enumerate(LABELS))
    hf.config.label2id = {name: i for i, name in enumerate(LABELS)}
    hf.save_pretrained(tmp_path / "hf")
    source_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    code, _, err = run_main(capsys, "import", "cards/vit.card", "--from", str(tmp_path / "hf"),
                            "--out", str(tmp_path / "run"))
    assert code == 0, err
    meta, state = read_checkpoint(tmp_path / "run")
    model = rebuild_model(meta)
    load_state(model, state)
    with torch.no_grad():
        diff = max_diff(model.eval()(images), hf(pixel_values=images).logits)
    assert diff <= TOL, f"max |logits diff| = {diff:.3e}"

    code, out, err = run_main(capsys, "export", str(tmp_path / "run"), "--to",
                              str(tmp_path / "back"))
    assert code == 0, err
    assert "as ViTForImageClassification" in out
    source = load_file(tmp_path / "hf" / "model.safetensors")
    exported = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(exported) == sorted(source)
    changed = [n for n in source if not torch.equal(exported[n], source[n])]
    assert not changed, f"changed by import → export: {changed}"
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (written["id2label"], written["label2id"]) == \
        (source_config["id2label"], source_config["label2id"])
    assert written["id2label"] == {str(i): name for i, name in enumerate(LABELS)}
    back = transformers.ViTForImageClassification.from_pretrained(
        tmp_path / "back", attn_implementation="eager").eval()
    assert back.config.num_labels == K
    assert (back.config.id2label, back.config.label2id) == (hf.config.id2label, hf.config.label2id)
    with torch.no_grad():
        assert torch.equal(back(pixel_values=images).logits, hf(pixel_values=images).logits)


@pytest.mark.parametrize(("change", "message"), [
    ({"id2label": 5}, r"config.json has id2label = 5 \(the card's K counts its entries\); "
                      r"expected an object or a list"),
    ({"label2id": {"a": 0}}, r"config.json has label2id = 1 but id2label = 7; the card's K is "
                             r"both"),
    ({"qkv_bias": False}, r"config.json has qkv_bias = False, but the card ViT computes "
                          r"qkv_bias = True"),
    ({"hidden_act": "relu"}, r"hidden_act = 'relu'"),
])
def test_configs_the_card_does_not_compute_are_refused_by_key(change, message):
    raw = {**config().to_dict(), **change}
    with pytest.raises(RuntimeInputError, match=message):
        check_config(raw, MAPPING)
        preset_from_config(raw, MAPPING)


def test_a_config_without_labels_has_transformers_two_classes():
    raw = {k: v for k, v in config().to_dict().items() if k not in ("id2label", "label2id")}
    assert preset_from_config(raw, MAPPING)["K"] == 2
    assert transformers.ViTConfig(**raw).num_labels == 2


def test_info_counts_the_flops_of_a_whole_image(tmp_path):
    """An image has no sequence length: `cardc info` gives the FLOPs of one example (it said
    "per token"), and they are the matrix products the generated model runs on one image,
    counted by torch's FlopCounterMode."""
    import subprocess
    import sys

    from torch.utils.flop_counter import FlopCounterMode

    from cardc.build import checked, find_card
    from cardc.flops import card_cost
    from cardc.info import summarize
    from cardc.library import library_roots

    run = subprocess.run([sys.executable, "-m", "cardc", "info", "cards/vit.card", "--preset",
                          "tiny"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lib, checker, _ = checked([str(CARD)], library_roots([str(CARD)], None))
    alg = find_card(lib, checker, str(CARD), "ViT")
    summary = summarize(checker.info(alg).sig, "tiny", {}, card_cost(checker, alg))
    forward = summary.compute.per_token.evaluate({})
    assert f"FLOPs per example: forward {int(forward):,}, training {3 * int(forward):,}" \
        in run.stdout
    model = build_model(str(CARD), "tiny", {}, library=str(ROOT / "cards"), name="ViT").eval()
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    with FlopCounterMode(display=False, custom_mapping={sdpa: _sdpa_flops}) as counter, \
            torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert forward == counter.get_total_flops() / 2


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Softmax attention's two products, Q K^⊺ and P V, over every key."""
    *batch, tq, d = query_shape
    heads = 1
    for n in batch:
        heads *= n
    return 2 * heads * tq * key_shape[-2] * (d + value_shape[-1])


def test_cardc_train_says_no_training_card_fits_an_image_model(tmp_path):
    """The library's recipes train language models: `cardc train` of ViT is one line naming
    what is missing (a training card that calls ViT), no traceback, nothing written."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "cardc", "train", "cards/vit.card", "--preset",
                          "tiny", "--steps", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 1  # as for any model no recipe fits: the card is at fault
    lines = run.stderr.strip().splitlines()
    assert lines[0] == (
        "cards/vit.card:1:1: error: no training card trains ViT: none calls it, and no generic "
        "one (as LMTraining trains any card {1..V}^{T} → ℝ^{T×V}) fits it")
    assert lines[-1] == "1 error" and "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()
