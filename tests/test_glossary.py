"""The glossary's data file, the page generated from it, and {term} links at each term's first use."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "book"))
import glossary  # noqa: E402
import terms as T  # noqa: E402

# pages whose every glossary term is linked at its first use; a page joins once it has been linked
# (python tools/book/terms.py --link PAGE) and read over
LINKED_PAGES = ["book/intro.md", "book/setup.md", "book/notation.md",
                *sorted(f"chapters/{p.name}" for p in (ROOT / "chapters").glob("*.md"))]
ALL_PAGES = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("book/*.md"), *ROOT.glob("chapters/*.md")])
ENTRIES = glossary.load()
TERMS = glossary.terms(ENTRIES)


def test_the_page_is_generated_from_the_data():
    assert (ROOT / "book" / "glossary.md").read_text(encoding="utf-8") == glossary.render(ENTRIES), (
        "book/glossary.md is out of date: run python tools/book/glossary.py")


def test_terms_are_defined_once_and_their_renderings_consistent():
    names = [t["en"].lower() for t in TERMS]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    for t in TERMS:
        allowed, banned = set(t.get("allowed", [])), set(t.get("banned", []))
        assert t["zh"] not in banned and not allowed & banned, t
    owner = {}
    for t in TERMS:  # a form shared by two terms would make "first use" ambiguous
        for form in T.forms(t):
            assert owner.setdefault(form, t["en"]) == t["en"], (form, owner[form], t["en"])


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_term_is_linked_at_its_first_use(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    missing = [(text.count("\n", 0, u.start) + 1, u.term) for u in T.first_uses(text, TERMS) if not u.linked]
    assert not missing, f"{page}: first uses not linked (line, term): {missing}; run tools/book/terms.py --link"


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_term_link_names_a_glossary_term(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    known = {t["en"].lower() for t in TERMS}
    for body in re.findall(r"\{term\}`([^`]*)`", text):
        target = body.rsplit("<", 1)[1].rstrip(">") if body.endswith(">") else body
        assert target.strip().lower() in known, f"{page}: {{term}} names no glossary term: {body!r}"


SAMPLE_TERMS = [{"en": "Attention", "zh": "注意力"}, {"en": "Self-attention", "zh": "自注意力"},
                {"en": "Query, key, value", "zh": "查询、键、值"}]
SAMPLE = """---
jupytext: {}
---

# Attention in a heading

```{code-cell} ipython3
attention = 1  # code is not prose
```

Math first: $attention$. Then self-attention, then `attention` in code, then attention itself,
and keys, then attention again.
"""


def test_first_use_skips_code_headings_maths_and_longer_terms():
    uses = {u.term: u for u in T.first_uses(SAMPLE, SAMPLE_TERMS)}
    assert set(uses) == {"Attention", "Self-attention", "Query, key, value"}
    assert SAMPLE[uses["Attention"].start:].startswith("attention itself")
    assert SAMPLE[uses["Query, key, value"].start:uses["Query, key, value"].end] == "keys"
    assert not any(u.linked for u in uses.values())


def test_link_makes_every_first_use_a_role_and_nothing_else():
    linked = T.link(SAMPLE, SAMPLE_TERMS)
    assert all(u.linked for u in T.first_uses(linked, SAMPLE_TERMS))
    assert "{term}`attention <Attention>` itself" in linked and linked.count("{term}") == 3
    assert "attention = 1" in linked and "# Attention in a heading" in linked  # code, heading untouched
    assert T.link(linked, SAMPLE_TERMS) == linked  # linking twice changes nothing
