"""`cardc docs`: the site of the shipped cards, built by the real command and read as a reader
would, in a real headless Chromium (Debian's chromium, driven by playwright) from file://.

Checked: every card is reachable from the index, every link and anchor is alive, every page
loads with no console error and fetches nothing but its own files, the MathML is laid out
(every <math> has a non-empty box), hovering a symbol shows its shape, a call navigates to the
called card, and the card's lines link to the generated lines they became and back. The
search index holds every card and every declared name; typing into the search box lists a card
by a word of its prose and by a declared name however it is spelled (`theta` for θ), with a
link to the name's anchor; every page's sidebar lists every card and marks its own; the site
is dark where the system is and light where it is not; the same cards give the same bytes. A
screenshot of the paper's Algorithm 4 page is kept in test-artifacts/ (or $CARDC_ARTIFACTS)
for a person to look at.

Chromium and playwright are installed by .ci/run; where they are missing the browser tests
skip, except under CARDC_REQUIRE_TOOLS=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

from cardc import syntax as s
from cardc.app.inputs import library_folders, require_cards
from cardc.checker import check
from cardc.docs.catalog import catalog
from cardc.docs.search import GLOBAL as SEARCH_GLOBAL
from cardc.docs.search import search_index
from cardc.library import load
from cardc.runtime.manifest import MANIFEST
from cardc.spelling import display

ROOT = Path(__file__).resolve().parent.parent
ALGORITHM_4 = "paper-attention.Attention.html"


def _docs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cardc", "docs", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    run = _docs("--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "card pages" in run.stdout
    return out


class _Anchors(HTMLParser):
    """The ids and hrefs of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)
            if key in ("href", "src") and value is not None:
                self.hrefs.append(value)


def _anchors(path: Path) -> _Anchors:
    parser = _Anchors()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def _reachable(site: Path) -> set[str]:
    """The site's files a reader reaches from index.html by following links."""
    seen, todo = set(), ["index.html"]
    while todo:
        name = todo.pop()
        if name in seen or not name.endswith(".html"):
            seen.add(name)
            continue
        seen.add(name)
        for href in _anchors(site / name).hrefs:
            target, _ = urldefrag(href)
            if target and target not in seen:
                todo.append(unquote(target))
    return seen


def test_every_card_is_reachable_and_every_link_alive(site):
    pages = {p.name for p in site.iterdir() if p.name != MANIFEST}  # the record is no page
    assert ALGORITHM_4 in pages and "cards-gpt2.GPT2.html" in pages
    assert _reachable(site) >= pages
    anchors = {name: _anchors(site / name) for name in pages if name.endswith(".html")}
    for name, page in anchors.items():
        for href in page.hrefs:
            assert "://" not in href and not href.startswith("//"), (name, href)
            target, fragment = urldefrag(href)
            target = unquote(target) or name
            assert target in pages, f"{name}: {href} leads nowhere"
            if fragment:
                assert unquote(fragment) in anchors[target].ids, f"{name}: {href} has no anchor"


def test_every_card_of_the_library_has_a_page(site):
    index = (site / "index.html").read_text(encoding="utf-8")
    for card in ("GPT2", "Llama", "Gemma2", "Attention", "DTraining", "LMTraining", "RMSNorm"):
        assert f">{card}</a>" in index
    assert {"cards", "cards/nn", "cards/paper", "cards/recipes"} <= set(
        line.strip()[4:-5] for line in index.splitlines() if line.strip().startswith("<h2>"))


def test_card_lines_link_to_generated_lines_and_back(site):
    page = (site / "cards-gpt2.GPT2.html").read_text(encoding="utf-8")
    ids = _anchors(site / "cards-gpt2.GPT2.html").ids
    # step 1 of GPT2 (line 14) became `E = self.W_e[x] + self.W_p[...]`
    row = next(line for line in page.splitlines() if "[gpt2.card:14]" in line)
    py = row.split('id="', 1)[1].split('"', 1)[0]
    assert py in ids and f'href="#{py}"' in page
    assert '<a href="#L14">[gpt2.card:14]</a>' in page
    assert 'href="nn-attention.CausalSelfAttention.html#L24">[attention.card:24]' in page


