"""Joined projections (cardc.lower.joining): sibling products of one input become one product
while decoding, and nothing changes anywhere else."""

from __future__ import annotations

import pytest
import torch

import cardc
from cardc import ir
from cardc.lower.joining import join_projections

X, Z = ir.Ref("X"), ir.Ref("Z")
W_a, W_b, W_c, b_a = (ir.Ref(f"self.{n}") for n in ("W_a", "W_b", "W_c", "b_a"))
NONE = ir.Lit("None")


def _joined(body: list[ir.Stmt]) -> list[ir.Stmt]:
    params = [ir.Param(n, (ir.Lit("4"), ir.Lit("4")), ir.Lit("w")) for n in ("W_a", "W_b", "W_c")]
    params.append(ir.Param("b_a", (ir.Lit("4"),), ir.Lit("b")))
    program = ir.Program([], modules=[ir.Module("M", "", "", [], [], params, [], [], body)])
    join_projections(program)
    return program.modules[0].body


def _project(x: ir.Ref, *pairs: tuple[ir.Expr, ir.Expr]) -> ir.Call:
    return ir.Call(ir.Ref("project"), (x, *(ir.Seq(p) for p in pairs)),
                   (("cache", ir.Ref("cache")),))


def _set(target: str, value: ir.Expr) -> ir.Assign:
    return ir.Assign((target,), value)


def test_sibling_products_in_whole_statements_bind_their_targets_at_once():
    linear = ir.Call(ir.Ref("F.linear"), (X, ir.Attr(W_a, "T"), b_a))
    body = _joined([_set("Q", linear), _set("K", ir.Bin("@", X, W_b)),
                    _set("V", ir.Bin("@", X, W_c)), ir.Return(ir.Ref("Q"))])
    assert body == [ir.Assign(("Q", "K", "V"), _project(X, (W_a, b_a), (W_b, NONE), (W_c, NONE))),
                    ir.Return(ir.Ref("Q"))]


def test_products_inside_expressions_are_read_from_one_joined_tuple():
    linear = ir.Call(ir.Ref("F.linear"), (X, ir.Attr(W_a, "T"), b_a))
    gate = ir.Call(ir.Ref("F.silu"), (linear,))
    body = _joined([ir.Return(ir.Bin("@", ir.Bin("*", gate, ir.Bin("@", X, W_b)), W_c))])
    xw = [ir.Sub(ir.Ref("XW"), (ir.Lit(str(k)),)) for k in range(2)]
    assert body == [
        _set("XW", _project(X, (W_a, b_a), (W_b, NONE))),
        ir.Return(ir.Bin("@", ir.Bin("*", ir.Call(ir.Ref("F.silu"), (xw[0],)), xw[1]), W_c))]


BIASED = ir.Call(ir.Ref("F.linear"), (X, ir.Attr(W_a, "T"), b_a))


@pytest.mark.parametrize("body", [
    # the input is rebound between the products: they read different values
    [_set("A", BIASED), _set("X", ir.Ref("A")), _set("B", ir.Bin("@", X, W_b))],
    # a statement other than an assignment ends the run
    [_set("A", BIASED), ir.If(ir.Ref("c"), (_set("Y", X),)), _set("B", ir.Bin("@", X, W_b))],
    # products of different inputs, one product of each
    [_set("A", BIASED), _set("B", ir.Bin("@", Z, W_b))],
    # a product by an activation or by an attribute that is no parameter
    [_set("A", BIASED), _set("B", ir.Bin("@", X, ir.Ref("Y"))),
     _set("C", ir.Bin("@", X, ir.Ref("self.d")))],
    # the same product twice is one product
    [_set("A", BIASED), _set("B", ir.Bin("+", BIASED, X))],
    # a memo's miss runs later, if at all
    [_set("A", BIASED), _set("B", ir.Call(ir.Ref("memo"), (ir.Lambda(ir.Bin("@", X, W_b)),)))],
    # no product has a bias: the split would cost what joining saves
    [_set("A", ir.Bin("@", X, W_a)), _set("B", ir.Bin("@", X, W_b)),
     _set("C", ir.Bin("@", X, W_c))],
])
def test_products_that_are_not_siblings_stay_as_they_are(body):
    assert _joined(list(body)) == body


def _decoder(seed: int = 0):
    torch.manual_seed(seed)
    model = cardc.model("cards/stablelm2.card", V=97, D=32, H=4, H_kv=2, D_f=48, N=2, ctx=24,
                        d_r=4).eval()
    with torch.no_grad():
        for p in model.parameters():  # the biases too, so that none hides a mistake
            p.add_(0.1 * torch.randn_like(p))
    return model


def _decode(model, x, cache):
    return torch.cat([model(x[:, :5], cache=cache),
                      *(model(x[:, t:t + 1], cache=cache) for t in range(5, x.shape[1]))], 1)


def test_decoding_joins_each_attentions_weights_once_and_equals_full_recomputation():
    model = _decoder()
    x = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        rows = _decode(model, x, cache)
    torch.testing.assert_close(rows, full, rtol=0, atol=1e-5)
    attn = model.block[0].attn
    assert len(cache.joins) == len(model.block)  # queries, keys and values; not gate and up
    W, b, widths = cache.joins[id(attn.W_q), id(attn.W_k), id(attn.W_v)]
    assert torch.equal(W, torch.cat([attn.W_q, attn.W_k, attn.W_v], 1))
    assert torch.equal(b, torch.cat([attn.b_q, attn.b_k, attn.b_v]))
    assert widths == [32, 16, 16]


def test_weights_changed_between_generations_are_joined_anew():
    """A cache belongs to one generation: a new one joins the weights as they are now."""
    model = _decoder()
    x = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        _decode(model, x, model.new_cache())
        for p in model.parameters():
            p.mul_(1.5)
        torch.testing.assert_close(_decode(model, x, model.new_cache()), model(x), rtol=0,
                                   atol=1e-5)


def test_nothing_is_joined_with_gradients_without_a_cache_or_past_the_size_bound(monkeypatch):
    model = _decoder()
    x = torch.randint(0, 97, (1, 9))
    cache = model.new_cache()
    _decode(model, x, cache)  # gradients enabled: the products are the card's own
    assert cache.joins == {}
    names = type(model).forward.__globals__  # the generated module's
    monkeypatch.setitem(names, "JOINED_MAX", 32 * 64 - 1)  # one fewer than W_q, W_k, W_v
    with torch.no_grad():
        cache = model.new_cache()
        rows = _decode(model, x, cache)
    assert list(cache.joins.values()) == [None] * len(model.block)
    torch.testing.assert_close(rows, model(x).detach(), rtol=0, atol=1e-5)
    attn = model.block[0].attn
    X = torch.randn(1, 3, 32)
    Q, K, V = names["project"](X, (attn.W_q, attn.b_q), (attn.W_k, None), (attn.W_v, None))
    assert torch.equal(Q, torch.nn.functional.linear(X, attn.W_q.T, attn.b_q))
    assert torch.equal(K, X @ attn.W_k) and torch.equal(V, X @ attn.W_v)
