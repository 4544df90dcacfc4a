"""Values made once (cardc/lower/invariants.py): an expression of the generated code that reads
only hyperparameters, sizes, devices, number formats and values made so — ALiBi's slopes, a
bias of the positions, a mask a layer rebuilt — becomes `shared_value(site, lambda: …, …)`,
made once per what it reads and shared by every layer and every forward; what reads a tensor's
entries (a bias table the caller gives) is left where it stands. The fused module still equals
the literal one and the reference interpreter (tests/test_parity_bloom.py's six heads,
tests/test_score_bias.py), and decoding equals recomputation."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decodecheck import check_incremental_decoding  # noqa: E402
from test_reproducers import Built, _randn  # noqa: E402
from test_score_bias import ALIBI, TABLE, _fused  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _bloom(layers: int, heads: int = 6):
    model = build_model(str(ROOT / "cards" / "bloom.card"), None,
                        dict(V=37, D=8 * heads, H=heads, N=layers), library=str(ROOT / "cards"))
    return model.eval()


def _values(model) -> dict:
    """The generated file's memo of values made once."""
    return type(model).forward.__globals__["VALUES"]


def test_bloom_makes_its_slopes_and_bias_once_for_every_layer():
    """Whatever the number of layers, a forward makes the slopes once and the bias (and the
    bias with the hidden positions) once; a forward of the same sizes makes none; a decoded
    token makes the bias of its own positions once, the slopes kept."""
    x = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(0))
    made = []
    for layers in (1, 3):
        model = _bloom(layers)
        values = _values(model)
        values.clear()
        with torch.no_grad():
            model(x)
            made.append(len(values))
            model(x)
            assert len(values) == made[-1]  # the same sizes: nothing made again
            cache = model.new_cache()
            model(x[:, :6], cache=cache)
            before = len(values)
            model(x[:, 6:], cache=cache)
            # the bias at (1, 7), the mask there (none: every key is visible), and their sum
            assert len(values) == before + 3
    assert made == [4, 4]  # the slopes, the bias, the causal mask, the bias with −∞ where hidden


def test_the_generated_bloom_shares_its_slopes_and_bias():
    """The committed module: the slopes a shared value of H, c, the device and number format;
    the head's bias a shared value of the slopes (by identity) and the positions."""
    text = (ROOT / "generated" / "bloom.py").read_text(encoding="utf-8")
    tree = ast.parse(text)
    calls = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and
             ast.unparse(n.func) == "shared_value"]
    assert "shared_value(1, make, self.H, X.device, c, X.dtype)" in calls
    assert "shared_value(2, make, m, Q.shape[-2], Q.device, first_query(cache, Q, K), " \
        "K.shape[-2], Q.dtype)" in calls


def test_a_bias_that_reads_a_tensors_entries_is_not_shared(tmp_path):
    """A bias table the caller gives is data: nothing that reads it is made once; ALiBi's
    slopes and bias are."""
    def model_code(text: str) -> str:  # the classes and functions the card becomes, not the
        return text.split("\n# Helpers the code above calls")[0]  # helpers (shared_mask's)

    assert "shared_value(" not in model_code(_fused(tmp_path, TABLE))
    assert "shared_value(" in model_code(_fused(tmp_path, ALIBI))


def test_shared_values_follow_the_number_format_and_the_sizes(tmp_path):
    """The same card run in float64 after float32, and at other sizes, reads values made for
    its own format and sizes: the fused module equals the interpreter each time."""
    built = Built(tmp_path, ALIBI, D=8, H=4)
    weights = {n: p.clone() for n, p in built.fused.state_dict().items()}
    with torch.no_grad():
        built.fused.float()(_randn(6, 8).float())
    built.fused.double().load_state_dict(weights)  # every digit back
    for length in (6, 3):
        built.literal.zero_grad()  # agree reads the interpreter's gradients from fresh ones
        built.agree(_randn(length, 8))


def test_a_value_made_under_inference_mode_is_not_reused_for_training():
    """A forward under torch.inference_mode, then a training step with the same sizes: the
    values autograd saves are made anew, and gradients flow."""
    model = _bloom(2, heads=4)
    x = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        model(x)
    model.train()
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("heads", [4, 6])
def test_bloom_with_shared_values_decodes_as_it_recomputes(heads):
    model = _bloom(2, heads)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    x = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(4))
    check_incremental_decoding(model, [x])
