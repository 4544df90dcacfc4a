"""Training-step speed of the card-generated GPT-2 against Hugging Face's GPT2LMHeadModel.

Same config, batch, dtype and optimizer (AdamW); the two are timed in alternation, several
rounds, and the medians compared, so that a noisy machine affects both alike.

    python bench/train_step.py [--preset tiny] [--batch 8] [--block 128] [--rounds 7] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def ours(preset: str):
    import cardc

    return cardc.model(str(ROOT / "cards" / "gpt2.card"), preset=preset)


def theirs(model) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    h = model.card_meta["hyperparameters"]
    config = GPT2Config(vocab_size=h["V"], n_positions=h["ctx"], n_embd=h["D"], n_layer=h["N"],
                        n_head=h["H"], n_inner=h["D_f"], activation_function="gelu_new",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=h["eps"], bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "sdpa"  # its fastest attention, as ours uses
    return GPT2LMHeadModel(config)


def step_time(model, loss_of, batch, steps: int, device: torch.device) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = batch
    for _ in range(2):  # warm up
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=5, help="steps timed per round")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    a = ours(args.preset).to(device)
    b = theirs(a).to(device)
    V = a.card_meta["hyperparameters"]["V"]
    x = torch.randint(0, V, (args.batch, args.block + 1), device=device)
    batch = x[:, :-1], x[:, 1:]
    runs = {
        "cardc": (a, lambda m, x, y: m(x, y)[1]),
        "transformers": (b, lambda m, x, y: m(x, labels=x).loss),  # it shifts labels itself
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, (model, loss_of) in runs.items():
            times[name].append(step_time(model, loss_of, batch, args.steps, device))
    tokens = args.batch * args.block
    print(f"GPT-2 {args.preset}, batch {args.batch}×{args.block}, fp32, {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds × {args.steps} steps")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<13} {med * 1e3:8.1f} ms/step  {tokens / med:10,.0f} tok/s")
    ratio = statistics.median(times["transformers"]) / statistics.median(times["cardc"])
    print(f"  cardc is {ratio:.2f}× the speed of transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
