"""Bench worker: litgpt's GPT at a Config matching the card's GPT-2 or Llama (see
bench/timing.py). Runs under bench/.venv-litgpt (bench/setup_peers.sh).

litgpt has no learned absolute positions and no tied-embedding switch, so GPT-2 gets both
here from outside its code: the token embedding is wrapped to add a learned position table
(and rotary_percentage=0 turns RoPE off), and the unembedding shares the embedding's weight.
"""

from __future__ import annotations

from typing import Any

import torch
from litgpt import GPT, Config
from timing import Built, worker_main
from torch import nn


class WithPositions(nn.Module):
    """Token embedding plus a learned position table: GPT-2's input layer."""

    def __init__(self, wte: nn.Embedding, ctx: int):
        super().__init__()
        self.weight = wte.weight  # so the tied lm_head can share it
        self.positions = nn.Parameter(torch.empty(ctx, wte.embedding_dim).normal_(0.0, 0.02))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(idx, self.weight) + self.positions[: idx.shape[-1]]


def build(spec: dict[str, Any]) -> Built:
    h = spec["hp"]
    common = dict(name=f"bench-{spec['family']}", block_size=h["ctx"], vocab_size=h["V"],
                  padded_vocab_size=h["V"], n_layer=h["N"], n_head=h["H"], n_embd=h["D"],
                  intermediate_size=h["D_f"], norm_eps=h["eps"], parallel_residual=False)
    if spec["family"] == "gpt2":
        config = Config(**common, bias=True, norm_class_name="LayerNorm",
                        mlp_class_name="GptNeoxMLP", gelu_approximate="tanh",
                        rotary_percentage=0.0)
    else:
        config = Config(**common, bias=False, norm_class_name="RMSNorm",
                        mlp_class_name="LLaMAMLP", n_query_groups=h["H_kv"],
                        rotary_percentage=1.0, rope_base=h["theta_base"])
    model = GPT(config)
    positions = 0
    if spec["family"] == "gpt2":
        model.transformer.wte = WithPositions(model.transformer.wte, h["ctx"])
        positions = model.transformer.wte.positions.numel()
    model.lm_head.weight = model.transformer.wte.weight  # tied unembedding
    return model, positions


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


if __name__ == "__main__":
    worker_main("litgpt", build, logits_of)
