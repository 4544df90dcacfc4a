"""The README as a newcomer reads it: its tutorial's card checks as the tutorial says, and every
link of its table of contents leads to a heading of the README (or a file of the repository)."""

from __future__ import annotations

import re
from pathlib import Path

from test_interop import cardc

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_tutorial_card_checks_and_counts_its_parameters(tmp_path):
    (card,) = re.findall(r"```card\n(.*?)```", README, flags=re.S)
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "tiny.card").write_text(card, encoding="utf-8")
    r = cardc("check", str(tmp_path / "my" / "tiny.card"))
    assert r.returncode == 0 and "ok: 1 card in 1 file" in r.stdout, r.stderr
    r = cardc("info", str(tmp_path / "my" / "tiny.card"), "--preset", "tiny")
    assert r.returncode == 0 and "parameters: 132,864" in r.stdout, r.stderr
    broken = card.replace("1 X ← W_e[x]", "1 X ← w_e[x]")
    (tmp_path / "my" / "tiny.card").write_text(broken, encoding="utf-8")
    r = cardc("check", str(tmp_path / "my" / "tiny.card"))
    assert r.returncode == 1
    assert "unknown name 'w_e'" in r.stderr and "did you mean 'W_e'?" in r.stderr


def test_every_link_of_the_contents_leads_somewhere():
    anchors = {_slug(h) for h in re.findall(r"^#{2,3} (.+)$", README, flags=re.M)}
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    for link in links:
        if link.startswith("#"):
            assert link[1:] in anchors, f"no heading for {link}"
        elif not link.startswith("http"):
            assert (ROOT / link).exists(), f"no file {link}"


def test_the_inside_a_model_example_runs(tmp_path, monkeypatch, capsys):
    """The section's two snippets, in order, on a run of the first command's card and preset
    (2 updates: its figures are the trained run's, its code is what is under test)."""
    import torch

    import cardc as api

    section = README.split("\n## Inside a model")[1].split("\n## ")[0]
    snippets = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(snippets) == 2
    monkeypatch.chdir(tmp_path)
    api.train(str(ROOT / "cards" / "gpt2.card"), preset="tiny", overrides={"D": 32}, steps=2,
              batch_size=2, block_size=32, eval_every=1, out="runs/tiny", device="cpu")
    capsys.readouterr()
    scope: dict = {}
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102
    assert scope["cache"]["block.3.attn.AttentionHead.S@5"].shape == (1, 4, 27, 27)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["0", "1", "2", "3"]
    assert isinstance(scope["silenced"], torch.Tensor)
