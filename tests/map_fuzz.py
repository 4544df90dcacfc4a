"""A fuzz harness for mapping files: `python -m tests.map_fuzz --cases N [--seed S]`.

Each case takes a shipped mapping file (cards/*.hf.json) and damages it knowing its structure —
a key dropped, duplicated or given another type; a huge, negative or fractional number; a deep
nesting; an adversarial name or expression; a layer index over another variable; a tensor or
hyperparameter the card does not have; a constraint of the wrong type; an axis out of range —
or damages the config.json of a checkpoint exported through it. Then it runs what reads the
file: `load_mappings`, `cardc import` of a random-weight checkpoint of the card, `cardc export`
of a random-weight cardc checkpoint of the card (which finds the damaged file beside its card)
and, where the import succeeded, `cardc export` of the imported checkpoint (which carries it).
The work is bounded by the number of cases and by the few mutations each makes, never by a clock.

Outcomes of each step: done (the damage was harmless: the output folder holds its files), or
refused (exit 1 and one line `cardc: error: …` naming the file — the mapping file, config.json,
the checkpoint or its recorded mapping — or the tensor at fault, no output folder left behind; `load_mappings`: one
RuntimeInputError naming the mapping file), or a failure: a traceback, an internal error, more
than one line, a message naming no file, or a half-written output folder. Exit status 1 on any
failure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import cardc.build
from cardc.build import build_model, find_card, library_roots
from cardc.cli import main
from cardc.interop import config_for, load_mappings, write_model_hf
from cardc.interop.config import broken_constraint
from cardc.names import identifier
from cardc.presets import OverrideError, PresetError, validate
from cardc.runtime.checkpoint import save_checkpoint
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.runs import new_run_id

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkonce import cards_checked_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "cards"


# ------------------------------------------------------------------ the shipped files


@dataclass
class Family:
    """One shipped mapping file, with the files each case reads beside its damaged copy."""
    stem: str
    text: str  # the mapping file as shipped
    folder: Path  # the card and its (damaged) mapping file
    hf: Path  # a Hugging Face folder of a random-weight model, exported through the mapping
    run: Path  # a cardc checkpoint of the same model, trained as far as export can tell

    @property
    def card(self) -> Path:
        return self.folder / f"{self.stem}.card"

    @property
    def mapping(self) -> Path:
        return self.folder / f"{self.stem}.hf.json"


def small_sizes(card: str) -> dict[str, Any]:
    """The card's `tiny` preset with each whole size halved while the card, the mapping's
    constraints and export still take it: a checkpoint of a few thousand values."""
    mapping = load_mappings(card)[0]
    lib, checker, _ = cardc.build.checked([card], library_roots([card], None))
    alg = find_card(lib, checker, card, mapping.card)
    sig = checker.info(alg).sig
    env = validate(checker, alg, "tiny")
    natural = {n for n in mapping.hyperparameters if sig.hypers[n].elem == "ℕ"}
    sizes = {n: int(env[n]) if n in natural else float(env[n]) for n in mapping.hyperparameters
             if n not in sig.definitions}

    def ok(hypers: dict[str, Any]) -> bool:
        try:
            validate(checker, alg, None, hypers)
            config_for(mapping, {identifier(k): v for k, v in hypers.items()})
        except (OverrideError, PresetError, RuntimeInputError):
            return False
        return broken_constraint(mapping, hypers) is None

    for _ in range(6):
        for name in sorted(natural & set(sizes)):
            if sizes[name] % 2 == 0 and ok({**sizes, name: sizes[name] // 2}):
                sizes[name] //= 2
    return sizes


def family(path: Path, root: Path) -> Family:
    stem = path.name.removesuffix(".hf.json")
    folder = root / stem
    folder.mkdir(parents=True)
    shutil.copy(CARDS / f"{stem}.card", folder / f"{stem}.card")
    card = str(CARDS / f"{stem}.card")
    torch.manual_seed(0)
    model = build_model(card, None, small_sizes(card))
    with torch.no_grad():
        for p in model.parameters():  # every weight random: gains and biases too
            p.normal_()
    write_model_hf(load_mappings(card)[0], model.state_dict(),
                   model.card_meta["hyperparameters"], root / f"{stem}.hf")
    run = root / f"{stem}.run"
    run.mkdir()
    meta = {**model.card_meta, "card": f"{stem}.card", "run": new_run_id()}
    meta["cards"] = {(f"{stem}.card" if k.endswith(f"{stem}.card") else k): v
                     for k, v in meta["cards"].items()}
    save_checkpoint(run, model, meta)
    return Family(stem, path.read_text(encoding="utf-8"), folder, root / f"{stem}.hf", run)


def families(root: Path, only: list[str] | None = None) -> list[Family]:
    paths = sorted(CARDS.glob("*.hf.json"))
    return [family(p, root) for p in paths if only is None or p.name.removesuffix(".hf.json")
            in only]


# ------------------------------------------------------------------ damage

NUMBERS = [10**9, 10**18, 2**63, -1, -5, 0, 1.5, -0.5, 1e308, float("nan"), float("inf"), 99]
NAMES = ["", ".", "..", "../../x", "{i}", "{j}", "{i}{i}", "{", "}", "{2i + 1}", "{i - 1}",
         "{-i}", "{i * i}", "{1000000000 i}", "{0}", "{i/2}", "__class__", "a" * 5000, "é東🙂",
         "x\ny", "$(touch pwned)", "'; import os #", "block.{i}.nothing", "W_e", "lm_head.weight",
         "<script>alert(1)</script>", "Zeta", "no_such_key", "a.b.c.d"]
EXPRESSIONS = ["N * 1000000000", "0", "-N", "N / 3", "N / 0", "N // 0", "N - N", "min()",
               "max(N)", "1e30", "9" * 40, "N ** 2", "__import__('os')", "(" * 300 + "N" +
               ")" * 300, "N * N * N * N * N * N * N * N", "1 / 3", "D / H - D", "", "  ",
               "vocab_size * 1e29", "min(N, 0)", "N +", "()", "D / (H - H)", "H_kv * 0 + 1"]
CONSTRAINTS = [{"power_of_two": "yes"}, {"min": [1]}, {"one_of": 5}, {"one_of": []},
               {"max": "D / 0"}, {"multiple_of": "0"}, {"min": "N * 1000000000"}, {"x": 1},
               {"power_of_two": True}, {"one_of": [1.5, "a", None]}, {"max": -1}, "H", 3, None]
TENSOR_SPECS = [{"card": "W_e", "axis": 99}, {"card": "W_e", "axis": -5},
                {"card": "W_e", "axis": 1.5}, {"card": "W_e", "axis": "0"},
                {"card": "W_e", "chunk": [5, 2]}, {"card": "W_e", "chunk": [0, 10**9]},
                {"card": "W_e", "chunk": [-1, 2]}, {"card": "W_e", "shape": [10**9, -1]},
                {"card": "W_e", "shape": [0]}, {"card": "W_e", "transpose": "yes"},
                {"fused": {"axis": 9, "parts": ["W_e", "W_e"]}},
                {"fused": {"groups": "0", "parts": ["W_e", "W_e"]}},
                {"fused": {"groups": "-1", "parts": ["W_e", ["W_e", "0"]]}},
                {"fused": {"groups": "1000000000", "parts": ["W_e", "W_e"]}},
                {"fused": {"parts": ["W_e"]}}, {"fused": None}, {"card": None}, 7]
ODD: list[Callable[[random.Random], Any]] = [
    lambda r: r.choice(NUMBERS), lambda r: r.choice(NAMES), lambda r: r.choice(EXPRESSIONS),
    lambda r: None, lambda r: True, lambda r: [], lambda r: {}, lambda r: [[[[1]]]],
    lambda r: {"expr": r.choice(EXPRESSIONS)}, lambda r: {"key": r.choice(NAMES)},
    lambda r: r.choice(CONSTRAINTS), lambda r: r.choice(TENSOR_SPECS),
    lambda r: DEEP,
]
DEEP = "\x00deep\x00"  # written as lists nested 70, 1000 or 100,000 deep (`dumps`)


def dumps(r: random.Random, raw: Any) -> str:
    """`raw` as JSON text, each DEEP a deep nesting (which `json.dumps` cannot write)."""
    text = json.dumps(raw, ensure_ascii=r.random() < 0.5)
    while json.dumps(DEEP) in text:
        depth = r.choice([70, 1000, 100_000])
        text = text.replace(json.dumps(DEEP), "[" * depth + "]" * depth, 1)
    return text


def places(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a parsed JSON value, as a key path."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += places(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += places(v, (*prefix, i))
    return found


def retarget_index(r: random.Random, name: str) -> str:
    """A layer index of `name` over another variable or of another form."""
    return name.replace("{i}", r.choice(["{j}", "{i}{i}", "{i - 1}", "{-i}", "{i * i}", "{0}",
                                         "{1000000000 i}", "{i/2}", "{}", "{2i}", "{i + 1}"]), 1)


def mutate(r: random.Random, raw: dict[str, Any]) -> None:
    """One structure-aware change to a parsed mapping file, in place."""
    section = r.choice(["hyperparameters", "tensors", "fixed_config", "export_config",
                        "constraints", "tied", "ignore", "variants", "layers", "top", "any"])
    target = raw.get(section)
    if isinstance(target, dict) and target and r.random() < 0.8:
        key = r.choice(sorted(target))
        kind = r.randrange(5)
        if kind == 0:
            del target[key]
        elif kind == 1:  # the same value under a second name (a tensor named twice, …)
            target[r.choice([retarget_index(r, key), key + "_2", r.choice(NAMES)])] = target[key]
        elif kind == 2 and section == "tensors" and isinstance(target[key], str):
            target[key] = retarget_index(r, target[key]) if r.random() < 0.5 else \
                r.choice(NAMES)
        elif kind == 3:  # a key renamed: an unknown hyperparameter, config key or tensor
            target[r.choice(NAMES)] = target.pop(key)
        else:
            target[key] = r.choice(ODD)(r)
    elif section == "constraints":
        hypers = raw.get("hyperparameters")  # an earlier mutation may have made it another type
        raw["constraints"] = {r.choice([*(hypers if isinstance(hypers, dict) else {}),
                                        *NAMES[:4]]): r.choice(CONSTRAINTS)}
    elif section == "variants":
        card = raw.get("card") if isinstance(raw.get("card"), str) else "X"
        variants = raw.get("variants") if isinstance(raw.get("variants"), dict) else {}
        variants[r.choice(["V2", card, "Zeta"])] = {r.choice(sorted(raw)): r.choice(ODD)(r)}
        raw["variants"] = variants
    elif section == "layers":
        raw["layers"] = r.choice(EXPRESSIONS + NAMES[:6])
    elif section == "top":
        key = r.choice([*sorted(raw), "unknown_key"])
        if key in raw and r.random() < 0.5:
            del raw[key]
        else:
            raw[key] = r.choice(ODD)(r)
    else:
        where = r.choice(places(raw)[1:])
        parent = raw
        for k in where[:-1]:
            parent = parent[k]
        parent[where[-1]] = r.choice(ODD)(r)


def damage_mapping(r: random.Random, text: str) -> str:
    raw = json.loads(text)
    for _ in range(r.choice([1, 1, 2, 3])):
        mutate(r, raw)
    return dumps(r, raw)


def damage_config(r: random.Random, config: dict[str, Any], mapping: dict[str, Any]) -> str:
    """config.json with a key the mapping reads (or any key) given an odd value or dropped."""
    read = [spec if isinstance(spec, str) else spec.get("key") or "" for spec in
            mapping["hyperparameters"].values() if isinstance(spec, (str, dict))]
    key = r.choice([k for k in read if k in config] or sorted(config))
    if r.random() < 0.2:
        config.pop(key, None)
    else:
        config[key] = r.choice([*NUMBERS, *NUMBERS, r.choice(ODD)(r)])
    return dumps(r, config)


# ------------------------------------------------------------------ cases


def cli(*argv: str | Path) -> tuple[int, str]:
    """`cardc ARGV` in this process: its exit status and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def judge(code: int, err: str, out: Path, names: list[str]) -> tuple[str, str]:
    """(outcome, detail) of one command that writes `out`."""
    if code == 0:
        if not (out / "model.safetensors").is_file():
            return "failure", f"exit 0 but no model.safetensors in {out}"
        return "done", ""
    if out.exists():
        return "failure", f"exit {code} left {out} behind: {err.strip()}"
    if err.count("\n") != 1 or not err.startswith("cardc: error: "):
        return "failure", f"not one error line: {err!r}"
    if not any(name in err for name in [*names, "tensor '"]):  # a file, or a tensor by name
        return "failure", f"unlocated: {err.strip()}"
    return "refused", err.strip()


