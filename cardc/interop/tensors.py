"""Hugging Face tensors ↔ the card's state dict: renames, transposes, chunks, reshapes and fused
tensors split by group (every move exact: import then export gives the very bytes back)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..names import identifier
from ..runtime.errors import RuntimeInputError
from ..spelling import canonical_name
from . import expr as ex
from .mapping import Entry, Mapping, index_vars

Hypers = dict[str, Any]  # the card's hyperparameters by Python name, as a checkpoint records them


def to_card_state(mapping: Mapping, hf_state: dict[str, torch.Tensor],
                  expected: dict[str, torch.Tensor], n_layers: int,
                  hypers: Hypers | None = None) -> dict[str, torch.Tensor]:
    """Hugging Face tensors renamed, transposed, split and joined into the card's state dict.

    `expected` is the card model's state dict (for shapes); `hypers` the values a fused
    tensor's group count and sizes read. Every mismatch names the tensor."""
    mapping = mapping.sized(hypers or {})
    hf_state = _normalise(mapping, hf_state)
    counts = mapping.index_counts(hypers or {})
    _check_count(mapping, hf_state, n_layers, counts)
    entries = mapping.entries(n_layers, counts)
    _check_names(mapping, entries, hf_state, set(expected), n_layers)
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    axis: dict[str, int] = {}
    with _naming(mapping):
        _read_entries(entries, hf_state, expected, hypers or {}, parts, axis)
    for card, ts in parts.items():
        rows = sorted(k for k, _ in ts)
        if axis[card] == 0 and rows != list(range(len(rows))):  # a stacked family's, each once
            raise RuntimeInputError(f"{mapping.source}: the card's {card} gets rows {rows}, "
                                    f"not each of 0 … {len(rows) - 1} once")
    return {card: _joined([t for _, t in sorted(ts, key=lambda kt: kt[0])], axis[card])
            for card, ts in parts.items()}


@contextmanager
def _naming(mapping: Mapping) -> Iterator[None]:
    """A tensor's error names the mapping file whose entry read or wrote it."""
    try:
        yield
    except RuntimeInputError as err:
        if str(err).startswith(f"{mapping.source}:"):
            raise
        raise RuntimeInputError(f"{mapping.source}: {err}") from None


def _read_entries(entries: list[Entry], hf_state: dict[str, torch.Tensor],
                  expected: dict[str, torch.Tensor], hypers: Hypers,
                  parts: dict[str, list[tuple[int, torch.Tensor]]], axis: dict[str, int]) -> None:
    for e in entries:
        got = hf_state[e.hf]
        if e.parts:
            for card, k, t in _split_fused(e, got, expected, hypers):
                parts.setdefault(card, []).append((k, t))
                axis[card] = e.axis
            continue
        shape = expected[e.card].shape
        row = _row(e, shape)
        shape = shape[1:] if row is not None else shape
        _check_axis(e, shape)
        want = _hf_shape(e, shape, hypers)
        if tuple(got.shape) != want:
            raise RuntimeInputError(f"tensor '{e.hf}' has shape {tuple(got.shape)}; the card's "
                                    f"{e.card}{'' if row is None else f' row {row}'} needs {want}")
        got = got.reshape(_card_layout(e, shape)) if e.shape is not None else got
        got = got.T if e.transpose else got
        if row is not None:  # a member of a stacked family: its row, joined in order below
            parts.setdefault(e.card, []).append((row, got.unsqueeze(0)))
            axis[e.card] = 0
            continue
        parts.setdefault(e.card, []).append((e.chunk[0], got))
        axis[e.card] = e.axis


def _row(e: Entry, shape: torch.Size) -> int | None:
    """The row of a stacked family an entry at a layer names, checked against its rows."""
    if e.row is None:
        return None
    if not e.row.isdigit() or not shape or int(e.row) >= shape[0]:
        rows = f"{shape[0]} rows" if shape else "no rows"
        raise RuntimeInputError(f"tensor '{e.hf}': row {e.row} of the card's {e.card}, which "
                                f"has {rows}")
    return int(e.row)


def _joined(pieces: list[torch.Tensor], axis: int) -> torch.Tensor:
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=axis)


