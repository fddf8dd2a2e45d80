"""What the zh_CN edition needs from Sphinx beyond its gettext catalogs (../shared/specs/zh-edition.md).

Both editions are built from the same sources and the same execution (the jupyter-cache), by
``python tools/book/editions.py``. This extension, loaded in both, does five things:

1. ``{glue:text}`` inside a translated paragraph: Sphinx parses each msgstr as a fresh document
   that has no notebook renderer, so myst-nb finds no glue data there. The lookup falls back to the
   page's own ``<jupyter_execute>/<page>.glue.json`` (written when the page was read, before the
   translation transform runs).
2. ``_toc.yml`` captions: sphinx-external-toc inserts its toctrees (priority 100) after Sphinx's
   translation transform (20); a transform at 101 translates their captions from the root page's
   catalog.
3. A Chinese banner on every page not listed in ``locales/zh_CN/complete.txt``, saying how many of
   its paragraphs are still English.
4. A language switch on every page of both editions, linking the same page in the other one.
5. Interface strings in mainland Chinese (the theme's own zh_CN catalog uses Taiwanese wording,
   Jupyter Book hard-codes its search text, myst-nb its code-cell toggles).
"""

from __future__ import annotations

import gettext
import json
from pathlib import Path

from docutils import nodes
from sphinx import locale
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

ZH = "zh_CN"
COMPLETE = Path("locales") / ZH / "complete.txt"
UI_ZH = {  # sphinx-book-theme's msgid -> mainland wording
    "Print to PDF": "打印为 PDF",
    "Download this page": "下载本页",
    "Download source file": "下载源文件",
    "Fullscreen mode": "全屏模式",
    "Launch": "运行",
    "Source repositories": "源代码仓库",
    "Open an issue": "提交问题",
    "Contents": "目录",
    "Search": "搜索",
}
SEARCH_ZH = "搜索本书……"
BANNER_ZH = "本页尚未译完：{untranslated} 段（共 {total} 段）尚无中文译文，显示英文原文。"
TOGGLE_TYPES = {"source": "源代码", "outputs": "输出", "output": "输出", "content": "内容"}
SWITCH = {"en": ("中文", ZH), ZH: ("English", "en")}  # the link each edition shows


def is_zh(app: Sphinx) -> bool:
    return (app.config.language or "").replace("-", "_") == ZH


# 1. glue inside translated text ------------------------------------------------------------------

def _patch_glue() -> None:
    from myst_nb.core.variables import RetrievalError, VariableOutput
    from myst_nb.ext.glue import roles

    original = roles.retrieve_glue_data
    if getattr(original, "i18n_book", False):
        return

    def retrieve(document, key):
        try:
            return original(document, key)
        except RetrievalError:
            env = getattr(document.settings, "env", None)
            if env is None:
                raise
            path = Path(env.mystnb_config.output_folder, *env.docname.split("/"))
            path = path.with_name(path.name + ".glue.json")
            data = json.loads(path.read_text("utf8")) if path.exists() else {}
            if key not in data:
                raise
            return VariableOutput(data=data[key]["data"], metadata=data[key].get("metadata", {}),
                                  nb_renderer=None, vtype="glue")

    retrieve.i18n_book = True
    roles.retrieve_glue_data = retrieve


class KeepMathOut(SphinxTransform):
    """Display maths is not prose: keep it out of the catalogs (and untouched by translation)."""

    default_priority = 10  # before Sphinx's translation transform (20)

    def apply(self, **kwargs) -> None:
        for node in self.document.findall(nodes.math_block):
            node["translatable"] = False


# 2. toc captions ---------------------------------------------------------------------------------

class TranslateTocCaptions(SphinxTransform):
    """Translate the captions of the toctrees sphinx-external-toc inserted (priority 100)."""

    default_priority = 101

    def apply(self, **kwargs) -> None:
        if not is_zh(self.app):
            return
        catalog = _catalog(self.app, self.env.docname)
        from sphinx import addnodes
        for toctree in self.document.findall(addnodes.toctree):
            caption = toctree.get("caption")
            if caption:
                toctree["caption"] = catalog.gettext(caption)


