"""Figures with Chinese text: a CJK fallback font, and a check that every glyph resolves."""

import warnings

import matplotlib
import matplotlib.pyplot as plt
import pytest

from tfm_course import viz

TEXT = "返回容器中元素的数量。"


@pytest.fixture
def rc():
    with matplotlib.rc_context():
        yield


def test_the_default_font_alone_cannot_draw_chinese(rc):
    plt.rcParams["font.family"] = ["DejaVu Sans"]
    assert set("返回容器元素数量") <= set(viz.missing_glyphs(TEXT))
    assert viz.missing_glyphs("tokens") == []


def test_with_a_cjk_font_every_glyph_resolves_and_latin_keeps_its_font(rc):
    name = viz.use_cjk_font()
    if name is None:
        pytest.skip(f"no CJK font here (pip install {viz.CJK_PACKAGE}; the book's environment has it)")
    family = plt.rcParams["font.family"]
    assert family.index(name) == 1 and family[0] != name  # a fallback after the Latin font
    assert viz.missing_glyphs(TEXT + " tokens") == []
    fig, ax = plt.subplots()
    ax.set_title(TEXT + " tokens")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for a box
        fig.canvas.draw()
    plt.close(fig)
    assert viz.use_cjk_font() == name and plt.rcParams["font.family"].count(name) == 1  # idempotent
