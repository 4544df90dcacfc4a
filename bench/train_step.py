"""Training-step speed of the card-generated GPT-2 and Llama against transformers and litgpt.

Each implementation builds the same architecture at the same hyperparameters (taken from the
card), and times training steps (forward, cross-entropy, backward, fused AdamW step) on the same
batch in the same dtype: fp32 on the CPU, bf16 autocast on CUDA. Every (implementation, round)
runs in a fresh worker process, bench/worker_NAME.py, under that implementation's own Python
(litgpt's lives in bench/.venv-litgpt: bench/setup_peers.sh), the implementations taking turns
round by round, so that a noisy machine slows all alike. Reported: median tokens/s over the
rounds, the ratio ours/peer (above 1: the card's code is faster), and on CUDA the MFU.

    python bench/train_step.py [--model gpt2 llama] [--config tiny mid] [--batch 8] [--rounds 5]
                               [--device cpu|cuda] [--compile] [--peers transformers litgpt]

Any model card with a mapping file: `--card PATH [--name CARD] [--mapping FILE] [--preset P]
[--set NAME=VALUE]` times it against the `transformers` model its mapping exports to (the
config `cardc export` writes, the same initial weights); litgpt only for the built-in families.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from timing import flops_per_token, peak_bf16_flops

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# name: (card preset, card overrides, block length T); "full": GPT-2 124M and SmolLM2-135M,
# the vocabulary padded to a multiple of 64 (GPT-2's 50,257 to 50,304, as nanoGPT does)
CONFIGS: dict[str, dict[str, tuple[str, dict[str, int], int]]] = {
    "gpt2": {
        "tiny": ("tiny", {}, 128),
        "mid": ("tiny", {"N": 6, "D": 384, "H": 6, "D_f": 1536}, 256),
        "full": ("gpt2", {"V": 50304}, 1024),
    },
    "llama": {
        "tiny": ("tiny", {}, 128),
        "mid": ("tiny", {"N": 6, "D": 384, "H": 6, "H_kv": 2, "D_f": 1024}, 256),
        "full": ("smollm2-135m", {}, 1024),
    },
}
IMPLS = ("cardc", "transformers", "litgpt")


def hyperparameters(family: str, preset: str, overrides: dict[str, int]) -> dict[str, Any]:
    """The card's hyperparameters at a preset, under their Python names (V, D, …, theta_base)."""
    import cardc

    return cardc.model(str(ROOT / "cards" / f"{family}.card"), preset=preset,
                       **overrides).card_meta["hyperparameters"]