def test_presets_calls_and_diffs(site):
    page = (site / "cards-gpt2.GPT2.html").read_text(encoding="utf-8")
    assert "124,439,808" in page  # GPT-2 small's parameters
    assert "247,064,064 + 36,864·T" in page  # forward FLOPs per token
    assert 'href="cards-gpt2.GPT2Block.html">GPT2Block</a>' in page
    # diffs against the cards most like it (which ones changes as cards are added)
    related = re.findall(r'GPT2 → <a href="cards-[\w.]+\.html">(\w+)</a>', page)
    assert 1 <= len(related) <= 3 and "GPT2" not in related, related
    block = (site / "cards-gpt2.GPT2Block.html").read_text(encoding="utf-8")
    assert 'Called by' in block and 'href="cards-gpt2.GPT2.html">GPT2</a>' in block
    tex = (site / ALGORITHM_4.replace(".html", ".tex")).read_text(encoding="ascii")
    assert r"\begin{document}" in tex and r"\SetAlgoRefName{4}" in tex


def test_the_index_lists_the_papers_algorithms_in_the_papers_order(site):
    """Algorithm 1 to 15 by number (not by file name), then the folder's unnumbered cards."""
    index = (site / "index.html").read_text(encoding="utf-8")
    pages = list(dict.fromkeys(re.findall(r'href="(paper-[^"]+)"', index)))
    assert pages[:4] == ["paper-token_embedding.TokenEmbedding.html",
                         "paper-positional_embedding.PositionalEmbedding.html",
                         "paper-single_query_attention.BasicSingleQueryAttention.html",
                         "paper-attention.Attention.html"]
    assert pages.index("paper-etransformer.ETransformer.html") < \
        pages.index("paper-dtransformer.DTransformer.html") < \
        pages.index("paper-edinference.EDInference.html") < \
        pages.index("paper-edinference_guarded.EDInferenceGuarded.html")


def test_each_page_shows_its_cards_source_highlighted(site):
    """The card's own lines as its file holds them, highlighted by cardc's Pygments lexer
    (the next card's lines not among them)."""
    page = (site / "cards-gpt2.GPT2.html").read_text(encoding="utf-8")
    source = page[page.index('<div class="card-source">'):]
    source = source[:source.index("</div>")]
    assert '<span class="k">Algorithm</span>' in source
    assert '<span class="nf">GPT2Block</span>' in source
    assert "tied unembedding" in source and "pre-LN transformer block" not in source


