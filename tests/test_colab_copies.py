"""The Colab copies read as plain Markdown, and a chapter imports only what a Colab reader has.

`tools/book/myst_to_markdown.py` turns the MyST of the chapters' prose into plain Markdown; these
tests pin each rewrite, check that no generated notebook keeps a MyST role or directive, and read
every chapter's imports.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
sys.path.insert(0, str(ROOT / "tools" / "book"))
import myst_to_markdown as m2m  # noqa: E402

sys.path.pop(0)
SOURCE = ROOT / "chapters" / "01-attention.md"


def convert(text: str) -> str:
    return m2m.to_markdown(text, SOURCE)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_colab_copy_holds_no_myst(path):
    notebook = json.loads(path.with_suffix(".ipynb").read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            left = m2m.myst_left(text)
            assert not left, f"{path.name}: MyST left in the Colab copy: {left[:3]}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_colab_copy_opens_with_a_link_to_the_book_page(path):
    notebook = json.loads(path.with_suffix(".ipynb").read_text(encoding="utf-8"))
    first = "".join(notebook["cells"][0]["source"])
    assert first.startswith("# ") and f"{m2m.book_url()}chapters/{path.stem}.html" in first
    assert "jupytext" not in notebook["metadata"], "a converted copy must not be paired with (and sync back to) its source"


def test_glued_number_becomes_its_name():
    assert convert("took {glue:text}`rnn_ms:.1f` ms, {glue}`n_max` steps") == "took `rnn_ms` ms, `n_max` steps"


def test_braces_inside_inline_code_are_not_a_role():
    text = "the pattern `\\p{L}` matches letters; `{x}`y is code, and {glue:text}`n` is a role"
    assert convert(text) == "the pattern `\\p{L}` matches letters; `{x}`y is code, and `n` is a role"
    assert m2m.myst_left("code `{doc}`x`` here") == []
    assert m2m.myst_left("left {doc}`x` here") == ["{doc}`x`"]


def test_citations_become_author_year():
    assert convert("{footcite:t}`vaswani2017attention` showed") == "Vaswani et al. (2017) showed"
    assert convert("a fact {footcite:p}`vaswani2017attention,bahdanau2015neural`.") == (
        "a fact (Vaswani et al., 2017; Bahdanau et al., 2015).")


def test_two_authors_are_both_named():
    bib = m2m.parse_bibtex("@article{x, author = {Ba, Jimmy and Hinton, Geoffrey}, year = 2016, title={T}}")
    assert m2m.authors_short(bib["x"]) == "Ba and Hinton"


def test_bibtex_accents_become_unicode():
    assert m2m.latex_to_text(r"R{\'e}, Christopher and Kaiser, {\L}ukasz") == "Ré, Christopher and Kaiser, Łukasz"


def test_unknown_citation_key_is_an_error():
    with pytest.raises(ValueError, match="nosuchkey2099"):
        convert("{footcite:p}`nosuchkey2099`")


def test_footbibliography_lists_the_works_cited_in_order():
    cited: list[str] = []
    m2m.to_markdown("{footcite:p}`bahdanau2015neural` then {footcite:p}`vaswani2017attention`", SOURCE, cited)
    refs = m2m.to_markdown("## References\n\n```{footbibliography}\n```", SOURCE, cited).splitlines()
    assert refs[0] == "## References"
    assert refs[2].startswith("- Bahdanau et al. (2015). *Neural Machine Translation")
    assert refs[3].startswith("- Vaswani et al. (2017). *Attention Is All You Need*.")


def test_doc_reference_becomes_a_link_to_the_published_page():
    url = m2m.book_url()
    title = m2m.page_title(ROOT / "chapters" / "02-positional-encoding.md")
    assert convert("see {doc}`02-positional-encoding`") == f"see [{title}]({url}chapters/02-positional-encoding.html)"
    assert convert("the {doc}`notation table <../book/notation>`") == f"the [notation table]({url}book/notation.html)"


def test_admonition_becomes_a_block_quote_and_a_dropdown_a_details_block():
    quote = convert(":::{admonition} What you need\n:class: note\nPython, and $x$.\n:::")
    assert quote == "> **What you need**\n>\n> Python, and $x$."
    warning = convert(":::{warning}\nCareful.\n:::")
    assert warning == "> **Warning**\n>\n> Careful."
    dropdown = convert(":::{admonition} Solution\n:class: dropdown\n```python\nx = 1\n```\n:::")
    assert dropdown.startswith("<details><summary><b>Solution</b>") and "```python\nx = 1\n```" in dropdown
    assert dropdown.endswith("</details>")


def test_a_code_block_inside_an_admonition_is_kept_verbatim():
    text = ":::{admonition} Solution\n:class: dropdown\n```python\nprint('{glue:text}`x`')\n:::\n```\n:::"
    assert "print('{glue:text}`x`')\n:::\n```" in convert(text)


def test_math_block_becomes_dollars_with_the_book_macros_expanded():
    assert convert("```{math}\n\\softmax(x)\n```") == "$$\n\\operatorname{softmax}(x)\n$$"
    assert convert("inline $\\softmax(QK^T)$ stays inline") == "inline $\\operatorname{softmax}(QK^T)$ stays inline"


def test_unsupported_myst_is_an_error_not_a_silent_copy():
    with pytest.raises(ValueError, match="unsupported MyST role"):
        convert("see {numref}`fig-1`")
    with pytest.raises(ValueError, match="unsupported MyST directive"):
        convert("```{figure} x.png\n```")


# --------------------------------------------------------------------------- chapter imports
COLAB_PREINSTALLED = {"torch", "numpy", "matplotlib", "tqdm", "ipywidgets", "pandas", "IPython"}
# preinstalled on Colab, absent from the Colab-like CI run: a chapter imports them only inside
# `try: ... except ImportError:` or in a Colab-only cell (`if "google.colab" in sys.modules:`)
OPTIONAL_REFERENCES = {"transformers", "tokenizers", "huggingface_hub", "safetensors"}


def _imports(tree: ast.AST):
    """(module root, guarded) for every import in ``tree``: guarded by `except ImportError`, or
    inside a Colab-only `if "google.colab" in sys.modules:` block."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        if isinstance(node, ast.If) and "google.colab" in ast.unparse(node.test):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], id(node) in guarded
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0], id(node) in guarded


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_imports_only_what_a_colab_reader_has(path):
    allowed = COLAB_PREINSTALLED | {"tfm_course"} | set(sys.stdlib_module_names)
    for cell in jupytext.read(path).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for root, guarded in _imports(ast.parse(source)):
            if root in OPTIONAL_REFERENCES:
                assert guarded, (f"{path.name}: import {root} only inside `try: ... except ImportError:` "
                                 "or a Colab-only `if \"google.colab\" in sys.modules:` block")
            else:
                assert root in allowed, f"{path.name}: imports {root}, which a Colab reader does not have"
