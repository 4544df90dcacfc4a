"""Checkpoints between Hugging Face `transformers` and cardc, driven by one mapping file per card.

A model card with a Hugging Face counterpart keeps `<card stem>.hf.json` beside it
(`cards/gpt2.card` → `cards/gpt2.hf.json`); a new family adds such a file, not code. The file is
JSON rather than TOML because cardc supports Python 3.10, whose standard library has no tomllib,
and because the files it describes (`config.json`, the safetensors index) are JSON too. Its keys:

- `card`: the model card of the file it maps (`GPT2`); `architecture` and `model_type`: what
  export writes to config.json (`GPT2LMHeadModel`, `gpt2`) and import expects there.
- `variants`: card name → the mapping of another card of the same card file (`LlamaUntied`
  beside `Llama`, `BERTForMaskedLM` beside `BERT`), written as a JSON merge patch (RFC 7396) of
  the top level: objects merge key by key, a value replaces what it names, null removes it, a
  list replaces the whole list. Import picks the first mapping in file order whose
  `fixed_config` config.json keeps, among those whose `architecture` it names (its
  `architectures`; among all if it names none of theirs); `--name` picks one by its card.
  Export picks the mapping of the checkpoint's card.
- `hyperparameters`: card hyperparameter → how config.json gives it, one of
  - a config key (`a.b`: key b of the object a), or `{"key": K, "default": EXPR, "same": [K2, …]}`:
    EXPR applies when K is absent or null (`n_inner: null` means `4 * n_embd`); the keys in
    `same` must hold the same value (BART's encoder_layers and decoder_layers, both the card's
    N): import refuses a config.json where they differ, export writes every one;
  - `{"expr": EXPR}`: computed from config keys (`"d_r": {"expr": "head_dim *
    rope_parameters.partial_rotary_factor"}`). EXPR is numbers, config keys, `+ - * /` (or
    `− · ×`), `//`, parentheses, `min(…)` and `max(…)`, evaluated exactly (a config's 0.4 is
    2/5; see cardc/interop/expr.py). Export inverts it: it writes the one key EXPR reads that no
    other hyperparameter, `fixed_config` or `export_config` writes (`partial_rotary_factor =
    d_r / head_dim`), exactly, so config → hyperparameters → config gives the same numbers back;
    `"solve": K` names that key where several are free; it is written as an int when whole,
    unless `"type": "float"` (a factor of 1.0 stays 1.0). A key to solve for must occur once and
    not under `//`, `min` or `max`; with no free key export writes nothing and checks that EXPR
    gives the value. `"default": EXPR2` applies when a key EXPR reads is absent or null (a
    list of expressions is tried in order, the first whose keys are all present applying:
    `["rope_theta", "10000"]`);
    `"null": n` instead makes the hyperparameter n then, and export writes the solved key as
    null for n (`"P": {"expr": "pad_token_id + 1", "null": 0}`: no pad token is 0, token ID k
    is k + 1). A value that is not a whole number where the card declares ℕ is refused, named;
  - `{"count": K}`: how many entries the object or list K holds, a value the config gives by
    its structure (a classifier's class count: `"K": {"count": "id2label"}`), with an optional
    `"default"` for K absent or null (`"2"`: transformers' two labels). A K that is neither
    an object nor a list is refused, named; `"same": [K2, …]` names keys counted alike
    (`label2id`), refused where their counts differ. An import records the entries of each
    as config.json holds them (the checkpoint's label names), and export writes them back
    where the count is unchanged: config → checkpoint → config keeps them exactly; otherwise
    export writes K with that many entries, numbered from 0 and named `LABEL_0`, `LABEL_1`, …
    (as transformers names labels it was not told), and no K2.
- `constraints`: card hyperparameter → the values the card computes correctly, beyond what
  the card declares: `{"min": EXPR, "max": EXPR, "multiple_of": EXPR, "power_of_two": true,
  "one_of": [n, …]}`, any of them (bounds inclusive, EXPR of the card's hyperparameters).
  ALiBi slopes as a card writes them hold for a power-of-two head count: `"H":
  {"power_of_two": true}`; StableLM 2's partial rotary leaves part of each head unturned:
  `"d_r": {"max": "D / H - 1"}`. Import refuses a config.json outside them, naming its key;
  export refuses such a model. A size any card of the model cannot take (`d − d_r = 0`) is
  refused at import too, by the card's own checks, naming a config key.
- A config key is set in one place: a key a hyperparameter reads and export writes (or one of
  its objects, `rope_parameters` for `rope_parameters.rope_theta`) in `fixed_config` or
  `export_config` too is an error when the mapping is loaded, naming both.
- `fixed_config`: config values the card's computation fixes (`activation_function`,
  `tie_word_embeddings`). Import refuses a config.json that sets another value; export writes
  them. A list names the accepted values; export writes the first (a nested key whose first
  is null is left out: `{"rope_type": null}` is not a config transformers reads). A key `a.b` is key b of the
  object a (`rope_parameters.rope_type`), as in `hyperparameters`. `{"expr": EXPR}` is a value
  derived from other config keys (Llama's `"head_dim": {"expr": "hidden_size /
  num_attention_heads"}`): import refuses another value (absent or null is accepted: transformers
  computes it so), export writes EXPR's value.
  `{"cycle": [A, B, …], "length": EXPR}` is a per-layer list that repeats A, B, … over EXPR
  items (an expression of config keys): Gemma 2's `layer_types` alternates sliding and full
  attention over `num_hidden_layers` layers. Import accepts it absent or null (transformers
  makes that default) and refuses any other list; export writes it.
- `export_config`: further values export writes (no dropout: the card has none); `a.b` keys too.
  Import accepts any value of these keys: they do not change what the weights compute.
- `harmless`: config keys (`a.b` too) that never change what this family computes from its
  weights (GPT-2's `summary_type`, for heads the card does not have), beside the keys that are
  harmless in every family: one shared list (cardc/interop/harmless.py) of the keys that only
  set initialisation, loading, storage or generation (`init_std`, `initializer_range`,
  `auto_map`, `torch_dtype`, `transformers_version`, `architectures`, …), which no mapping
  names and which never block an import. Import refuses a config.json with any
  other key (of an object, any other of its keys) that no hyperparameter reads, `fixed_config`
  fixes or `export_config` writes, naming it: it would otherwise import silently wrong.
- `layers`: how many layers `{i}` runs over, from 0: a hyperparameter (`N`) or an expression
  of them (`N/2`, for a card that stacks its layers in pairs; a count that is not whole is
  refused, named). A layer index in a name (either side) is `{i}`, or an affine `{a·i + b}`
  with whole a, b ≥ 0 (`{2i}`, `{2*i + 1}`; `2i` is `2·i`): Gemma 2's card keeps pairs
  θ^local_ℓ, θ^global_ℓ, so transformers' `model.layers.{2i}.…` is the card's `local.{i}.…` and
  `model.layers.{2i+1}.…` its `global_.{i}.…`. An index that is not of that form, or two names
  that expand to the same tensor, is refused, named.
- `indices`: further indices of tensor names, each with its count, an expression of the card's
  hyperparameters as `layers` is: `{"j": "E"}` makes transformers'
  `model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight` the card's
  `block.{i}.moe.theta.{j}.W_1` for every expert j = 0 … E − 1 of every layer, one line for all
  of them. An index of a name reads one index (`{j}`, `{2j + 1}`), and a tensor and its card
  name read the same further indices; a name that is not an identifier (or is i), an unknown
  hyperparameter, an index that reads another name, or an index in only one of the two names is
  refused, named; import refuses a checkpoint that lacks the last member's tensors before it
  makes every name. An index may add whole multiples of the card's hyperparameters, written
  after it: a model whose first N_d layers are of one kind and the rest of another maps
  `model.layers.{i}` to the card's `dense.{i}` (`"layers": "N_d"`) and `model.layers.{m +
  N_d}` to its `moe.{m}` (`"indices": {"m": "N - N_d"}`), each family counted from 0.
- `tensors`: Hugging Face name → the generated module's parameter name, or
  `{"card": NAME, "transpose": true, "chunk": [k, n], "axis": a}` (a ≥ 0, an axis of the card
  tensor): the Hugging Face tensor is
  the card's transposed (nn.Linear stores (out, in), cards are row-major (in, out)), and/or the
  k-th of n equal slices of it along axis a of the card's layout (separate q/k/v projections of
  a fused W_qkv). `"shape": [1, -1]` instead: the Hugging Face tensor is the card's reshaped
  so (BART's final_logits_bias, a (1, V) buffer, is the card's b_f ∈ ℝ^{V}); its entries
  are whole numbers or expressions of the card's hyperparameters, and with `"transpose": true`
  the card's tensor is transposed first (ViT's patch embedding, a convolution's (D, C, p, p)
  weight, is the card's W_p ∈ ℝ^{C p p×D}: `{"card": "W_p", "transpose": true, "shape": ["D",
  "C", "p", "p"]}`). `{"card": NAME, "row": "{i}"}`: the Hugging Face tensor of layer i is
  row i of the card's tensor, a family the model card declares itself and stacks ("For ℓ ∈
  [N]: γ^1_ℓ ∈ ℝ^{D}" is `gamma1` of shape (N, D)); transposed after the row is taken where
  `"transpose": true`. Import joins the rows in order and refuses a row twice or one missing.
  `{"fused": {"axis": a, "groups": EXPR, "parts": [P1, P2, …]}, "transpose": …}`: one Hugging
  Face tensor holds several card tensors laid out group by group. Along axis a (of the card's
  layout, after any transpose) it is EXPR groups (an expression of the card's hyperparameters;
  default 1), each the parts in order; a part is a card tensor name, or `[NAME, SIZE]` with its
  width in one group (an expression of hyperparameters, checked). A part's width is otherwise its
  card tensor's width over the groups; a card tensor named by several parts is cut into that
  many equal pieces, in order. GPT-NeoX's query_key_value is `{"groups": "H", "parts": [W_q,
  W_k, W_v]}` (per head: q, k, v); Falcon's grouped layout `{"groups": "H_kv", "parts": [W_q,
  W_k, W_v]}` (per key/value group: its query heads, one key head, one value head); Falcon's
  multi-query layout the same with one group. Import splits, export fuses back, bit for bit.
- `tied`: Hugging Face name → the Hugging Face tensor it shares storage with; export omits it,
  import accepts it only if equal.
- `base_prefix`: what the base model's names start with (`transformer.`); checkpoints of the bare
  base model leave it out, so import adds it back. `base_model`: true when `architecture` is
  that bare base model (BertModel), whose checkpoints export writes without the prefix too.
- `ignore`: names (with `{i}`) import skips, such as the causal-mask buffers older GPT-2
  checkpoints carry.

An import records config.json's `bos_token_id` and `eos_token_id` (an ID or a list of them;
harmless, as they change no logits), and export writes them back over what `export_config`
says, so `generate` stops where the source did. Export finds a trained run's mapping file
beside the card the run was trained from (the path it records as `card_path`), else beside a
card of its name under `--library`; `--mapping FILE` names one outright.

Keys `transformers` has renamed are one shared table (cardc/interop/renamed.py): transformers 4
wrote `rope_theta`, `partial_rotary_factor` and `rope_scaling` (null for none) where 5 writes
`rope_parameters.rope_theta`, `rope_parameters.partial_rotary_factor` and `rope_parameters`.
Import reads a config.json of either spelling (one value given both ways, differently, is
refused) and a mapping may name a key either way; export writes the current spelling only, with
no override.

Every file read here is bounded before it is walked (cardc/runtime/jsontext.py): JSON nested
more than 64 levels or holding an integer beyond 2^63 − 1 is refused, naming the file and key;
an expression has at most 200 tokens and literals of at most 30 digits; a layer count is
checked against the tensors the checkpoint holds before any layer's names are made; a sharded
index names each shard by a file name beside it.
"""