def load_step(fam: Family) -> tuple[str, str]:
    try:
        load_mappings(fam.card)
    except RuntimeInputError as err:
        message = str(err)
        if "\n" in message or str(fam.mapping) not in message:
            return "failure", f"unlocated: {message!r}"
        return "refused", message
    return "done", ""


def run_case(r: random.Random, fams: list[Family], work: Path,
             shown: Callable[[str], Any] = lambda text: None) -> list[tuple[str, str, str]]:
    """One damaged file (handed to `shown`), read by each step: [(step, outcome, detail)]."""
    fam = r.choice(fams)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hf = work / "hf"
    shutil.copytree(fam.hf, hf)
    raw = json.loads(fam.text)
    if r.random() < 0.25:
        config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
        text = damage_config(r, config, raw)
        (hf / "config.json").write_text(text, encoding="utf-8")
        fam.mapping.write_text(fam.text, encoding="utf-8")
        shown(f"{fam.stem}: config.json\n{text}")
    else:
        text = damage_mapping(r, fam.text)
        fam.mapping.write_text(text, encoding="utf-8")
        shown(f"{fam.mapping.name}\n{text}")
    located = [fam.mapping.name, "config.json", str(hf), "the checkpoint's mapping"]
    steps = [("load", *load_step(fam))]
    imported = work / "imported"
    code, err = cli("import", fam.card, "--from", hf, "--out", imported, "--library", CARDS)
    steps.append(("import", *judge(code, err, imported, located)))
    code, err = cli("export", fam.run, "--to", work / "exported", "--library", fam.folder)
    steps.append(("export", *judge(code, err, work / "exported", [*located, str(fam.run)])))
    if code == 0 and steps[1][1] == "done":
        code, err = cli("export", imported, "--to", work / "again")
        steps.append(("export-imported", *judge(code, err, work / "again",
                                                [*located, str(imported)])))
    return steps


