"""A generated module's parameters as a card's parameters: the nested structure the reference
interpreter takes (cardc.interpret), each tensor a view of the module's own storage, so a
gradient through the interpreter lands in the module's `.grad`.

The correspondence follows how a module stores a card's `Parameters:` block, read from the
card's signature alone: a tensor is an attribute (`γ^1` → `gamma1`), a bundle of the card's
own is opened in place, a bundle of a called card is a submodule, a family of called cards a
module list, and any other family is stacked: a layer's tensors on a new leading axis, heads
of a column-major card on the output (first) axis, heads of a row-major card on the last axis
with the members of equal shape side by side (`W^h_q, W^h_k, W^h_v` → `W_qkv`, laid out as
member × head × width)."""

from __future__ import annotations

from typing import Any

import torch

from cardc import syntax as s
from cardc.checker import Checker, instance
from cardc.lower.parameters import _stem
from cardc.lower.values import attr_name
from cardc.names import identifier
from cardc.types import BundleTy, Entry, FamilyTy, Ty


def card_params(checker: Checker, alg: s.Algorithm, module: torch.nn.Module) -> dict[str, Any]:
    """`alg`'s parameters, by its own names, as views of `module`'s."""
    sig = checker.info(alg).sig
    out: dict[str, Any] = {}
    for name, entry in sig.tree.members.items():
        out[name] = _entry(checker, alg, module, name, entry)
    return out


def _entry(checker: Checker, alg: s.Algorithm, module, name: str, entry: Entry) -> Any:
    if isinstance(entry, Ty):
        return getattr(module, attr_name(name))
    if isinstance(entry, BundleTy) and entry.card is None:
        return {k: _entry(checker, alg, module, k, v) for k, v in entry.members.items()}
    if isinstance(entry, BundleTy):
        return _submodule(checker, alg, getattr(module, attr_name(name)), entry)
    if isinstance(entry.entry, BundleTy) and entry.entry.card is not None:
        modules = getattr(module, attr_name(name, entry.var))
        return [_submodule(checker, alg, m, entry.entry) for m in modules]
    return _stacked(checker, alg, module, name, entry)


def _submodule(checker: Checker, alg: s.Algorithm, module, bundle: BundleTy) -> dict[str, Any]:
    """A called card's bundle: the callee's parameters of the same members, in its module."""
    callee = checker.lib.find(bundle.card, checker.lib.file_of(alg))
    own = card_params(checker, callee, module)
    tree = checker.info(callee).sig.tree.members
    for pname, pentry in tree.items():
        if isinstance(pentry, BundleTy) and list(pentry.members) == list(bundle.members):
            return own[pname]
    return dict(zip(bundle.members, own.values(), strict=False))


def _stacked(checker: Checker, alg: s.Algorithm, module, name: str, fam: FamilyTy) -> list:
    sig = checker.info(alg).sig
    env = _sizes(module, fam)
    over = int(fam.over.evaluate(env))
    members = _flat(fam.entry, name)
    axis = "lead" if _layer_family(alg, name, fam.var) else \
        "first" if sig.layout == "column" else "last"
    groups: dict[Any, list[tuple[str, Ty]]] = {}
    for member, ty in members:
        groups.setdefault(ty.shape if axis == "last" else (member,), []).append((member, ty))
    views: dict[str, list[torch.Tensor]] = {}
    for group in groups.values():
        store = getattr(module, _stem([g[0] for g in group], fam.var))
        for k, (member, ty) in enumerate(group):
            shape = [int(d.evaluate(env)) for d in ty.shape]
            if axis == "lead":
                views[member] = [store[h] for h in range(over)]
            elif axis == "first":
                view = store.unflatten(0, (over, shape[0]))
                views[member] = [view[h] for h in range(over)]
            else:
                view = store.unflatten(-1, (len(group), over, shape[-1]))
                views[member] = [view[..., k, h, :] for h in range(over)]
    return [_rebuild(fam.entry, name, views, h) for h in range(over)]


def _flat(entry: Entry, name: str) -> list[tuple[str, Ty]]:
    if isinstance(entry, Ty):
        return [(name, entry)]
    assert isinstance(entry, BundleTy), f"'{name}': a family inside a family"
    return [m for k, v in entry.members.items() for m in _flat(v, k)]


def _rebuild(entry: Entry, name: str, views: dict[str, list], h: int) -> Any:
    if isinstance(entry, Ty):
        return views[name][h]
    return {k: _rebuild(v, k, views, h) for k, v in entry.members.items()}


def _layer_family(alg: s.Algorithm, name: str, var: str) -> bool:
    """Whether a `for … do` loop (a stack of layers) indexes the family by its variable."""
    for loop in s.nodes(alg.steps):
        if isinstance(loop, s.For) and loop.style == "do":
            names = {n.id for n in s.nodes(loop.body) if isinstance(n, s.Name)}
            if any(instance(name, var, n) == loop.var for n in names):
                return True
    return False


def _sizes(module, fam: FamilyTy) -> dict[str, int | float]:
    """The hyperparameters a module keeps as attributes (`self.D`, `self.d`)."""
    syms = set(fam.over.symbols)
    for _, ty in _flat(fam.entry, "?"):
        for d in ty.shape:
            syms |= d.symbols
    return {sym: getattr(module, identifier(sym)) for sym in syms}
