"""Generation speed: the sampling card with its KV cache against `transformers`' `generate`.

Both continue the same prompt greedily by the same number of tokens with the same weights: ours
through the library's generic sampling card (cards/recipes/lm_sampling.card) bound to the model
card, the function `cardc sample` runs, which decodes through the generated model's KV cache;
theirs through `generate` with its own cache, the model built from the config `cardc export`
writes through the card's mapping file and holding the same weights. The two alternate over
several rounds; medians and their ratio are reported, by the clock and in the process's CPU
time (steadier on a busy machine), and the continuations are checked to be
the same tokens (no ratio where they differ, nor where the model has no KV cache: it then
recomputes every position, which the report says). Any model card with a mapping file works:
`--card PATH` (its mapping `PATH.hf.json` beside it, or `--mapping`), or `--family NAME` for
cards/NAME.card.

An encoder–decoder (t5, bart) is given a random source of `--source` tokens: ours through its
generated `generate(source, start, n)`, which encodes the source once per cache (no sampling
card takes a source), theirs through `generate(input_ids=source, decoder_input_ids=start)`,
both continuing `--prompt` decoder tokens, with no end token to stop either early.

    python bench/generate.py [--family gpt2|llama|qwen2|bloom|t5|bart | --card PATH
                             [--mapping FILE]] [--preset tiny] [--set NAME=VALUE]
                             [--tokens 256] [--rounds 5] [--source 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from timing import encodes

ROOT = Path(__file__).resolve().parent.parent


# config.json keys that bound the positions a model reads: the hyperparameter a mapping file
# ties to one is set to the prompt and continuation's length, for both models
POSITION_KEYS = {"max_position_embeddings", "n_positions", "n_ctx"}


def context_hyper(mapping) -> str | None:
    """The card's hyperparameter that the mapping ties to the model's number of positions."""
    return next((name for name, spec in mapping.hyperparameters.items()
                 if POSITION_KEYS & set(spec.keys)), None)


def ours(card: str, name: str | None, preset: str, overrides: dict[str, float]):
    """The model card's module and the sampler `cardc sample` runs for it, with the name of
    the sampler's window hyperparameter and the bounds of its top_k and top_p steps (no
    sampler for an encoder–decoder)."""
    from cardc import build
    from cardc.names import identifier

    model = build.build_model(card, preset, overrides, name=name).eval()
    if encodes(model):  # an encoder–decoder: no sampling card takes its source
        return model, None, None, {}
    lib, checker, _ = build.checked([card], build.library_roots([card]))
    alg = build.find_card(lib, checker, card, name)
    sampler = build.recipe_for(lib, checker, alg, training=False)
    window = next((m.window for m in checker.info(sampler).sig.models.values()), None)
    bounds = {f: identifier(n) for f, n in build.filter_bounds(checker, sampler).items()}
    return model, build.procedure_function(checker, sampler), window and identifier(window), \
        bounds


def theirs(mapping, model) -> torch.nn.Module:
    """The same weights in transformers, exported through the card's mapping file."""
    from worker_transformers import as_transformers

    return as_transformers(mapping, model).eval()


def encoder_decoder_runs(model, hf, vocab: int, args) -> dict:
    """Greedy continuations of an encoder–decoder by both, after a random source: ours
    through the generated generate, theirs with nothing that would end it early."""
    from transformers import GenerationConfig

    source = torch.randint(0, vocab, (1, args.source))
    start = torch.randint(0, vocab, (1, args.prompt))
    settings = GenerationConfig(
        max_new_tokens=args.tokens, min_new_tokens=0, do_sample=False, num_beams=1,
        eos_token_id=None, pad_token_id=0, decoder_start_token_id=int(start[0, 0]),
        forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0,
        repetition_penalty=1.0, use_cache=True)
    hf.generation_config.forced_eos_token_id = hf.generation_config.eos_token_id = None
    return {
        "cardc": lambda: model.generate(source, start, args.tokens, temperature=0)[:, args.prompt:],
        "transformers": lambda: hf.generate(input_ids=source, decoder_input_ids=start,
                                            generation_config=settings)[:, args.prompt:],
    }


