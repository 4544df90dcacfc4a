"""Bench worker: Hugging Face transformers' GPT2LMHeadModel / LlamaForCausalLM at the card's
hyperparameters, or for any model card the model its mapping file exports to, with SDPA
attention as the card's code uses (see bench/timing.py)."""

from __future__ import annotations

from typing import Any

import torch
from timing import Built, source_of, worker_main
from torch import nn


def exported(spec: dict[str, Any]) -> Built:
    """Any model card: the model built from the config `cardc export` writes through the card's
    mapping file, holding the weights the card's own model starts from (same seed)."""
    import json
    from pathlib import Path

    from cardc import interop
    from cardc.build import build_model
    ours = build_model(spec["card"], spec["preset"], spec["overrides"], name=spec.get("name"))
    raw = json.loads(Path(spec["mapping"]).read_text(encoding="utf-8"))
    mapping = interop.select_by_name(interop.parse_mappings(raw, spec["mapping"]),
                                     ours.card_meta["name"])
    W_p = getattr(ours, "W_p", None)  # learned positions, as the cardc worker counts them
    return as_transformers(mapping, ours).train(), \
        W_p.numel() if W_p is not None else 0


def as_transformers(mapping, model: nn.Module) -> nn.Module:
    """The card model's weights in `transformers`, exported through its mapping file and loaded
    as the class the exported config names: SDPA attention, or eager where transformers has no
    SDPA path for the architecture (Gemma 2)."""
    import tempfile

    import transformers

    from cardc import interop
    with tempfile.TemporaryDirectory() as folder:
        interop.write_model_hf(mapping, model.state_dict(), model.card_meta["hyperparameters"],
                               folder)
        config = transformers.AutoConfig.from_pretrained(folder)
        auto = getattr(transformers, config.architectures[0])
        try:
            return auto.from_pretrained(folder, attn_implementation="sdpa")
        except ValueError:
            return auto.from_pretrained(folder, attn_implementation="eager")


def build(spec: dict[str, Any]) -> Built:
    if spec.get("card"):
        return exported(spec)
    h = spec["hp"]
    if spec["family"] == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=h["V"], n_positions=h["ctx"], n_embd=h["D"],
                            n_layer=h["N"], n_head=h["H"], n_inner=h["D_f"],
                            activation_function="gelu_new", layer_norm_epsilon=h["eps"],
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                            attn_implementation="sdpa")
        model = GPT2LMHeadModel(config)
        return model, model.transformer.wpe.weight.numel()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=h["V"], hidden_size=h["D"], intermediate_size=h["D_f"],
                         num_hidden_layers=h["N"], num_attention_heads=h["H"],
                         num_key_value_heads=h["H_kv"], max_position_embeddings=h["ctx"],
                         rms_norm_eps=h["eps"], rope_theta=h["theta_base"], hidden_act="silu",
                         attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
                         attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(config), 0


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():  # an image (transformers' name for it)
        return model(pixel_values=x).logits
    if model.config.is_encoder_decoder:
        return model(input_ids=source_of(x), decoder_input_ids=x, use_cache=False).logits
    return model(input_ids=x, use_cache=False).logits


if __name__ == "__main__":
    worker_main("transformers", build, logits_of)
