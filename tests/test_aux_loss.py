"""The load-balancing loss of sparse experts (Switch Transformer's, as Mixtral and Qwen2-MoE
train with it), from cards that return their routers' statistics beside the logits:
`P, F, G ← MixtralRouted(x | θ)` and `Qwen2MoERouted`, F[e] the share of the tokens that
chose expert e among their k and G[e] its mean router probability, over every token and layer
of a sequence. Over a batch of sequences of one length, transformers' `aux_loss` (the top-k
choices and probabilities pooled over every layer and token) is E · Σ_e F̄[e] · Ḡ[e], F̄ and Ḡ
the batch's means. Its value and its gradient with respect to every parameter must equal
transformers' (MixtralForCausalLM and Qwen2MoeForCausalLM, random tiny configs, no download,
`output_router_logits=True`), the logits must stay those of the logits-only card, and the
same weights with two experts swapped must not match.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_parity_mixtral as mixtral  # noqa: E402
import test_parity_qwen2moe as qwen2moe  # noqa: E402
from parity import max_diff  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from cardc.build import build_model, checked, find_card  # noqa: E402
from cardc.flops import card_cost  # noqa: E402
from cardc.info import summarize  # noqa: E402
from cardc.interop import to_card_state  # noqa: E402
from cardc.library import library_roots  # noqa: E402

FAMILIES = {"MixtralRouted": (mixtral, "mixtral.card"), "Qwen2MoERouted": (qwen2moe, "qwen2moe.card")}


def aux_loss(F: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """E · Σ_e F̄[e] · Ḡ[e] over a batch of sequences of one length."""
    return F.shape[-1] * (F.mean(0) * G.mean(0)).sum()


def _ours(family, card: str, name: str, saved: dict) -> torch.nn.Module:
    model = build_model(str(family.ROOT / "cards" / card), None, family.HYPERS,
                        library=str(family.ROOT / "cards"), name=name).float().eval()
    state = to_card_state(family.MAPPING, saved, model.state_dict(), family.N,
                          model.card_meta["hyperparameters"])
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    family, card = FAMILIES[request.param]
    hf = family.make_hf()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    saved = load_file(folder / "model.safetensors")
    ours = _ours(family, card, request.param, saved)
    idx = torch.randint(0, family.V, (family.B, family.T),
                        generator=torch.Generator().manual_seed(7))
    return family, hf, ours, idx


def _zero(model: torch.nn.Module) -> None:
    """Every gradient a tensor of zeros: those the loss does not reach compare as 0."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


def test_the_aux_loss_and_its_gradients_match(pair):
    family, hf, ours, idx = pair
    _zero(hf)
    _zero(ours)
    out = hf(idx, output_router_logits=True)
    out.aux_loss.backward()
    P, F, G = ours(idx)
    got = aux_loss(F, G)
    got.backward()
    assert F.shape == G.shape == (family.B, family.E)
    assert abs(got.item() - out.aux_loss.item()) <= 1e-5, (got.item(), out.aux_loss.item())
    assert max_diff(P, out.logits) <= 1e-4
    diffs = {name: max_diff(a, b) for name, a, b in family.grad_pairs(hf, ours)}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= 1e-5, f"max |grad diff| = {diffs[worst]:.3e} at {worst}"


def test_the_router_gradients_are_not_zero(pair):
    """The loss reaches the routers (through G) and every earlier layer: a check that the
    comparison above compares something."""
    family, _, ours, idx = pair
    _zero(ours)
    _, F, G = ours(idx)
    aux_loss(F, G).backward()
    for i in range(family.N):
        assert ours.block[i].moe.W_g.grad.abs().max() > 0
    assert ours.W_e.grad.abs().max() > 0


def test_a_router_with_two_columns_exchanged_is_caught(pair):
    """A negative control: layer 0's router scores expert 1 as expert 2 and back."""
    family, hf, ours, idx = pair
    with torch.no_grad():
        W_g = ours.block[0].moe.W_g
        W_g[:, [0, 1]] = W_g[:, [1, 0]]
        try:
            _, F, G = ours(idx)
            want = hf(idx, output_router_logits=True).aux_loss
            assert abs(aux_loss(F, G).item() - want.item()) > 1e-5
        finally:
            W_g[:, [0, 1]] = W_g[:, [1, 0]]


@pytest.mark.parametrize(("card", "plain", "routed", "preset"), [
    ("mixtral.card", "Mixtral", "MixtralRouted", "mixtral-8x7b-v0.1"),
    ("qwen2moe.card", "Qwen2MoE", "Qwen2MoERouted", "qwen1_5-moe-a2_7b")])