def test_a_card_that_does_not_check_gets_a_page_saying_so(tmp_path):
    (tmp_path / "bad.card").write_text(
        "Algorithm: Y ← Bad(X)\nInput: X ∈ ℝ^{D}\nOutput: Y ∈ ℝ^{D}\n1 return Y = X + Q\n",
        encoding="utf-8")
    run = _docs("bad.card", "--out", "site", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "1 that do not check" in run.stdout
    page = (tmp_path / "site" / "bad.Bad.html").read_text(encoding="utf-8")
    assert "does not check" in page and "Q" in page


def test_a_strangers_card_and_the_library_it_calls(tmp_path):
    """A card outside the repository gets its page, and so do the library cards it calls,
    under the library's own heading."""
    (tmp_path / "tiny.card").write_text(
        "Algorithm: Y ← TinyNorm(X | γ)\nInput: X ∈ ℝ^{T×D}\nOutput: Y ∈ ℝ^{T×D}\n"
        "Hyperparameters: D ∈ ℕ\nParameters: γ ∈ ℝ^{D} = 1\n"
        "1 return Y = X + RMSNorm(X | γ, ε = 1e-6)\n", encoding="utf-8")
    run = _docs("tiny.card", "--out", "site", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert f"<h2>{tmp_path.name}</h2>" in index and "<h2>library/nn</h2>" in index
    page = (tmp_path / "site" / "tiny.TinyNorm.html").read_text(encoding="utf-8")
    assert 'href="nn-rms_norm.RMSNorm.html"' in page


def test_a_folder_of_other_files_is_refused_and_a_site_replaced_whole(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.docx").write_text("mine", encoding="utf-8")
    card = str(ROOT / "cards" / "nn" / "layer_norm.card")
    run = _docs(card, "--out", "notes", cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "not a cardc docs site" in run.stderr
    assert (tmp_path / "notes" / "thesis.docx").read_text(encoding="utf-8") == "mine"
    assert _docs(str(ROOT / "cards" / "gpt2.card"), "--out", "site", cwd=tmp_path).returncode == 0
    assert (tmp_path / "site" / "cards-gpt2.GPT2.html").exists()
    assert _docs(card, "--out", "site", cwd=tmp_path).returncode == 0
    assert not (tmp_path / "site" / "cards-gpt2.GPT2.html").exists()  # nothing of the last run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "site"]


def test_a_card_that_does_not_parse_stops_the_site(tmp_path):
    (tmp_path / "broken.card").write_text("Algorithm: Y ← (\n", encoding="utf-8")
    run = _docs("broken.card", "--out", "site", cwd=tmp_path)
    assert run.returncode == 1 and "broken.card:1:" in run.stderr
    assert not (tmp_path / "site").exists()


# ------------------------------------------------------------------ in a real browser


def _open(browser, path: Path):
    """A page at `path`, recording console errors, page errors and every request."""
    return _visit(_tab(browser), path)


def _tab(browser):
    """A new tab that records console errors, page errors and every request."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.on("console", lambda m: m.type in ("error", "warning") and page.problems.append(m.text))
    page.on("pageerror", lambda e: page.problems.append(str(e)))
    page.on("request", lambda r: page.requests.append(r.url))
    return page


def _visit(page, path: Path):
    """`page` gone to `path`, its record of problems and requests that of this visit alone."""
    page.problems, page.requests = [], []
    page.goto(path.as_uri())
    return page


def test_every_page_is_clean_in_chromium(site, browser):
    """Every page loaded in turn in one tab (a new tab per page costs more than its page)."""
    page = _tab(browser)
    try:
        for path in sorted(site.glob("*.html")):
            _visit(page, path)
            assert page.problems == [], f"{path.name}: {page.problems}"
            assert all(url.startswith("file://") for url in page.requests), page.requests
            empty = page.evaluate("""() => [...document.querySelectorAll('math')]
                .filter(m => !m.closest('.tip'))  // the shapes, shown on hover
                .filter(m => { const r = m.getBoundingClientRect();
                               return r.width < 1 || r.height < 1; }).length""")
            assert empty == 0, f"{path.name}: {empty} <math> elements laid out empty"
    finally:
        page.close()


def test_hover_shows_a_shape_and_calls_navigate(site, browser, tmp_path):
    page = _open(browser, site / ALGORITHM_4)
    try:
        symbol = page.locator('#pseudocode .name[title^="X ∈"]').first
        title = symbol.get_attribute("title")
        assert "∈" in title and "ℝ" in title
        number = next(c for c in symbol.get_attribute("class").split() if c[1:].isdigit())
        tip = page.locator(f"#pseudocode .tip.{number}")
        assert not tip.is_visible()
        symbol.hover()
        assert tip.is_visible() and "ℝ" in tip.inner_text()
        box = tip.bounding_box()
        assert box["width"] > 10 and box["height"] > 5
        artifacts = Path(os.environ.get("CARDC_ARTIFACTS", ROOT / "test-artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(artifacts / "algorithm4.png"), full_page=True)
    finally:
        page.close()
    page = _open(browser, site / "paper-mhattention.MHAttention.html")
    try:
        page.locator("#pseudocode a", has_text="Attention").first.click()
        page.wait_for_load_state()
        assert page.url.endswith(ALGORITHM_4), page.url
    finally:
        page.close()


# ------------------------------------------------------------------ search, sidebar, dark mode


def _index_of(site: Path) -> dict:
    """The search index a site's pages load: the JSON that search-index.js assigns."""
    text = (site / "search-index.js").read_text(encoding="utf-8")
    head = f"window.{SEARCH_GLOBAL} = "
    assert text.startswith(head) and text.endswith(";\n")
    return json.loads(text[len(head):-2])


def _names_declared(items: tuple) -> list[str]:
    """Every name a card's block items declare, bundles and families opened: what the index
    must hold, said again here rather than taken from the index builder."""
    out: list[str] = []
    for item in items:
        if isinstance(item, s.Decl):
            out += item.names
        elif isinstance(item, s.Bundle):
            out += [item.name, *_names_declared(item.items)]
        elif isinstance(item, s.Family):
            out += _names_declared(item.items)
        elif isinstance(item, s.Dataset):
            out += item.elems
    return out


def test_the_search_index_holds_every_card_and_every_declared_name():
    paths = [str(p) for p in require_cards([str(ROOT / "cards")])]
    lib, targets = load(paths, root=library_folders(None, paths))
    checker, diags = check(lib)
    pages = catalog(lib, checker, targets, {d.span.file for d in diags.errors})
    index = search_index(pages, lambda alg: alg.note or "")
    assert [p[0] for p in index["pages"]] == [p.href for p in pages]
    names: dict[int, list[tuple[str, str, str]]] = {}
    for n, kind, name, keys, _, anchor in index["entries"]:
        if kind == "card":
            assert pages[n].label == name and name in keys
        elif kind != "prose":
            assert kind in ("Input", "Output", "Hyperparameters", "Parameters"), kind
            assert name in keys and anchor.startswith("d-")
            names.setdefault(n, []).append((kind, name, anchor))
    assert sorted(n for n, kind, *_ in index["entries"] if kind == "card") == \
        list(range(len(pages)))
    for n, page in enumerate(pages):
        wanted = [(b.kind, display(name)) for b in page.alg.blocks
                  for name in _names_declared(b.items)]
        assert [(kind, name) for kind, name, _ in names.get(n, [])] == wanted, page.label
        anchors = [a for *_, a in names.get(n, [])]
        assert len(set(anchors)) == len(anchors), page.label  # one id, one name
    gpt2 = next(n for n, p in enumerate(pages) if p.href == "cards-gpt2.GPT2.html")
    assert ("Parameters", "θ", "d-theta") in names[gpt2]
    assert ("Parameters", "W_e", "d-W_e") in names[gpt2]
    theta = next(e for e in index["entries"] if e[0] == gpt2 and e[2] == "θ")
    assert "theta" in theta[3]  # its ASCII spelling
    assert index["greek"]["theta"] == "θ" and index["greek"]["gamma"] == "γ"


def test_the_site_is_the_same_bytes_each_time(tmp_path):
    card = str(ROOT / "cards" / "gpt2.card")
    for name in ("one", "two"):
        assert _docs(card, "--out", name, cwd=tmp_path).returncode == 0
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()}
    two = {p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()}
    assert one.keys() == two.keys() and "search-index.js" in one
    assert [k for k in one if one[k] != two[k]] == []


def test_every_page_has_the_sidebar_with_itself_marked(site):
    pages = sorted(p.name for p in site.glob("*.html"))
    cards = {name for name in pages if name != "index.html"}
    for name in pages:
        text = (site / name).read_text(encoding="utf-8")
        bar = text[text.index('<nav class="sidebar"'):text.index("</nav>", text.index(
            '<nav class="sidebar"'))]
        hrefs = re.findall(r'<a (?:class="[^"]*" )?href="([^"]+)"', bar)
        assert set(hrefs) == cards | {"index.html"} and len(hrefs) == len(cards) + 1, name
        current = re.findall(r'href="([^"]+)"[^>]*aria-current="page"', bar)
        assert current == [name], (name, current)
        assert 'id="search-box"' in bar and '<script src="search.js" defer>' in text


def _search(page, query: str) -> list[dict]:
    """The results after typing `query` into the search box, key by key: each result's
    match, card, name and href."""
    box = page.locator("#search-box")
    box.fill("")
    box.press_sequentially(query)
    page.wait_for_function("() => !document.querySelector('.search-panel').hidden")
    return page.evaluate("""() => [...document.querySelectorAll('#search-results li')].map(li => ({
        match: li.dataset.match, card: li.querySelector('.card').textContent,
        name: (li.querySelector('.name') || {}).textContent || '',
        href: li.querySelector('a').getAttribute('href')}))""")


def test_search_finds_cards_by_their_prose(site, browser):
    page = _open(browser, site / ALGORITHM_4)
    try:
        # BERT's line: "…post-LN blocks and a tanh pooler…"
        hits = _search(page, "pooler")
        assert {"href": "cards-bert.BERT.html", "match": "prose", "card": "BERT",
                "name": ""} in hits, hits
        # a step's note: GPT2's `return P = E W_e^⊺ ▷ tied unembedding`
        hits = _search(page, "tied unembedding")
        assert any(h["href"].startswith("cards-gpt2.GPT2.html") for h in hits), hits
        assert page.locator(".search-status").inner_text().endswith("results.")
        assert _search(page, "zzqx nowhere") == []
        assert "Nothing matches" in page.locator(".search-status").inner_text()
        assert page.problems == []
    finally:
        page.close()


def test_search_finds_declared_names_and_links_to_their_anchors(site, browser):
    page = _open(browser, site / "index.html")
    try:
        gpt2 = "cards-gpt2.GPT2.html"
        for query, name, href in (("W_e", "W_e", f"{gpt2}#d-W_e"),
                                  ("theta", "θ", f"{gpt2}#d-theta"),
                                  ("gamma_f", "γ_f", f"{gpt2}#d-gamma_f"),
                                  ("V~", "Ṽ", f"{ALGORITHM_4}#d-V_tilde")):  # read as a card
            hits = _search(page, query)
            assert hits and hits[0]["match"] == "exact", (query, hits[:3])
            exact = [h for h in hits if h["match"] == "exact"]
            assert all(h["name"] in (name, "") for h in exact), (query, exact)
            assert all(h["name"].lower() == name.lower() for h in hits
                       if h["match"] == "case"), (query, hits)
            assert any(h["href"] == href and h["name"] == name for h in exact), (query, exact)
            for h in hits:  # every anchor a result names is on its page
                target, fragment = urldefrag(h["href"])
                assert (site / target).exists(), h
                if fragment:
                    assert fragment in _anchors(site / target).ids, h
        ranks = [h["match"] for h in _search(page, "Attention")]
        assert ranks == sorted(ranks, key=["exact", "case", "prefix", "inside", "prose"].index)
        assert ranks[0] == "exact" and "prefix" in ranks and "prose" in ranks
        _search(page, "W_e")
        page.locator("#search-results a[href='cards-gpt2.GPT2.html#d-W_e']").click()
        page.wait_for_load_state()
        assert page.url.endswith("cards-gpt2.GPT2.html#d-W_e")
        target = page.evaluate("() => document.querySelector(':target').id")
        assert target == "d-W_e" and page.locator("#d-W_e").is_visible()
        assert _search(page, "theta")[0]["href"] == f"{gpt2}#d-theta"  # this page's first
        hits = _search(page, "GPT2Block")  # Enter follows the first result
        assert hits[0]["href"] == "cards-gpt2.GPT2Block.html"
        page.locator("#search-box").press("Enter")
        page.wait_for_url("**/cards-gpt2.GPT2Block.html")
        assert page.problems == []
    finally:
        page.close()


def test_the_sidebar_shows_the_current_card(site, browser):
    page = _open(browser, site / "recipes-lm_training.LMTraining.html")
    try:
        current = page.locator(".sidebar a.current")
        assert current.count() == 1 and current.get_attribute("aria-current") == "page"
        assert current.get_attribute("href") == "recipes-lm_training.LMTraining.html"
        assert current.is_visible() and current.evaluate(
            "a => { const t = a.closest('.toc').getBoundingClientRect(), r = "
            "a.getBoundingClientRect(); return r.top >= t.top && r.bottom <= t.bottom; }")
        other = page.locator(".sidebar a[href='cards-gpt2.GPT2.html']")
        style = "e => getComputedStyle(e).backgroundColor"
        assert current.evaluate(style) != other.evaluate(style)
        links = page.locator(".sidebar .toc a").count()
        assert links == len(list(site.glob("*.html")))
    finally:
        page.close()


def _luminance(css: str) -> float:
    """The relative luminance (0 black – 1 white) of a computed `rgb(…)` colour."""
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+(?:\.\d+)?", css)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_site_follows_the_systems_colour_scheme(site, browser, scheme):
    page = browser.new_page(viewport={"width": 1500, "height": 1000}, color_scheme=scheme)
    try:
        page.goto((site / "cards-gpt2.GPT2.html").as_uri())
        colours = page.evaluate("""() => {
            const of = (sel, prop) => getComputedStyle(document.querySelector(sel))[prop];
            return {page: of('body', 'backgroundColor'), text: of('body', 'color'),
                    math: of('#pseudocode math', 'color'), code: of('.python', 'backgroundColor'),
                    name: of('.python .n', 'color'), side: of('.sidebar', 'backgroundColor'),
                    link: of('.sidebar a', 'color')}; }""")
        dark = scheme == "dark"
        for back in ("page", "code", "side"):
            assert (_luminance(colours[back]) < 0.2) == dark, (back, colours)
        for fore in ("text", "math", "name", "link"):
            assert (_luminance(colours[fore]) > 0.6) == dark, (fore, colours)
        for fore in ("text", "math", "name"):  # readable: far from the background
            assert abs(_luminance(colours[fore]) - _luminance(colours["page"])) > 0.6, colours
    finally:
        page.close()