from __future__ import annotations

from .config import check_config, config_for, kept_entries, preset_from_config, select_for_config
from .files import HF_CONFIG, HF_INDEX, HF_WEIGHTS, read_hf, write_hf
from .mapping import (
    MAPPING_SUFFIX,
    Entry,
    Hyper,
    Mapping,
    Part,
    load_mapping,
    load_mappings,
    mapping_path,
    merge_patch,
    parse_mapping,
    parse_mappings,
    select_by_name,
)
from .tensors import from_card_state, to_card_state
from .transfer import (
    META_KEY,
    check_sizes,
    checkpoint_mapping,
    export_hf,
    import_checkpoint,
    import_hf,
    write_model_hf,
)

__all__ = [
    "HF_CONFIG", "HF_INDEX", "HF_WEIGHTS", "MAPPING_SUFFIX", "META_KEY", "Entry", "Hyper",
    "Mapping", "Part", "check_config", "check_sizes", "checkpoint_mapping", "config_for",
    "export_hf", "from_card_state", "import_checkpoint", "import_hf", "kept_entries", "load_mapping",
    "load_mappings", "mapping_path", "merge_patch", "parse_mapping", "parse_mappings",
    "preset_from_config", "read_hf", "select_by_name", "select_for_config", "to_card_state",
    "write_hf", "write_model_hf",
]
