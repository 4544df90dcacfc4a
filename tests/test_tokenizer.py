"""Tokenizers: bytes by default, a byte-level BPE that `cardc train --tokenizer bpe:N` trains,
and a Hugging Face checkpoint's own tokenizer through `cardc import` and `cardc export`.

No network: the BPEs are trained here on text written here, and the Hugging Face model is a
tiny GPT2LMHeadModel with random weights saved beside a PreTrainedTokenizerFast.
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardc.cli import main
from cardc.runtime.checkpoint import read_checkpoint
from cardc.runtime.data import corpus_splits, decode, encode, split, text_splits
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.tokenizer import (
    TOKENIZER_FILE,
    ByteTokenizer,
    from_file,
    hf_tokenizer,
    parse_spec,
    train_bpe,
)

try:
    import transformers
except ImportError:  # the tests of a Hugging Face checkpoint need it; the rest do not
    transformers = None

ROOT = Path(__file__).resolve().parent.parent
CARD = "cards/gpt2.card"
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]
SUBJECTS = ["the cat", "the dog", "a bird", "my friend", "the old man", "a small child"]
VERBS = ["sat on", "looked at", "walked past", "jumped over", "slept near"]
OBJECTS = ["the mat", "the log", "a tree", "the river", "the house", "a garden"]


def story(lines: int = 2000, seed: int = 0) -> str:
    """Sentences of a few words: a model of 20k parameters learns them in 200 updates (its
    gradient clipped to a norm of 1, as the recipe's presets say)."""
    r = random.Random(seed)
    return "".join(f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)}.\n"
                   for _ in range(lines))


WORDS = set(" ".join(SUBJECTS + VERBS + OBJECTS).split())


def cardc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, encoding="utf-8", timeout=300)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@functools.cache
def bpe():
    return train_bpe(story(), 300)


# ------------------------------------------------------------------ the tokenizers themselves


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_encode_then_decode_is_the_identity(text):
    for tok in (ByteTokenizer(), bpe()):
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text


def test_bytes_are_the_token_ids_they_always_were():
    tok = ByteTokenizer()
    text = "héllo, 世界\n"
    assert tok.encode(text) == encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == decode(encode(text))
    data = story(50).encode()
    for a, b in zip(corpus_splits(data, tok), split(data), strict=True):
        assert torch.equal(a, b) and a.dtype == torch.uint8


def test_bpe_training_is_deterministic_and_holds_out_the_validation_text():
    text = story()
    assert train_bpe(text, 300).text == train_bpe(text, 300).text
    assert bpe().vocab_size == 300
    train_text, val_text = text_splits(text.encode())
    assert train_text + val_text == text
    train_ids, val_ids = corpus_splits(text.encode(), bpe())
    assert bpe().decode(train_ids.tolist()) == train_text
    assert bpe().decode(val_ids.tolist()) == val_text
    assert len(train_ids) < 0.6 * len(train_text)  # pieces of words, not bytes


def test_corpus_encoding_in_chunks_equals_encoding_the_whole(monkeypatch):
    import cardc.runtime.tokenizer as tokenizer

    text = story(300) + "  indented\n\n\nblank lines\n" + story(300, seed=1)
    whole = bpe().encode(text)
    monkeypatch.setattr(tokenizer, "CHUNK", 97)
    assert bpe().corpus(text).tolist() == whole


def test_a_split_multibyte_character_stays_whole():
    data = ("a" * 8 + "é" * 1).encode()  # 10 bytes: the cut falls inside é
    assert text_splits(data) == ("a" * 8, "é")


@pytest.mark.parametrize("spec, n", [("bytes", None), ("bpe:257", 257), ("bpe:50257", 50257)])
def test_specs(spec, n):
    assert parse_spec(spec) == n


@pytest.mark.parametrize("spec", ["foo", "bpe", "bpe:", "bpe:x", "bpe:10", "bpe:256",
                                  "bpe:-300", "bpe:99999999", "BPE:300"])
def test_bad_specs_are_refused(spec):
    with pytest.raises(ValueError, match=r"--tokenizer"):
        parse_spec(spec)