def _catalog(app: Sphinx, docname: str) -> gettext.NullTranslations:
    domain = docname_to_domain(docname, app.config.gettext_compact)
    dirs = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    translator, _ = locale.init(dirs, app.config.language, domain)
    return translator


# 3. the banner on pages still partly English -----------------------------------------------------

def complete_pages(srcdir: str | Path) -> set[str]:
    """The docnames listed in locales/zh_CN/complete.txt (one per line, # comments)."""
    path = Path(srcdir, COMPLETE)
    if not path.exists():
        return set()
    lines = (line.split("#", 1)[0].strip() for line in path.read_text("utf8").splitlines())
    return {line for line in lines if line}


def catalog_counts(po_path: Path) -> tuple[int, int]:
    """(untranslated or fuzzy entries, all entries) of one .po file."""
    from babel.messages.pofile import read_po

    with po_path.open("rb") as f:
        catalog = read_po(f)
    messages = [m for m in catalog if m.id]
    return sum(1 for m in messages if not m.string or m.fuzzy), len(messages)


class Banner(SphinxTransform):
    """In the zh_CN edition, a notice at the top of every page that is not complete."""

    default_priority = 102

    def apply(self, **kwargs) -> None:
        if not is_zh(self.app) or self.env.docname in complete_pages(self.app.srcdir):
            return
        po = Path(self.app.srcdir, "locales", ZH, "LC_MESSAGES", self.env.docname + ".po")
        untranslated, total = catalog_counts(po) if po.exists() else (0, 0)
        if not total:
            return
        text = BANNER_ZH.format(untranslated=untranslated, total=total)
        note = nodes.admonition("", nodes.title("", "翻译进度"), nodes.paragraph(text, text),
                                classes=["note", "zh-banner"])
        sections = list(self.document.findall(nodes.section))
        if sections:  # after the page's title
            title = sections[0].next_node(nodes.title)
            title.parent.insert(title.parent.index(title) + 1, note)
        else:
            self.document.insert(0, note)


# 4. the language switch --------------------------------------------------------------------------

def language_switch(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if doctree is None:  # search, genindex: no counterpart needed
        return
    edition = ZH if is_zh(app) else "en"
    label, other = SWITCH[edition]
    root = context["pathto"]("", 1)  # this edition's root, relative to the page
    href = f"{root}{'zh_CN/' if other == ZH else '../'}{pagename}.html"
    hreflang = "zh-CN" if other == ZH else "en"
    context["metatags"] = context.get("metatags", "") + \
        f'\n<link rel="alternate" hreflang="{hreflang}" href="{href}" />'
    link = (f'<p class="lang-switch"><a href="{href}" hreflang="{hreflang}" lang="{hreflang}">'
            f'{label}</a></p>\n')
    context["body"] = link + context.get("body", "")
    if edition == ZH:  # myst-nb fills {type} in the code-cell toggles with an English word
        for english, chinese in TOGGLE_TYPES.items():
            context["body"] = context["body"].replace(f"代码单元{english}<", f"代码单元{chinese}<")


# 5. interface strings ----------------------------------------------------------------------------

class _Mainland(gettext.NullTranslations):
    def __init__(self, base: gettext.NullTranslations | None, table: dict[str, str]) -> None:
        super().__init__()
        self.base, self.table = base, table

    def gettext(self, message: str) -> str:
        if message in self.table:
            return self.table[message]
        return self.base.gettext(message) if self.base is not None else message


def config_inited(app: Sphinx, config) -> None:
    if not is_zh(app):
        return
    options = dict(config.html_theme_options or {})
    options["search_bar_text"] = SEARCH_ZH
    config.html_theme_options = options
    config.nb_code_prompt_show = "显示代码单元{type}"
    config.nb_code_prompt_hide = "隐藏代码单元{type}"


def builder_inited(app: Sphinx) -> None:
    if not is_zh(app):
        return
    key = ("general", "booktheme")
    locale.translators[key] = _Mainland(locale.translators.get(key), UI_ZH)


def setup(app: Sphinx) -> dict:
    _patch_glue()
    app.connect("config-inited", config_inited)
    app.connect("builder-inited", builder_inited)
    app.add_transform(KeepMathOut)
    app.add_transform(TranslateTocCaptions)
    app.add_transform(Banner)
    app.connect("html-page-context", language_switch)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