def _check_count(mapping: Mapping, hf_state: dict[str, torch.Tensor], n_layers: int,
                 counts: dict[str, int]) -> None:
    """Before the names of every layer are made: the last layer's are in the checkpoint, and
    it holds a tensor for each layer at least (a layer count of 10^9 is refused at once)."""
    _check_members(mapping, hf_state, counts, n_layers)
    per_layer = [e for e in mapping.tensors if e.per_layer]
    if not per_layer or n_layers == 0:
        return
    for e in per_layer:
        last = e.at(n_layers - 1, **mapping.last_indices(counts))
        if last.hf not in hf_state:
            raise RuntimeInputError(f"missing tensor '{last.hf}' (the card's {last.card}) of "
                                    f"layer {n_layers - 1}: the checkpoint's sizes give "
                                    f"{n_layers:,} layers")
    if n_layers > len(hf_state):  # each layer has a tensor of its own: the names are bounded
        raise RuntimeInputError(f"the checkpoint's sizes give {n_layers:,} layers, but it "
                                f"holds {len(hf_state):,} tensors")


def _check_members(mapping: Mapping, hf_state: dict[str, torch.Tensor],
                   counts: dict[str, int], n_layers: int) -> None:
    """Likewise for each further index (`indices`): its last member's tensors are in the
    checkpoint, and it holds a tensor for each member at least."""
    for var, n in counts.items():
        if n > len(hf_state):
            raise RuntimeInputError(f"the checkpoint's sizes give {n:,} members of '{var}' "
                                    f"({mapping.indices[var]}), but it holds "
                                    f"{len(hf_state):,} tensors")
        for e in mapping.tensors:
            held = all(counts.get(v, 1) > 0 for v in index_vars(e.hf))  # none of an empty index
            if n and var in index_vars(e.hf) and held and (n_layers or not e.per_layer):
                last = e.where({**mapping.last_indices(counts), var: n - 1, "i": 0})
                if last.hf not in hf_state:
                    raise RuntimeInputError(f"missing tensor '{last.hf}' (the card's "
                                            f"{last.card}): the checkpoint's sizes give {n:,} "
                                            f"members of '{var}' ({mapping.indices[var]})")


def _check_names(mapping: Mapping, entries: list[Entry], hf_state: dict[str, torch.Tensor],
                 card_names: set[str], n_layers: int) -> None:
    extra = sorted(set(hf_state) - {e.hf for e in entries})
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise RuntimeInputError(f"unexpected tensor '{extra[0]}'{more}: {mapping.source} maps no "
                                f"such tensor for a model with {n_layers} layers")
    missing = [e for e in entries if e.hf not in hf_state]
    if missing:
        raise RuntimeInputError(f"missing tensor '{missing[0].hf}' (the card's {missing[0].card})")
    mapped = {c for e in entries for c in e.cards}
    unmapped = sorted(card_names - mapped)
    if unmapped:
        raise RuntimeInputError(f"{mapping.source} does not map the card's tensor '{unmapped[0]}'")
    unknown = sorted(mapped - card_names)
    if unknown:
        raise RuntimeInputError(f"{mapping.source} maps to '{unknown[0]}', which the card's model "
                                "does not have")


