"""The zh_CN edition's gates (tools/book/zh_gates.py, check_zh_edition.py) on typical translator
mistakes, and on the committed catalogs. The gates on the built pages run in CI after the build."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "book"))

import check_zh_edition as built  # noqa: E402
import zh_gates as gates  # noqa: E402

TERMS = gates.glossary()
CATALOGS = sorted(gates.CATALOGS.rglob("*.po"))


# -- T3: markup parity ------------------------------------------------------------------------

EN = "At $n$ = {glue:text}`rnn_n:d` the loop took {glue:text}`ms:.1f` ms {footcite:p}`vaswani2017`; see {doc}`setup` and `softmax`, 3,000 steps."
ZH = "在 $n$ = {glue:text}`rnn_n:d` 时循环用了 {glue:text}`ms:.1f` ms {footcite:p}`vaswani2017`；见 {doc}`setup` 与 `softmax`，3000 步。"


def test_a_faithful_translation_keeps_every_role_span_and_number():
    assert gates.parity_errors(EN, ZH) == []


@pytest.mark.parametrize("wrong, says", [
    (ZH.replace("{glue:text}`ms:.1f` ", ""), "lost {glue:text}ms:.1f"),            # a glued number dropped
    (ZH.replace("ms:.1f", "ms:.2f"), "lost {glue:text}ms:.1f"),                     # its format changed
    (ZH.replace("$n$", "$N$"), "lost $n$"),                                          # the maths retyped
    (ZH.replace("{footcite:p}`vaswani2017`", "（Vaswani 等，2017）"), "lost {footcite:p}vaswani2017"),
    (ZH.replace("`softmax`", "softmax"), "lost `softmax`"),                          # code span lost
    (ZH.replace("3000 步", "三千步"), "lost 3000"),                                    # a number in words
    (ZH.replace("3000 步", "3000 步（约 2 分钟）"), "added 2"),                        # a number added
])
def test_parity_names_what_a_translation_lost_or_added(wrong, says):
    assert any(says in e for e in gates.parity_errors(EN, wrong)), gates.parity_errors(EN, wrong)


def test_a_month_written_in_digits_is_no_new_number():
    assert gates.parity_errors("in August 2024", "于 2024 年 8 月") == []
    assert gates.parity_errors("in August 2024", "于 2023 年 8 月") != []


def test_term_targets_count_but_their_shown_text_does_not():
    en = "{term}`Masks <Mask>` hide keys."
    assert gates.parity_errors(en, "{term}`掩码 <Mask>`（mask）遮住键。") == []
    assert gates.parity_errors(en, "{term}`掩码 <Attention>` 遮住键。") != []


# -- T4: terminology --------------------------------------------------------------------------

def test_a_linked_term_shows_the_glossary_chinese():
    assert gates.term_errors("{term}`注意力 <Attention>`（attention）", TERMS) == []
    errors = gates.term_errors("{term}`关注 <Attention>`（attention）", TERMS)
    assert errors and "注意力" in errors[0]
    assert "not a glossary term" in gates.term_errors("{term}`猫 <Cat>`", TERMS)[0]


def test_a_banned_rendering_is_refused_anywhere():
    banned = next((t, b) for t in TERMS.values() for b in t.get("banned", []))
    errors = gates.term_errors(f"这里用了{banned[1]}。", TERMS)
    assert errors and banned[0]["zh"] in errors[0]


def test_glossary_data_has_what_the_gates_read():
    assert len(TERMS) > 50
    for t in TERMS.values():
        assert t["zh"] and t["zh"] not in t.get("banned", []), t


# -- T5: typography ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "矩阵 $Q$ 的形状是 `(batch, seq, d)`，约 3 ms。",
    "“**屏蔽**”规则让模型看不见后面的词元。",
    "{term}`注意力 <Attention>`（attention）是一种软查找。",
    "用 {glue:text}`n:d` 个样本。",
])
def test_well_set_chinese_passes(text):
    assert gates.typography_errors(text) == [], gates.typography_errors(text)


@pytest.mark.parametrize("text, says", [
    ("矩阵$Q$的形状", "no space"),
    ("约3 ms", "no space"),
    ("这是注意力,它很有用", "ASCII punctuation"),
    ("这是注意力 。", "a space next to full-width"),
    ("的**“屏蔽”**规则", "prints as '*'"),
])
def test_typical_typography_mistakes_are_named(text, says):
    assert any(says in e for e in gates.typography_errors(text)), gates.typography_errors(text)


def test_literal_asterisks_follow_commonmark_flanking():
    assert gates.literal_asterisks("的**“屏蔽”**规则") > 0  # CommonMark prints these asterisks
    assert gates.literal_asterisks("“**屏蔽**”规则") == 0
    assert gates.literal_asterisks("a **bold** word and *one* more") == 0
    assert gates.literal_asterisks("`a * b` and $x * y$") == 0  # inside code and maths: not emphasis


# -- reading catalogs, and the catalogs themselves ---------------------------------------------

def test_read_po_reads_continuations_fuzzy_and_obsolete(tmp_path):
    po = tmp_path / "x.po"
    po.write_text(textwrap.dedent('''\
        msgid ""
        msgstr "Content-Type: text/plain; charset=UTF-8\\n"

        #: a.md:1
        msgid ""
        "two "
        "lines with a \\"quote\\""
        msgstr "两行"

        #, fuzzy
        msgid "changed"
        msgstr "旧的"

        #~ msgid "gone"
        #~ msgstr "没了"
        '''), encoding="utf8")
    entries = gates.read_po(po)
    assert [e.msgid for e in entries] == ['two lines with a "quote"', "changed", "gone"]
    assert entries[0].msgstr == "两行" and entries[1].fuzzy and entries[2].obsolete
    errors = gates.check_catalog(po, True, TERMS)
    assert any("fuzzy" in e for e in errors) and any("obsolete" in e for e in errors)


def test_an_untranslated_entry_fails_only_a_complete_page(tmp_path):
    po = tmp_path / "y.po"
    po.write_text('msgid "Hello, world"\nmsgstr ""\n', encoding="utf8")
    assert gates.check_catalog(po, False, TERMS) == []
    assert "untranslated" in gates.check_catalog(po, True, TERMS)[0]


def test_fresh_names_missing_and_stale_catalogs(tmp_path):
    pots, pos = tmp_path / "pot", tmp_path / "po"
    (pots / "book").mkdir(parents=True)
    (pos / "book").mkdir(parents=True)
    (pots / "book" / "a.pot").write_text('msgid "One"\nmsgstr ""\n\nmsgid "Two"\nmsgstr ""\n', encoding="utf8")
    (pots / "book" / "b.pot").write_text('msgid "New page"\nmsgstr ""\n', encoding="utf8")
    (pos / "book" / "a.po").write_text('msgid "One"\nmsgstr "一"\n\nmsgid "Old"\nmsgstr "旧"\n', encoding="utf8")
    errors = gates.fresh_errors(pots, pos)
    assert any("a.po: 1 msgids missing, 1 stale" in e for e in errors)
    assert any(e.startswith("book/b: no catalog") for e in errors)


def test_every_complete_page_has_a_catalog_and_a_source():
    complete = gates.complete_pages()
    assert "book/zh-readers" in complete
    have = {gates.docname(p) for p in CATALOGS}
    for name in complete:
        assert name in have, f"{name} is listed in complete.txt but has no catalog"
        assert (ROOT / f"{name}.md").exists(), name


@pytest.mark.parametrize("po", CATALOGS, ids=lambda p: gates.docname(p))
def test_the_committed_catalogs_pass_the_gates(po):
    errors = gates.check_catalog(po, gates.docname(po) in gates.complete_pages(), TERMS)
    assert errors == [], "\n".join(errors[:20])


def test_glossary_headwords_stay_english_in_the_chinese_edition():
    po = gates.CATALOGS / "book" / "glossary.po"
    for e in gates.read_po(po):
        if e.msgid in TERMS and e.msgstr:
            assert e.msgstr == e.msgid, f"the headword {e.msgid!r} is a link target: keep it English"


# -- the built pages' gates, on small pages ---------------------------------------------------

PAGE = """<html lang="zh-CN"><body><article class="bd-article">
<p class="lang-switch"><a href="x" hreflang="en">English</a></p>
<p>注意力是一种 <span class="math">\\(QK^\\top\\)</span> 查找。</p>
<div class="cell docutils container"><div class="cell_input docutils container"><pre>x = 1</pre></div>
<div class="cell_output docutils container"><div class="output"><pre>1</pre></div></div></div>
<p>{para}</p>
<ul><li><p>第二项</p></li></ul>
</article></body></html>"""


def _page(tmp_path, para):
    path = tmp_path / "p.html"
    path.write_text(PAGE.format(para=para), encoding="utf8")
    return built.parse(path)


def test_built_page_parser_collects_cells_and_article_paragraphs(tmp_path):
    page = _page(tmp_path, "仍是中文。")
    assert len(page.cells) == 2 and page.cells[0].startswith('<div class="cell_input') and "x = 1" in page.cells[0]
    assert page.paragraphs == ["注意力是一种  查找。", "仍是中文。", "第二项"]


def test_an_english_paragraph_in_a_complete_page_is_found(tmp_path):
    page = _page(tmp_path, "This paragraph was never translated.")
    assert [p for p in page.paragraphs if built.silent_english(p)] == ["This paragraph was never translated."]
    assert not built.silent_english("3.5 × 10")  # numbers and maths alone need no Chinese
    assert not built.silent_english("logits")  # a name, not a sentence


def test_links_to_other_pages_are_their_titles_not_this_pages_prose(tmp_path):
    page = _page(tmp_path, '<a class="reference internal" href="../chapters/02.html">Positional encoding '
                           'from first principles</a>')
    assert page.paragraphs[1] == ""
