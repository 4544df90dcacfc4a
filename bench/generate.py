"""Generation speed: the sampling card with its KV cache against `transformers`' `generate`.

Both continue the same prompt greedily by the same number of tokens with the same weights: ours
through the family's sampling card (`cards/gpt2_sampling.card`, …), the function `cardc sample`
runs, which decodes through the generated model's KV cache; theirs through `generate` with its
own cache. The two alternate over several rounds; medians and their ratio are reported, and the
continuations are checked to be the same tokens.

    python bench/generate.py [--family gpt2|llama] [--preset tiny] [--tokens 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def ours(family: str, preset: str, ctx: int):
    import cardc
    from cardc import build

    model = cardc.model(str(ROOT / "cards" / f"{family}.card"), preset=preset, ctx=ctx).eval()
    lib, checker, _ = build.checked([str(ROOT / "cards" / f"{family}_sampling.card")],
                                    str(ROOT / "cards"))
    card = next(a for f in lib.files if f.path.endswith(f"{family}_sampling.card")
                for a in f.algorithms)
    return model, build.procedure_function(checker, card)


def theirs(family: str, model) -> torch.nn.Module:
    """The same weights in transformers, exported through the card's mapping file."""
    from transformers import AutoModelForCausalLM

    from cardc import interop

    mapping = interop.load_mapping(ROOT / "cards" / f"{family}.card")
    hypers = model.card_meta["hyperparameters"]
    tensors = interop.from_card_state(mapping, model.state_dict(), hypers["N"])
    with tempfile.TemporaryDirectory() as folder:
        interop.write_hf(folder, tensors, interop.config_for(mapping, hypers))
        return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()


def timed(run) -> tuple[float, torch.Tensor]:
    """Seconds of one continuation, both sides under inference mode as `cardc sample` runs
    (`generate`'s own no_grad inside it changes nothing)."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = run()
    return time.perf_counter() - start, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="gpt2", choices=["gpt2", "llama", "qwen2"])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--tokens", type=int, default=256, help="tokens to add")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    ctx = args.prompt + args.tokens  # room for the whole continuation, for both
    model, sampler = ours(args.family, args.preset, ctx)
    hf = theirs(args.family, model)
    V = model.card_meta["hyperparameters"]["V"]
    prompt = torch.randint(0, V, (1, args.prompt))
    runs = {
        "cardc": lambda: sampler(prompt, model, l_gen=args.tokens, tau=0, ctx=ctx),
        "transformers": lambda: hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
            min_new_tokens=args.tokens, do_sample=False, use_cache=True,
            pad_token_id=0)[:, args.prompt:],
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    outs: dict[str, torch.Tensor] = {}
    for name, run in runs.items():  # warm up
        outs[name] = timed(run)[1]
    for _ in range(args.rounds):
        for name, run in runs.items():
            seconds, outs[name] = timed(run)
            times[name].append(seconds)
    same = torch.equal(outs["cardc"], outs["transformers"])
    print(f"{args.family} {args.preset} (ctx {ctx}), greedy, prompt {args.prompt} + "
          f"{args.tokens} tokens, batch 1, fp32, cpu, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} rounds")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<13} {med:8.3f} s  {args.tokens / med:10,.0f} tok/s")
    ratio = statistics.median(times["transformers"]) / statistics.median(times["cardc"])
    print(f"  cardc is {ratio:.2f}× the speed of transformers; same tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