@pytest.mark.parametrize("content, message", [
    (b"{not json", "is not a valid tokenizer file"),
    (b'{"model": {"type": "BPE"}}', "is not a valid tokenizer file"),
    (b"\xff\xfe", "is not a valid tokenizer file"),
    (b"", "is not a valid tokenizer file"),
])
def test_a_corrupt_tokenizer_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / TOKENIZER_FILE
    path.write_bytes(content)
    with pytest.raises(RuntimeInputError) as err:
        from_file(path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ train and sample


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bpe")
    (folder / "story.txt").write_text(story(), encoding="utf-8")
    out = folder / "run"
    r = cardc("train", CARD, "--preset", "tiny", *SMALL, "--steps", "200", "--batch-size", "8",
              "--block-size", "32", "--eval-every", "200", "--lr", "0.01",
              "--data", str(folder / "story.txt"), "--tokenizer", "bpe:300", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "byte-level BPE of 300 tokens" in r.stdout and "V = 300" in r.stdout
    return out


def test_train_keeps_the_tokenizer_and_sizes_the_vocabulary_by_it(bpe_run):
    assert sorted(p.name for p in bpe_run.iterdir()) == [
        ".cardc-manifest", "loss.png", "metrics.jsonl", "model.safetensors", TOKENIZER_FILE]
    meta, state = read_checkpoint(bpe_run)
    tok = from_file(bpe_run / TOKENIZER_FILE)
    assert meta["hyperparameters"]["V"] == tok.vocab_size == 300
    assert state["W_e"].shape[0] == 300
    assert meta["tokenizer"]["kind"] == "bpe" and meta["tokenizer"]["vocab_size"] == 300
    assert tok.text == train_bpe(text_splits(story().encode())[0], 300).text  # its training split


def words_of(text: str, prompt: str) -> list[str]:
    assert text.startswith(prompt), text
    assert "\ufffd" not in text and text.isascii()
    return text[len(prompt):].replace(".", " ").split()


@pytest.mark.parametrize("flags", [[], ["--top-k", "3"]])
def test_sample_reads_and_writes_words(bpe_run, flags, cli):
    """The recorded card (LMSampling), drawing from every token and from its top_k step's."""
    r = cli("sample", str(bpe_run), "--prompt", "the cat", "--tokens", "24",
            "--temperature", "0", *flags)
    assert r.returncode == 0, r.stderr
    words = words_of(r.stdout.removesuffix("\n"), "the cat")
    assert len(words) >= 4
    assert set(words[:-1]) <= WORDS, words  # the last may be cut short


def test_finetune_reads_text_with_the_runs_tokenizer(bpe_run, tmp_path):
    out = tmp_path / "more"
    r = cardc("train", CARD, "--preset", "tiny", "--finetune", str(bpe_run), "--steps", "2",
              "--batch-size", "2", "--block-size", "16", "--eval-every", "2",
              "--data", str(bpe_run.parent / "story.txt"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / TOKENIZER_FILE).read_bytes() == (bpe_run / TOKENIZER_FILE).read_bytes()
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["val_loss"] < 1.5  # the trained model, on the tokens it was trained on


def test_a_run_whose_tokenizer_was_swapped_is_refused(bpe_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bpe_run, run)
    train_bpe(story(seed=5), 300).save(run)
    code, _, err = run_main(capsys, "sample", str(run), "--tokens", "3")
    assert code == 1 and err.startswith("cardc: error: ") and err.count("\n") == 1
    assert "mixes two runs" in err
    (run / TOKENIZER_FILE).unlink()
    code, _, err = run_main(capsys, "sample", str(run), "--tokens", "3")
    assert code == 1 and f"has no {TOKENIZER_FILE}" in err


@pytest.mark.parametrize("args, code, message", [
    (["--tokenizer", "bpe:x"], 2, "N must be a whole number"),
    (["--tokenizer", "bpe:10"], 2, "N must be between 257"),
    (["--tokenizer", "foo"], 2, "expected 'bytes' or 'bpe:N'"),
    (["--tokenizer", "bpe:300", "--finetune", "nowhere"], 2, "a fine-tuned model reads text with"),
    (["--tokenizer", "bpe:300", "--set", "V=512"], 2, "--set V and --tokenizer"),
])
def test_bad_tokenizer_flags_are_one_line(args, code, message, tmp_path, capsys):
    got, out, err = run_main(capsys, "train", CARD, "--preset", "tiny", "--steps", "1",
                             "--data", str(ROOT / "README.md"), "--out", str(tmp_path / "r"),
                             *args)
    assert got == code, err
    assert err.startswith("cardc: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ a Hugging Face checkpoint

needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers")
PROMPT = "the old man "


def hf_tokenizer_fast():
    """A byte-level BPE with GPT-2's end-of-text token, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([story()], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "gpt2-tokenized"
    fast = hf_tokenizer_fast()
    config = transformers.GPT2Config(vocab_size=len(fast), n_positions=64, n_embd=48, n_layer=2,
                                     n_head=4, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # strong positions: a random model otherwise repeats one token
        model.transformer.wpe.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "imported"
    r = cardc("import", CARD, "--from", str(hf_dir), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"and {out / TOKENIZER_FILE}" in r.stdout
    return out


def hf_greedy(model, fast, prompt: str, tokens: int) -> list[int]:
    ids = torch.tensor([fast(prompt)["input_ids"]])
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                          do_sample=False, pad_token_id=0)[0].tolist()


@needs_transformers
def test_import_copies_the_tokenizer(hf_dir, imported):
    meta, _ = read_checkpoint(imported)
    assert meta["tokenizer"]["kind"] == "bpe"
    assert meta["tokenizer"]["special"] == {"eos_token": "<|endoftext|>"}
    ours, theirs = from_file(imported / TOKENIZER_FILE), hf_tokenizer_fast()
    text = story(20) + "<|endoftext|>é"
    assert ours.encode(text) == theirs(text)["input_ids"]


@needs_transformers
def test_imported_greedy_sample_is_transformers_generate(hf_dir, imported, capsys):
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    fast = transformers.AutoTokenizer.from_pretrained(hf_dir)
    want = hf_greedy(model, fast, PROMPT, 16)
    prompt_ids = fast(PROMPT)["input_ids"]
    code, out, err = run_main(capsys, "sample", str(imported), "--prompt",
                              " ".join(map(str, prompt_ids)), "--temperature", "0",
                              "--tokens", "16")
    assert code == 0, err
    assert [int(w) for w in out.split()] == want[len(prompt_ids):]  # the same token IDs
    code, out, err = run_main(capsys, "sample", str(imported), "--prompt", PROMPT,
                              "--temperature", "0", "--tokens", "16")
    assert code == 0, err
    assert out.removesuffix("\n") == fast.decode(want)  # decoded with the same tokenizer
    code, out, err = run_main(capsys, "sample", str(imported), "--prompt", PROMPT,
                              "--temperature", "0", "--tokens", "16", "--top-k", "1")
    assert code == 0, err
    assert out.removesuffix("\n") == fast.decode(want)


@needs_transformers
def test_export_is_a_from_pretrained_folder(hf_dir, imported, tmp_path, capsys):
    dest = tmp_path / "exported"
    code, _, err = run_main(capsys, "export", str(imported), "--to", str(dest))
    assert code == 0, err
    assert sorted(p.name for p in dest.iterdir()) == [
        ".cardc-manifest", "config.json", "model.safetensors", TOKENIZER_FILE, "tokenizer_config.json"]
    fast = transformers.AutoTokenizer.from_pretrained(dest)
    assert isinstance(fast, transformers.PreTrainedTokenizerFast)
    assert fast.eos_token == "<|endoftext|>"
    back = transformers.AutoModelForCausalLM.from_pretrained(dest).eval()
    source = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    original = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert fast.decode(hf_greedy(back, fast, PROMPT, 12)) == \
        original.decode(hf_greedy(source, original, PROMPT, 12))


@needs_transformers
def test_a_trained_run_exports_its_tokenizer(bpe_run, tmp_path, capsys):
    dest = tmp_path / "hf"
    code, _, err = run_main(capsys, "export", str(bpe_run), "--to", str(dest))
    assert code == 0, err
    fast = transformers.AutoTokenizer.from_pretrained(dest)
    model = transformers.AutoModelForCausalLM.from_pretrained(dest).eval()
    text = fast.decode(hf_greedy(model, fast, "the cat", 12))
    assert set(words_of(text, "the cat")[:-1]) <= WORDS
    r = cardc("sample", str(bpe_run), "--prompt", "the cat", "--tokens", "12",
              "--temperature", "0")
    assert r.stdout.removesuffix("\n") == text  # the same model and tokenizer as cardc's


@needs_transformers
def test_gpt2_vocab_and_merges_make_the_same_tokenizer(hf_dir, tmp_path):
    """A folder saved by the slow GPT2Tokenizer has only vocab.json and merges.txt."""
    fast = hf_tokenizer_fast()
    folder = tmp_path / "slow"
    folder.mkdir()
    fast.backend_tokenizer.model.save(str(folder))
    (folder / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    tok = hf_tokenizer(folder)
    assert tok is not None and tok.special == {"eos_token": "<|endoftext|>"}
    text = story(20) + "<|endoftext|> naïve"
    assert tok.encode(text) == fast(text)["input_ids"]
    assert tok.decode(tok.encode(text)) == text


@needs_transformers
@pytest.mark.parametrize("name, content, message", [
    (TOKENIZER_FILE, "{", "tokenizer.json' is not a valid tokenizer file"),
    ("vocab.json", "[1, 2]", "vocab.json' is not a JSON object"),
    ("vocab.json", '{"a": "b"}', "vocab.json' is not a vocabulary"),
    ("merges.txt", "#version: 0.2\na b c\n", "merges.txt' line 2 is not a merge"),
    ("merges.txt", "#version: 0.2\nzz qq\n", "merges.txt' does not fit"),
    ("tokenizer_config.json", "{", "tokenizer_config.json' is not valid JSON"),
])
def test_a_corrupt_tokenizer_in_the_source_is_named(hf_dir, tmp_path, capsys, name, content,
                                                    message):
    import shutil

    source = tmp_path / "source"
    shutil.copytree(hf_dir, source)
    if name in ("vocab.json", "merges.txt"):  # the slow tokenizer's files alone
        (source / TOKENIZER_FILE).unlink()
        hf_tokenizer_fast().backend_tokenizer.model.save(str(source))
    (source / name).write_text(content)
    code, out, err = run_main(capsys, "import", CARD, "--from", str(source), "--out",
                              str(tmp_path / "run"))
    assert code == 1 and err.startswith("cardc: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "run").exists()