def _normalise(mapping: Mapping, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add a missing base prefix, drop ignored buffers, fold tied copies."""
    prefix = mapping.base_prefix
    if prefix and not any(name.startswith(prefix) for name in hf_state):
        hf_state = {prefix + name: t for name, t in hf_state.items()}
    state = {name: t for name, t in hf_state.items() if not mapping.ignored(name)}
    for alias, target in mapping.tied.items():
        if alias in state:
            copy = state.pop(alias)
            if target in state and not torch.equal(copy, state[target]):
                raise RuntimeInputError(f"tensor '{alias}' differs from '{target}', but the card "
                                        f"{mapping.card} ties them")
    return state


def _check_axis(e: Entry, card_shape: torch.Size) -> None:
    """An entry's axis is one of its card tensor's (0 for a scalar)."""
    if e.axis >= max(1, len(card_shape)):
        raise RuntimeInputError(f"tensor '{e.hf}': axis {e.axis} is not an axis of the card's "
                                f"{e.card} of shape {tuple(card_shape)}")


def _card_layout(e: Entry, card_shape: torch.Size) -> tuple[int, ...]:
    """The card tensor's shape as a reshape sees it: transposed first where the entry says."""
    return tuple(reversed(card_shape)) if e.transpose else tuple(card_shape)


def _reshaped(e: Entry, hypers: Hypers) -> tuple[int, ...]:
    """An entry's `shape`, each expression evaluated on the card's hyperparameters."""
    where = f"tensor '{e.hf}': 'shape'"
    return tuple(n if isinstance(n, int) else _size(n, hypers, where) for n in e.shape or ())


def _hf_shape(e: Entry, card_shape: torch.Size, hypers: Hypers) -> tuple[int, ...]:
    if e.shape is not None:  # the reshape a meta tensor takes: an impossible one names the tensor
        shape = _reshaped(e, hypers)
        try:
            return tuple(torch.empty(_card_layout(e, card_shape), device="meta")
                         .reshape(shape).shape)
        except RuntimeError:
            raise RuntimeInputError(f"tensor '{e.hf}': the card's {e.card} of shape "
                                    f"{tuple(card_shape)} has no shape {list(shape)}") from None
    shape = list(card_shape)
    k, n = e.chunk
    if n > 1:
        shape[e.axis] //= n
    return tuple(reversed(shape)) if e.transpose else tuple(shape)


# ------------------------------------------------------------------ fused tensors


def _layout(e: Entry, shapes: dict[str, torch.Size],
            hypers: Hypers) -> tuple[int, list[int], list[int], tuple[int, ...]]:
    """A fused tensor's group count, each part's width in a group, each part's piece index in
    its card tensor, and the whole tensor's shape in the card's layout."""
    where = f"tensor '{e.hf}'"
    groups = _size(e.groups or "1", hypers, where)
    axis = e.axis
    first = shapes[e.parts[0].card]
    if not 0 <= axis < len(first):
        raise RuntimeInputError(f"{where}: fused axis {axis} is not an axis of the card's "
                                f"{e.parts[0].card} of shape {tuple(first)}")
    count = {c: sum(p.card == c for p in e.parts) for c in e.cards}
    widths, pieces, seen = [], [], dict.fromkeys(e.cards, 0)
    for p in e.parts:
        shape = shapes[p.card]
        others = [n for i, n in enumerate(shape) if i != axis]
        if len(shape) != len(first) or others != [n for i, n in enumerate(first) if i != axis]:
            raise RuntimeInputError(f"{where}: the card's {p.card} of shape {tuple(shape)} does "
                                    f"not fuse with {e.parts[0].card} of shape {tuple(first)} "
                                    f"along axis {axis}")
        whole, rest = divmod(shape[axis], groups * count[p.card])
        width = _size(p.size, hypers, where) if p.size is not None else whole
        if rest or width * groups * count[p.card] != shape[axis]:
            raise RuntimeInputError(f"{where}: the card's {p.card} has {shape[axis]} along axis "
                                    f"{axis}, not {count[p.card]} × {groups} groups of "
                                    f"{width if p.size is not None else shape[axis] / groups}")
        widths.append(width)
        pieces.append(seen[p.card])
        seen[p.card] += 1
    full = list(first)
    full[axis] = groups * sum(widths)
    return groups, widths, pieces, tuple(full)


def _size(text: str, hypers: Hypers, where: str) -> int:
    """A group count or part width: an expression of the card's hyperparameters."""
    e = ex.parse(text)
    env = {}
    for name in ex.names(e):
        value = hypers.get(identifier(canonical_name(name)))
        if value is None:
            raise RuntimeInputError(f"{where}: '{text}' reads '{name}', which is no "
                                    "hyperparameter of the card")
        env[name] = ex.exact(value)
    try:
        value = ex.evaluate(e, env)
    except ex.ExprError as err:
        raise RuntimeInputError(f"{where}: {err}") from None
    if value.denominator != 1 or value < 1:
        raise RuntimeInputError(f"{where}: '{text}' = {ex.number(value)} is not a positive whole "
                                "number")
    return int(value)


def _split_fused(e: Entry, got: torch.Tensor, expected: dict[str, torch.Tensor],
                 hypers: Hypers) -> list[tuple[str, int, torch.Tensor]]:
    """The card tensors' pieces of a fused Hugging Face tensor: (card name, piece, tensor)."""
    groups, widths, pieces, full = _layout(e, {c: expected[c].shape for c in e.cards}, hypers)
    want = tuple(reversed(full)) if e.transpose else full
    if tuple(got.shape) != want:
        raise RuntimeInputError(f"tensor '{e.hf}' has shape {tuple(got.shape)}; the card's "
                                f"{', '.join(e.cards)} need {want}")
    t = got.T if e.transpose else got
    a = e.axis
    grouped = t.reshape(*full[:a], groups, sum(widths), *full[a + 1:])
    out = []
    for p, piece, part in zip(e.parts, pieces, grouped.split(widths, dim=a + 1), strict=True):
        out.append((p.card, piece, part.reshape(*full[:a], -1, *full[a + 1:])))
    return out


def _join_fused(e: Entry, state: dict[str, torch.Tensor], hypers: Hypers) -> torch.Tensor:
    """The Hugging Face tensor the card tensors' pieces make, group by group."""
    groups, widths, pieces, full = _layout(e, {c: state[c].shape for c in e.cards}, hypers)
    a = e.axis
    chunks = []
    for p, piece, width in zip(e.parts, pieces, widths, strict=True):
        t = state[p.card].detach().narrow(a, piece * groups * width, groups * width)
        chunks.append(t.reshape(*full[:a], groups, width, *full[a + 1:]))
    fused = torch.cat(chunks, dim=a + 1).reshape(full)
    return fused.T if e.transpose else fused


# ------------------------------------------------------------------ export


def from_card_state(mapping: Mapping, state: dict[str, torch.Tensor], n_layers: int,
                    hypers: Hypers | None = None) -> dict[str, torch.Tensor]:
    """The card's state dict under Hugging Face names, each tensor contiguous and unshared;
    a bare base model's names without the base prefix, as its checkpoints have them."""
    mapping = mapping.sized(hypers or {})
    counts = mapping.index_counts(hypers or {})
    last = mapping.last_indices(counts)
    for e in (e.at(n_layers - 1, **last) for e in mapping.tensors if e.per_layer and n_layers > 0):
        lacking = [c for c in e.cards if c not in state]
        if lacking:  # before the names of every layer are made
            raise RuntimeInputError(f"the checkpoint lacks the card's tensor '{lacking[0]}' of "
                                    f"layer {n_layers - 1}: its hyperparameters give "
                                    f"{n_layers:,} layers")
    entries = mapping.entries(n_layers, counts)
    unmapped = sorted(set(state) - {c for e in entries for c in e.cards})
    if unmapped:
        raise RuntimeInputError(f"{mapping.source} does not map the card's tensor '{unmapped[0]}'")
    with _naming(mapping):
        out = {e.hf: _written(e, state, hypers or {}) for e in entries}
    if mapping.base_model and mapping.base_prefix:
        out = {name.removeprefix(mapping.base_prefix): t for name, t in out.items()}
    return out


def _written(e: Entry, state: dict[str, torch.Tensor], hypers: Hypers) -> torch.Tensor:
    """The Hugging Face tensor of entry `e`, made from the card's."""
    lacking = [c for c in e.cards if c not in state]
    if lacking:
        raise RuntimeInputError(f"the checkpoint lacks the card's tensor '{lacking[0]}'")
    if e.parts:
        return _join_fused(e, state, hypers).contiguous().clone().cpu()
    t = state[e.card].detach()
    row = _row(e, t.shape)
    t = t[row] if row is not None else t
    _check_axis(e, t.shape)
    k, n = e.chunk
    t = t.chunk(n, dim=e.axis)[k] if n > 1 else t
    t = t.T if e.transpose else t
    t = t.reshape(_reshaped(e, hypers)) if e.shape is not None else t
    return t.contiguous().clone().cpu()
