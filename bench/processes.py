"""Training throughput of `cardc train` on one process against N processes under torchrun.

Both run the same command (the GPT-2 card, its recipe, the same global minibatch), taking
turns round by round so that a noisy machine slows both alike; each round is a fresh run. The
throughput is the median of the run's records after the first (global tokens per second, as
metrics.jsonl reports it), and the reported figure the median over rounds, with the ratio N
processes / one (above 1: the processes are faster). On a CPU, torchrun gives each process
one thread (OMP_NUM_THREADS=1) where one process uses every core: compare at equal threads
with --threads.

    python bench/processes.py [--procs 2] [--rounds 3] [--steps 60] [--batch 16]
                              [--block 129] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command(args: argparse.Namespace, out: Path) -> list[str]:
    return ["train", "cards/gpt2.card", "--preset", "tiny", "--steps", str(args.steps),
            "--batch-size", str(args.batch), "--block-size", str(args.block),
            "--eval-every", str(args.steps // 3), "--save-every", "0",
            "--device", args.device, "--out", str(out)]


def run_once(args: argparse.Namespace, procs: int, out: Path) -> float:
    """One run's median tokens/s over its records after the first measured one."""
    launcher = [sys.executable, "-m", "cardc"] if procs == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(procs), "-m", "cardc"]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    r = subprocess.run([*launcher, *command(args, out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{procs} process(es) failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    speeds = [rec["tokens_per_s"] for rec in records if rec["step"] > 0]
    return statistics.median(speeds[1:] or speeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=129)
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every process")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()
    speeds: dict[int, list[float]] = {1: [], args.procs: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for procs in speeds:
                speeds[procs].append(run_once(args, procs, Path(tmp) / f"r{round_}-{procs}"))
    one, many = (statistics.median(speeds[n]) for n in speeds)
    print(f"gpt2 tiny, B={args.batch}, l={args.block}, {args.device}, "
          f"threads={args.threads or 'default'}, {args.rounds} rounds (median tokens/s)")
    print(f"  1 process:   {one:>10,.0f}")
    print(f"  {args.procs} processes: {many:>10,.0f}   ratio {many / one:.2f}")


if __name__ == "__main__":
    main()
