"""`cardc eval`: the held-out next-token loss of a trained causal language model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cardc.runtime.data import (
    DataFolder,
    TokenArray,
    corpus_splits,
    is_data_folder,
    load_corpus,
)
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.tokenizer import Tokenizer, run_tokenizer
from cardc.runtime.train import PRECISIONS, Split, next_token_loss

# Where a checkpoint records none of its training's settings (one `cardc import` made).
DEFAULT_BATCHES, DEFAULT_BATCH, DEFAULT_BLOCK, DEFAULT_SEED = 20, 16, 127, 1337


def eval_tokens(run: str, meta: dict[str, Any], path: str | None) -> tuple[Split, str]:
    """The tokens to measure, read with the run's tokenizer, and what they are: the whole file
    at `path` (a prepared data folder's held-out tokens), else the held-out split of the run's
    own training corpus, cut as `cardc train` cut it."""
    tokenizer = run_tokenizer(run, meta)
    if is_data_folder(path):
        return _held_out(str(path), tokenizer), f"the held-out tokens of '{path}'"
    if path is not None:
        return tokenizer.corpus(load_corpus(path).decode("utf-8", errors="replace")), f"'{path}'"
    cfg = meta.get("train_config")
    if not isinstance(cfg, dict):
        raise RuntimeInputError("the checkpoint records no training corpus (it was not trained "
                                "by cardc train); name a text file with --data")
    corpus = cfg.get("data_path")
    if isinstance(corpus, str) and is_data_folder(corpus):
        return _held_out(corpus, tokenizer), f"the held-out split of '{corpus}'"
    return corpus_splits(load_corpus(corpus), tokenizer)[1], \
        f"the held-out split of {repr(corpus) if corpus else 'the built-in corpus'}"


def _held_out(path: str, tokenizer: Tokenizer) -> TokenArray:
    """A prepared data folder's val.bin, which must be of the run's tokenizer."""
    data = DataFolder.open(path)
    data.check_tokenizer(tokenizer)
    return data.tokens("val")


def held_out_loss(model: nn.Module, meta: dict[str, Any], tokens: Split,
                  batches: int | None, device: torch.device) -> tuple[float, str]:
    """The mean next-token cross-entropy over random windows of the tokens, and how they were
    drawn. With the run's own held-out split and as many batches as its evaluations, the
    windows are the ones training measured, so the loss is its last recorded val_loss."""
    cfg = meta.get("train_config") if isinstance(meta.get("train_config"), dict) else {}
    context = meta.get("context") or getattr(model, "max_seq_len", None) or DEFAULT_BLOCK
    block = min(int(context), len(tokens) - 1)
    if block < 1:
        raise RuntimeInputError(f"{len(tokens)} token(s) hold no next token to predict")
    batches = batches or cfg.get("eval_iters", DEFAULT_BATCHES)
    batch = cfg.get("eval_batch", DEFAULT_BATCH)
    vocab = _vocabulary(model, device)
    if isinstance(tokens, TokenArray):
        tokens = tokens.bounded(vocab)  # each window is checked as it is read
    elif int(tokens.max()) >= vocab:
        raise RuntimeInputError(f"the text has token {int(tokens.max())}, outside the model's "
                                f"vocabulary of {vocab}")
    was_training = model.training
    model.eval()
    try:
        loss = next_token_loss(model, tokens, batches, batch, block,
                               cfg.get("seed", DEFAULT_SEED) + 1, device,
                               cfg.get("precision") if cfg.get("precision") in PRECISIONS
                               else "bf16")
    finally:
        model.train(was_training)
    return loss, f"{batches} batches of {batch} windows of {block} tokens"


@torch.no_grad()
def _vocabulary(model: nn.Module, device: torch.device) -> int:
    """The width of the logits, whatever the card calls it."""
    return model(torch.zeros(1, 1, dtype=torch.long, device=device)).shape[-1]