def test_info_counts_the_routed_variant_as_the_logits_only_card(card, plain, routed, preset):
    """Its parameters and active FLOPs (k of E experts a token) are the logits-only card's:
    the statistics it returns beside them cost no matrix product."""
    path = str(mixtral.ROOT / "cards" / card)
    lib, checker, _ = checked([path], library_roots([path]))
    summaries = []
    for name in (plain, routed):
        alg = find_card(lib, checker, path, name)
        summaries.append(summarize(checker.info(alg).sig, preset, {}, card_cost(checker, alg)))
    for seq in (1, 4096):
        a, b = (s.compute.per_token.evaluate({"T": seq}) for s in summaries)
        assert a == b
    assert summaries[0].parameters == summaries[1].parameters


def test_the_routed_variant_is_no_language_model_to_decode_or_train_as_one(pair, tmp_path):
    """It returns a tuple: no KV cache is offered, and LMTraining (a model of one output, the
    logits) does not take it: `cardc train` says so at the card, exit status 1."""
    family, _, ours, _ = pair
    assert not hasattr(ours, "new_cache")
    name, card = next((n, family.ROOT / "cards" / c) for n, (f, c) in FAMILIES.items()
                      if f is family)
    line = card.read_text(encoding="utf-8").splitlines().index(
        f"Algorithm: P, F, G ← {name}(x | θ)") + 1
    run = subprocess.run([sys.executable, "-m", "cardc", "train", str(card), "--name", name,
                          "--preset", "tiny", "--steps", "1", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, cwd=family.ROOT)
    assert run.returncode == 1
    assert f"{card}:{line}:1: error: no training card trains {name}" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()


BALANCED = "tests/cards/recipes/balanced_moe.card"
SMALL = dict(V=64, D=32, H=2, H_kv=1, d=16, D_f=48, N=2, ctx=32, E=4, k=2, w=32)
MINIBATCH = dict(N_steps=2, B=2, l=9, eta=1e-3, c=1.0)


def _balanced_training():
    """The training card's function: a loop over each minibatch's sequences, each adding its
    next-token loss and α · Σ_e F[e] · G[e] (divided by B) to the gradient."""
    import os

    from cardc.build import procedure_function

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    card = os.path.join(root, BALANCED)
    lib, checker, _ = checked([card], os.path.join(root, "cards"))
    return procedure_function(checker, find_card(lib, checker, card, None))


def _routed_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("cards/mixtral.card", "tiny", SMALL, name="MixtralRouted")


def _by_hand(model: torch.nn.Module, data: list, alpha: float) -> None:
    """The same updates written in plain PyTorch."""
    B, length, c = MINIBATCH["B"], MINIBATCH["l"], MINIBATCH["c"]
    decayed = [p for p in model.parameters() if p.ndim >= 2]
    undecayed = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decayed}, {"params": undecayed, "weight_decay": 0.0}],
                            lr=MINIBATCH["eta"], fused=True)
    for i in range(MINIBATCH["N_steps"]):
        model.zero_grad()
        for n in range(i * B, (i + 1) * B):
            x = data[n]
            P, F, G = model(x[None])
            nll = -torch.log_softmax(P[0, :-1], -1).gather(-1, x[1:, None]).sum()
            (nll / (B * (length - 1)) + alpha / B * (F * G).sum()).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, torch.clamp(c / torch.nn.utils.get_total_norm(grads), max=1))
        opt.step()


def test_a_training_card_adds_the_balancing_loss_to_each_sequences_gradient():
    """Its updates are the hand-written loop's; without the balancing term they are not."""
    import copy

    train = _balanced_training()
    data = list(torch.randint(0, SMALL["V"], (4, MINIBATCH["l"]),
                              generator=torch.Generator().manual_seed(1)))
    ours, mine, plain = _routed_model(), _routed_model(), _routed_model()
    start = copy.deepcopy(ours.state_dict())
    train(data, ours, alpha=0.5, **MINIBATCH)
    _by_hand(mine, data, alpha=0.5)
    _by_hand(plain, data, alpha=0.0)
    a, b, p = ours.state_dict(), mine.state_dict(), plain.state_dict()
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-4  # it trained
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert max((a[k] - p[k]).abs().max().item() for k in a) > 1e-5


def test_a_loop_over_a_minibatch_reads_only_its_sequences():
    """`for n = (i − 1) · B + 1, …, i · B` visits that minibatch, not the whole dataset (every
    example was visited, each update, whatever the range said): sequences past the updates'
    are never read."""
    told = []
    data = list(torch.randint(0, SMALL["V"], (4, MINIBATCH["l"]),
                              generator=torch.Generator().manual_seed(1))) + [None] * 4
    _balanced_training()(data, _routed_model(), alpha=0.5, report=lambda loss, lr: told.append(loss),
                         **MINIBATCH)
    assert len(told) == MINIBATCH["N_steps"]