def run_worker(python: str, impl: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One round of one implementation in a process of its own; its JSON result."""
    env = dict(os.environ)
    if impl == "cardc" or spec.get("card"):  # importable without an install, as on a bare GPU
        # machine; the transformers worker exports any card through cardc's mapping
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([python, str(BENCH / f"worker_{impl}.py"), json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {impl} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def card_spec(card: str, preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """A worker's spec for any model card: its hyperparameters as built, and its mapping."""
    from cardc.build import build_model

    overrides = {k: float(v) for k, _, v in (s.partition("=") for s in args.set)}
    model = build_model(card, preset, overrides, name=args.name)
    mapping = args.mapping or str(Path(card).with_suffix(".hf.json"))
    return {"family": model.card_meta["name"], "card": str(Path(card).resolve()),
            "name": model.card_meta["name"], "mapping": str(Path(mapping).resolve()),
            "preset": preset, "overrides": overrides,
            "hp": model.card_meta["hyperparameters"], **card_input(card, args.name, model)}


def card_input(card: str, name: str | None, model: Any) -> dict[str, Any]:
    """What a card's model takes, from its signature: tokens (nothing to add: the spec's V and
    block), or a real tensor (`shape`, at the built hyperparameters) scored into `classes`
    logits, whose batch is random examples and class labels, one example a "token"."""
    from cardc.build import checked, find_card, library_roots
    from cardc.types import Ty

    lib, checker, _ = checked([card], library_roots([card], None), lazy=True)
    sig = checker.info(find_card(lib, checker, card, name)).sig
    (_, x), out = sig.inputs[0], sig.output
    if x.elem != "ℝ":
        return {}
    size = lambda d: int(d.evaluate(model.card_meta["hyperparameters"]))  # noqa: E731
    assert isinstance(out, Ty) and out.rank == 1, "a real-valued input needs a vector of logits"
    return {"shape": [size(d) for d in x.shape], "classes": size(out.shape[0])}


def bench_one(family: str, config: str, impls: dict[str, str],
              args: argparse.Namespace, card: str | None = None) -> dict[str, Any]:
    if card is not None:
        spec = card_spec(card, config, args)
        block = 1 if "shape" in spec else 128  # an example, not a sequence of tokens
    else:
        preset, overrides, block = CONFIGS[family][config]
        spec = {"family": family, "preset": preset, "overrides": overrides,
                "hp": hyperparameters(family, preset, overrides)}
    spec.update({"batch": args.batch, "block": args.block or block, "steps": args.steps,
                 "warmup": args.warmup, "device": args.device, "compile": args.compile,
                 "profile": args.profile, "seed": 0})
    names = list(impls)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    failed: set[str] = set()
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate who goes first
            if name in failed:
                continue
            try:
                results[name].append(run_worker(impls[name], name, spec))
            except RuntimeError as e:  # a peer that cannot run here: say so, time the others
                print(f"{spec['family']} {config}: {e}", file=sys.stderr, flush=True)
                failed.add(name)
    return {"family": spec["family"], "config": config, "spec": spec,
            "results": {name: rounds for name, rounds in results.items() if rounds}}


def report(run: dict[str, Any], device: str) -> list[str]:
    spec, hp, results = run["spec"], run["spec"]["hp"], run["results"]
    T = spec["block"]
    if "cardc" not in results:
        return [f"{run['family']} {run['config']}: the card's model did not run (above)"]
    first = results["cardc"][0]
    sizes = all(k in hp for k in ("N", "H", "D"))  # MFU needs layers and heads by these names
    flops = flops_per_token(first["params"] - first["position_params"], hp["N"], hp["H"],
                            hp["D"] // hp["H"], T) if sizes else None
    peak = peak_bf16_flops(first.get("device_name", ""))
    dtype = "bf16 autocast" if device.startswith("cuda") else "fp32"
    shown = " ".join(f"{k}={v}" for k, v in hp.items() if isinstance(v, int))
    unit, batch = ("ex", spec["batch"]) if "shape" in spec else ("tok", f"{spec['batch']}×{T}")
    lines = [f"{run['family']} {run['config']}: {shown}, batch {batch}, {dtype}, "
             f"fused AdamW, {device}"
             + (f" ({first['device_name']})" if "device_name" in first else "")
             + (", torch.compile" if spec["compile"] else "")
             + f"; median of {len(results['cardc'])} rounds × {spec['steps']} steps"]
    ours = statistics.median(r["tokens_per_s"] for r in results["cardc"])
    for name, rounds in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in rounds)
        low, high = min(r["tokens_per_s"] for r in rounds), max(r["tokens_per_s"] for r in rounds)
        line = (f"  {name:<13} {tps:12,.0f} {unit}/s  [{low:,.0f}–{high:,.0f}]"
                f"  {1e3 * spec['batch'] * T / tps:8.1f} ms/step  {rounds[0]['params']:>11,} params"
                f"  torch {rounds[0]['torch']}")
        if flops is not None and peak is not None:
            line += f"  MFU {tps * flops / peak:6.1%}"
        if "peak_memory_gib" in rounds[0]:
            line += f"  peak {max(r['peak_memory_gib'] for r in rounds):5.1f} GiB"
        if name != "cardc":
            line += f"  ours/peer {ours / tps:.2f}×"
        lines.append(line)
    for name, rounds in results.items():  # the first round's profile, where asked for
        if "profile" in rounds[0]:
            lines.append(f"  {name} spends: " + ", ".join(
                f"{op} {share:.0%}" for op, share in rounds[0]["profile"]))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--config", nargs="+", choices=["tiny", "mid", "full"],
                   help="the built-in families' sizes (default: tiny mid; full: GPT-2 124M, "
                        "SmolLM2-135M)")
    p.add_argument("--card", action="append", default=[],
                   help="any model card file, instead of --model; repeat for more")
    p.add_argument("--name", help="which card of a --card file (default: its model card)")
    p.add_argument("--mapping", help="a --card's mapping file (default: CARD.hf.json)")
    p.add_argument("--preset", nargs="+", help="a --card's presets (default: tiny); for --model, "
                                               "the same as --config")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a hyperparameter of a --card")
    p.add_argument("--peers", nargs="+", choices=IMPLS[1:], default=list(IMPLS[1:]))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=0, help="T; 0: the config's (tiny 128, mid 256)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps timed per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first in each round")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--profile", action="store_true",
                   help="also where each implementation's step goes: its costliest operators")
    p.add_argument("--python", default=sys.executable, help="Python for cardc and transformers")
    p.add_argument("--litgpt-python", default=str(BENCH / ".venv-litgpt" / "bin" / "python"),
                   help="Python with litgpt installed (bench/setup_peers.sh)")
    p.add_argument("--json", help="also write every round's results to this file")
    args = p.parse_args()
    impls = {"cardc": args.python}
    for peer in args.peers:
        python = args.litgpt_python if peer == "litgpt" else args.python
        if not (Path(python).exists() or shutil.which(python)):
            print(f"skipping {peer}: no {python} (run bench/setup_peers.sh)", file=sys.stderr)
            continue
        impls[peer] = python
    runs = []
    if args.card:
        impls.pop("litgpt", None)  # its worker knows the built-in families only
        for card in args.card:
            for preset in args.preset or ["tiny"]:
                runs.append(bench_one("", preset, impls, args, card))
                print("\n".join(report(runs[-1], args.device)), flush=True)
    configs = [] if args.card else args.config or args.preset or ["tiny", "mid"]
    if not set(configs) <= {"tiny", "mid", "full"}:
        p.error(f"--config/--preset for --model: tiny, mid or full, not {' '.join(configs)}")
    for family in args.model:  # none with --card: configs is empty
        for config in configs:
            runs.append(bench_one(family, config, impls, args))
            print("\n".join(report(runs[-1], args.device)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