def fuzz(cases: int | list[int], seed: int, log: Callable[[str], Any] = print,
         only: list[str] | None = None, shown: Callable[[str], Any] = lambda text: None,
         verbose: bool = False) -> Counter:
    """Run `cases` cases (that many, or these numbers) from `seed` over the mapping files
    (`only` these stems); the count of each (step, outcome)."""
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp, cards_checked_once():
        root = Path(tmp)
        fams = families(root / "base", only)
        for n in range(cases) if isinstance(cases, int) else cases:
            r = random.Random(seed * 1_000_003 + n)
            try:
                steps = run_case(r, fams, root / "work", shown)
            except Exception as err:  # what escaped a step: a traceback for the user
                steps = [("case", "failure", f"{type(err).__name__}: {err}")]
            for step, outcome, detail in steps:
                counts[step, outcome] += 1
                if outcome == "failure" or verbose:
                    log(f"case {n} (seed {seed}) {step} {outcome}: {detail}")
    return counts


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="mapping file stems (gpt2 llama …); default all")
    ap.add_argument("--show", type=int, metavar="CASE", help="run case CASE alone and print "
                    "its damaged file (with the same --seed and --only)")
    ap.add_argument("--verbose", action="store_true", help="log every refusal too")
    args = ap.parse_args(argv)
    if args.show is not None:
        counts = fuzz([args.show], args.seed, only=args.only, shown=print)
        print(dict(counts))
        return 0
    counts = fuzz(args.cases, args.seed, only=args.only, verbose=args.verbose)
    failures = sum(v for (_, outcome), v in counts.items() if outcome == "failure")
    for (step, outcome), v in sorted(counts.items()):
        print(f"{step:16} {outcome:8} {v}")
    print(f"{args.cases} cases, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_())
