"""The functions, constants and special tokens a card may name without declaring them.

Read by the checker (what a name means, how it types), the lowering (its torch spelling) and
the renderers; it imports nothing heavier than the syntax.
"""

from __future__ import annotations

from . import syntax as s

ELEMENTWISE = {"GELU", "GELU_tanh", "ReLU", "SiLU", "σ", "exp", "log", "tanh", "cos", "sin"}
REDUCING = {"mean", "var", "max", "min"}
# min(a, b) and max(a, b) of two numbers, as a learning-rate schedule writes them
PAIRWISE = {"min", "max"}
# top_k(w | k), top_p(w | p): the distribution ∝ w on its k largest entries (ties with the k-th
# kept), or on the fewest largest whose share of Σ w reaches p; k ≥ the entries or p = 1 keeps
# every entry. Name → (the bound's name in messages, what it is)
FILTERS = dict(zip(s.FILTERS, (("k", "how many of the largest entries it keeps"),
                               ("p", "the share of the weights its largest entries must reach")),
                   strict=True))
BUILTINS = ELEMENTWISE | REDUCING | PAIRWISE | {"softmax", "length"} | set(FILTERS)
# dropout(X | p): while a model trains, each entry of X zeroed with probability p and the others
# scaled by 1/(1 − p); in evaluation (and sampling) X itself
DROPOUT = "dropout"
CONSTANTS = {"π": "math.pi"}
# θ ← AdamW(θ, ∇loss(θ) | η, β_1, β_2, λ): an update a training card may name instead of
# writing θ − η · ∇loss(θ); its hyperparameters are the learning rate, the two decay rates of
# the moment estimates and the weight decay (Loshchilov & Hutter), any trailing ones omitted
OPTIMIZERS = {"AdamW": 4}
# the paper's special tokens (§4) are the last IDs of the vocabulary V: N_V − 2, N_V − 1, N_V
SPECIAL_TOKENS = {"mask_token": 2, "bos_token": 1, "eos_token": 0}
