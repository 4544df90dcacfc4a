"""Datasets for the paper's training cards: corpus windows, and a synthetic pairs task.

Token IDs are 0-based in tensors. The paper's special tokens (§4: mask_token, bos_token and
eos_token are N_V − 2, N_V − 1 and N_V of V ≅ [N_V]) are therefore the last three IDs.
"""

from __future__ import annotations

import torch

from cardc.builtins import SPECIAL_TOKENS, special_token_id
from cardc.runtime.errors import RuntimeInputError


def special_tokens(vocab: int) -> dict[str, int]:
    """0-based IDs of the paper's special tokens for a vocabulary of `vocab` tokens."""
    return {name: special_token_id(name, vocab) for name in SPECIAL_TOKENS}


def windows(data: torch.Tensor, count: int, length: int, seed: int) -> list[torch.Tensor]:
    """`count` random windows of `length` tokens from a token stream: {x_n}_{n=1}^{N_data}."""
    if len(data) <= length:
        raise RuntimeInputError(f"the corpus has {len(data)} tokens; need more than {length}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(data) - length, (count,), generator=g)
    return [data[s : s + length].long() for s in starts.tolist()]


def reversal_pairs(count: int, vocab: int, min_len: int, max_len: int,
                   seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """{(z_n, x_n)}: z_n a random string of ordinary tokens, x_n = [bos, reversed z_n, eos].

    Reversal needs the whole source at every step, so only a model that attends across to z
    can learn it: a check that the encoder–decoder's cross-attention works.
    """
    specials = special_tokens(vocab)
    ordinary = min(specials.values())
    if ordinary < 2 or not 1 <= min_len <= max_len:
        raise RuntimeInputError(f"cannot make reversal pairs over {vocab} tokens of "
                                f"length {min_len}..{max_len}")
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        z = torch.randint(0, ordinary, (n,), generator=g)
        x = torch.cat([torch.tensor([specials["bos_token"]]), z.flip(0),
                       torch.tensor([specials["eos_token"]])])
        pairs.append((z, x))
    return pairs
