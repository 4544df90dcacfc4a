"""Config keys that never change what a model computes from its weights, in any family: the one
shared list of keys that only set initialisation, loading, storage or generation. A mapping file
never needs to name them, and they never block an import (its own `harmless` adds a family's).

The first group is every key of `transformers.PretrainedConfig().to_dict()` (transformers 5.24)
except `is_encoder_decoder`, which chooses an architecture; tests/test_interop.py checks that a
newer transformers adds no key this list does not decide. The second group is the same
bookkeeping as transformers 4 wrote it into config.json (its PretrainedConfig held the generation
settings too): each chooses output formats, storage, initialisation or how `generate` picks
tokens, never the logits. A key a family's math depends on (`tie_word_embeddings`, `pad_token_id`,
which decides the padding row) is not here: its mapping file maps it, fixes it, or lists it as
harmless for that family.

Keys that start with `_` (`_name_or_path`, `_attn_implementation_autoset`) are transformers'
private state and are harmless too.
"""

from __future__ import annotations

HARMLESS_KEYS: frozenset[str] = frozenset({
    # transformers 5.24: PretrainedConfig().to_dict(), less is_encoder_decoder
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "_name_or_path",
    "model_type", "output_attentions",
    # transformers 4's spellings of the same bookkeeping, and its generation settings
    "torch_dtype", "use_cache", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "initializer_range", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "forced_bos_token_id", "forced_eos_token_id", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
    "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "gradient_checkpointing",
    # initialisation and loading, in any family: how fresh weights are drawn (OPTConfig's
    # init_std, T5's initializer_factor), where custom code lives, how weights are sharded
    "init_std", "initializer_factor", "auto_map", "custom_pipelines", "base_model_tp_plan",
    "base_model_pp_plan", "base_model_ep_plan", "attn_implementation",
})

# Keys of PretrainedConfig().to_dict() deliberately left out above, because they change the math.
NOT_HARMLESS_BASE_KEYS: frozenset[str] = frozenset({"is_encoder_decoder"})


def harmless(key: str) -> bool:
    """Whether a top-level config key never changes what the model computes."""
    return key in HARMLESS_KEYS or key.startswith("_")
