"""A fuzz harness for the files cardc reads beside cards: `python -m tests.file_fuzz --cases N
[--seed S]`.

Each case takes a valid file — a tokenizer.json, a data folder's meta.json or token file, a
checkpoint's model.safetensors — and damages it: bytes flipped, cut or put in; or, parsed, a
value swapped for another type, a huge or negative number, a deep nesting, a key dropped. Then
it reads the file as cardc does (`from_file`, `DataFolder.open`, `read_checkpoint`). The work
is bounded by the number of cases, never by a clock.

Outcomes: read (the damage was harmless), refused (one RuntimeInputError, one line, naming the
file or its folder), or a failure: any other exception, or a message that is not one line or
does not name the file. The exit status is 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cardc.runtime.checkpoint import read_checkpoint, save_checkpoint
from cardc.runtime.data import DataFolder
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.prepare import prepare
from cardc.runtime.tokenizer import TOKENIZER_FILE, from_file, train_bpe

TEXT = "the cat sat on the mat; été naïve 東京 🙂\n" * 40


def bases(root: Path) -> dict[str, Path]:
    """One valid file of each kind, under `root`."""
    (root / "tok").mkdir(parents=True)
    train_bpe(TEXT, 300).save(root / "tok")
    (root / "a.txt").write_text(TEXT, encoding="utf-8")
    prepare([str(root / "a.txt")], str(root / "data"), log=lambda _: None)
    save_checkpoint(root / "ckpt", {"w": torch.arange(6.0).reshape(2, 3)},
                    {"name": "M", "hyperparameters": {"D": 3}, "run": "0123456789abcdef"})
    return {"tokenizer": root / "tok" / TOKENIZER_FILE, "meta": root / "data" / "meta.json",
            "tokens": root / "data" / "train.bin", "checkpoint": root / "ckpt" /
            "model.safetensors"}


# ------------------------------------------------------------------ damage

ODD_VALUES: list[Callable[[random.Random], Any]] = [
    lambda r: 10**9, lambda r: 10**30, lambda r: -1, lambda r: 0, lambda r: 1.5,
    lambda r: None, lambda r: True, lambda r: "x" * r.randrange(0, 50), lambda r: [],
    lambda r: {}, lambda r: [[[[1]]]], lambda r: list(range(r.randrange(0, 20))),
    lambda r: {"id": 10**9}, lambda r: "(?:x+x+)+y",
]


def damage_bytes(r: random.Random, data: bytes) -> bytes:
    """`data` with bytes flipped, cut, put in or repeated."""
    if not data:
        return bytes([r.randrange(256)])
    kind = r.randrange(4)
    at = r.randrange(len(data))
    if kind == 0:
        return data[:at] + bytes([r.randrange(256)]) + data[at + 1:]
    if kind == 1:
        return data[:at]
    if kind == 2:
        return data[:at] + bytes(r.randrange(256) for _ in range(r.randrange(1, 8))) + data[at:]
    end = min(len(data), at + r.randrange(1, 64))
    return data[:end] + data[at:]


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a parsed JSON value, as a key path."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in list(value.items())[:200]:
            found += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:20]):
            found += paths(v, (*prefix, i))
    return found


def damage_json(r: random.Random, text: str) -> str:
    """`text` parsed, one value swapped, dropped or nested deeply, and written back."""
    value = json.loads(text)
    where = r.choice(paths(value)[1:] or [()])
    if not where:
        return json.dumps(r.choice(ODD_VALUES)(r))
    parent = value
    for key in where[:-1]:
        parent = parent[key]
    kind = r.randrange(3)
    if kind == 0 and isinstance(parent, dict):
        del parent[where[-1]]
        return json.dumps(value)
    if kind == 1:
        marker = "\x00deep\x00"
        parent[where[-1]] = marker
        depth = r.choice([70, 1000, 100_000])
        return json.dumps(value).replace(json.dumps(marker), "[" * depth + "]" * depth)
    parent[where[-1]] = r.choice(ODD_VALUES)(r)
    return json.dumps(value)


def damage_checkpoint(r: random.Random, file: Path) -> None:
    """The checkpoint's metadata damaged as JSON, or the file's bytes damaged."""
    if r.random() < 0.5:
        file.write_bytes(damage_bytes(r, file.read_bytes()))
        return
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(file), framework="pt") as f:
        metadata, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    metadata["cardc"] = damage_json(r, metadata["cardc"])
    save_file(tensors, str(file), metadata=metadata)


# ------------------------------------------------------------------ cases


def read(kind: str, file: Path) -> None:
    if kind == "tokenizer":
        from_file(file)
    elif kind == "checkpoint":
        read_checkpoint(file.parent)
    else:
        DataFolder.open(file.parent)


def run_case(r: random.Random, base: dict[str, Path], work: Path) -> tuple[str, str, str]:
    """One damaged file read: (kind, outcome, detail)."""
    kind = r.choice(sorted(base))
    folder = work / kind
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(base[kind].parent, folder)
    file = folder / base[kind].name
    if kind == "checkpoint":
        damage_checkpoint(r, file)
    elif kind == "tokens" or r.random() < 0.3:
        file.write_bytes(damage_bytes(r, file.read_bytes()))
    else:
        file.write_text(damage_json(r, file.read_text(encoding="utf-8")), encoding="utf-8")
    try:
        read(kind, file)
    except RuntimeInputError as err:
        message = str(err)
        if "\n" in message or str(folder) not in message:
            return kind, "failure", f"unlocated: {message!r}"
        return kind, "refused", message
    except Exception as err:  # anything else is a traceback for the user
        return kind, "failure", f"{type(err).__name__}: {err}"
    return kind, "read", ""


def fuzz(cases: int, seed: int, log: Callable[[str], Any] = print) -> Counter:
    """Run `cases` cases from `seed`; the count of each (kind, outcome)."""
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = bases(root / "base")
        for n in range(cases):
            kind, outcome, detail = run_case(random.Random(seed * 1_000_003 + n), base,
                                             root / "work")
            counts[kind, outcome] += 1
            if outcome == "failure":
                log(f"case {n} (seed {seed}) {kind}: {detail}")
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    counts = fuzz(args.cases, args.seed)
    failures = sum(v for (_, outcome), v in counts.items() if outcome == "failure")
    for (kind, outcome), v in sorted(counts.items()):
        print(f"{kind:10} {outcome:8} {v}")
    print(f"{args.cases} cases, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