def timed(run) -> tuple[float, float, torch.Tensor]:
    """Seconds of one continuation, by the clock and in this process's CPU time, both sides
    under inference mode as `cardc sample` runs (`generate`'s own no_grad inside it changes
    nothing). On a busy machine the clock also counts the time other processes held the
    cores; the CPU time does not."""
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = run()
    return time.perf_counter() - start, time.process_time() - cpu, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="gpt2", help="cards/FAMILY.card (default: gpt2)")
    p.add_argument("--card", help="any model card file (instead of --family)")
    p.add_argument("--name", help="which card of the file (default: its model card)")
    p.add_argument("--mapping", help="its mapping file (default: CARD.hf.json beside it)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a hyperparameter of the model card")
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--tokens", type=int, default=256, help="tokens to add")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--source", type=int, default=32,
                   help="an encoder–decoder's source length in tokens")
    args = p.parse_args()
    from cardc import interop

    card = args.card or str(ROOT / "cards" / f"{args.family}.card")
    mappings = interop.parse_mappings(
        json.loads(Path(args.mapping).read_text(encoding="utf-8")), args.mapping) \
        if args.mapping else interop.load_mappings(card)
    mapping = interop.select_by_name(mappings, args.name)
    overrides = {k: float(v) for k, _, v in (s.partition("=") for s in args.set)}
    ctx = max(args.prompt + args.tokens, args.source)  # room for the whole continuation
    if context_hyper(mapping):
        overrides.setdefault(context_hyper(mapping), ctx)
    torch.manual_seed(0)
    model, sampler, window, bounds = ours(card, mapping.card, args.preset, overrides)
    hf = theirs(mapping, model)
    vocab = hf.get_output_embeddings().weight.shape[0]
    prompt = torch.randint(0, vocab, (1, args.prompt))
    every = {"top_k": vocab, "top_p": 1.0}  # bounds that keep every token, as cardc sample's
    runs = encoder_decoder_runs(model, hf, vocab, args) if encodes(model) else {
        "cardc": lambda: sampler(prompt, model, l_gen=args.tokens, tau=0,
                                 **({window: ctx} if window else {}),
                                 **{name: every[f] for f, name in bounds.items()}),
        "transformers": lambda: hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
            min_new_tokens=args.tokens, do_sample=False, use_cache=True,
            pad_token_id=0)[:, args.prompt:],
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    outs: dict[str, torch.Tensor] = {}
    for name, run in runs.items():  # warm up
        outs[name] = timed(run)[2]
    for _ in range(args.rounds):
        for name, run in runs.items():
            seconds, used, outs[name] = timed(run)
            times[name].append(seconds)
            cpu[name].append(used)
    same = torch.equal(outs["cardc"], outs["transformers"])
    print(f"{mapping.card} ({Path(card).name}) {args.preset} (ctx {ctx}), greedy, prompt {args.prompt} + "
          f"{args.tokens} tokens, batch 1, fp32, cpu, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} rounds; transformers' "
          f"attention: {hf.config._attn_implementation}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<13} {med:8.3f} s  {args.tokens / med:10,.0f} tok/s   "
              f"CPU {statistics.median(cpu[name]):8.3f} s")
    if not same:
        print("  the continuations differ: no speed is compared")
        return 1
    if not hasattr(model, "new_cache"):  # the lowering proved no cache for every attention
        print(f"  {mapping.card} decodes without a KV cache: each token recomputes every "
              "position before it, so no speed-up is reported")
        return 0
    ratio = statistics.median(times["transformers"]) / statistics.median(times["cardc"])
    by_cpu = statistics.median(cpu["transformers"]) / statistics.median(cpu["cardc"])
    print(f"  cardc is {ratio:.2f}× the speed of transformers ({by_cpu:.2f}× in CPU time); "
          f"same tokens: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
