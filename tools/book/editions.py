"""Build the book's two editions, English and zh_CN, from the same sources and one execution.

    python tools/book/editions.py catalogs   # refresh locales/zh_CN/LC_MESSAGES/**.po from the sources
    python tools/book/editions.py build      # English at _build/html, Chinese at _build/html/zh_CN
    python tools/book/editions.py build --strict   # as CI: warnings are errors (-W -n --keep-going)

``catalogs`` extracts every page's prose with Sphinx's gettext builder (notebooks not executed)
and merges it into the committed catalogs with sphinx-intl (entries whose English changed become
fuzzy, new ones untranslated; lines wrapped at 76 so that diffs stay small). A translator then
edits the .po files; a page translated in full is listed in ``locales/zh_CN/complete.txt``.

``build`` writes ``conf.py`` from ``_config.yml`` (``jupyter-book config sphinx``), builds the
English edition with a fresh execution cache (every chapter executed once, as ``execute_notebooks:
force`` does), then the Chinese edition from that cache: no chapter is executed twice, so both
editions show the same outputs, byte for byte (``tests/test_zh_edition.py`` checks it on the
built pages). ``book/_ext/i18n_book.py`` does what the catalogs cannot (glue in translated text,
the toc captions, the banner, the language switch, interface strings).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
LANG = "zh_CN"
LOCALES = ROOT / "locales"
WRAP = "76"
# Pages written in Chinese in both editions: their catalogs' translations are their own text.
CHINESE_SOURCES = {"book/zh-readers"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "book" / "_ext"), env.get("PYTHONPATH")]))
    return env


def _run(*args: str) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, cwd=ROOT, env=_env(), check=True)


def write_conf() -> None:
    """conf.py from _config.yml (not committed: _config.yml stays the one configuration)."""
    _run(str(Path(sys.executable).with_name("jupyter-book")), "config", "sphinx", ".")


def extract(out: Path = BUILD / "gettext") -> Path:
    """Every page's prose as .pot files (notebooks not executed); returns their folder."""
    write_conf()
    shutil.rmtree(out, ignore_errors=True)
    # Without execution the glue roles find no data: those warnings say nothing about the prose.
    subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "gettext", "-D", "nb_execution_mode=off",
                    ".", str(out)], cwd=ROOT, env=_env(), check=True, stderr=subprocess.DEVNULL)
    return out


def catalogs(out: Path = BUILD / "gettext") -> Path:
    """Extract the prose and merge it into locales/zh_CN; returns the .pot folder."""
    extract(out)
    _run(str(Path(sys.executable).with_name("sphinx-intl")), "update", "-p", str(out), "-l", LANG, "-w", WRAP,
         "-d", str(LOCALES.relative_to(ROOT)))
    tidy()
    return out


def tidy(catalogs: Path = LOCALES / LANG / "LC_MESSAGES") -> None:
    """Drop obsolete entries (sphinx-intl keeps them as #~; T1 rejects them) and fill the
    catalogs of pages written in Chinese with their own text."""
    from babel.messages.pofile import read_po, write_po

    for po in sorted(catalogs.rglob("*.po")):
        with po.open("rb") as f:
            catalog = read_po(f)
        changed = bool(catalog.obsolete)
        catalog.obsolete.clear()
        if po.relative_to(catalogs).with_suffix("").as_posix() in CHINESE_SOURCES:
            for message in catalog:
                if message.id and message.string != message.id:
                    message.string, changed = message.id, True
                    message.flags.discard("fuzzy")
        if changed:
            with po.open("wb") as f:
                write_po(f, catalog, width=int(WRAP))


def build(strict: bool = False, reuse_cache: bool = False) -> None:
    write_conf()
    cache = BUILD / ".jupyter_cache"
    if not reuse_cache:
        shutil.rmtree(cache, ignore_errors=True)  # the cache does not notice edits to tfm_course
    flags = ["-W", "-n", "--keep-going"] if strict else []
    common = ["-D", "nb_execution_mode=cache", "-D", f"nb_execution_cache_path={cache}"]
    _run(sys.executable, "-m", "sphinx", "-b", "html", *flags, "-d", str(BUILD / "doctrees"), *common,
         ".", str(BUILD / "html"))
    # The Chinese edition reads the same cache. It is built beside the English one (its notebook
    # outputs go to _build/zh/jupyter_execute), then copied to _build/html/zh_CN.
    site = BUILD / "zh" / LANG
    _run(sys.executable, "-m", "sphinx", "-b", "html", *flags, "-d", str(BUILD / "doctrees-zh"), *common,
         "-D", f"language={LANG}", ".", str(site))
    target = BUILD / "html" / LANG
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(site, target)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("catalogs", help="refresh the zh_CN catalogs from the sources")
    b = sub.add_parser("build", help="both editions into _build/html")
    b.add_argument("--strict", action="store_true", help="warnings are errors, as in CI")
    b.add_argument("--reuse-cache", action="store_true", help="keep the execution cache (faster; stale if "
                   "tfm_course changed)")
    args = parser.parse_args(argv)
    if args.command == "catalogs":
        catalogs()
    else:
        build(strict=args.strict, reuse_cache=args.reuse_cache)


if __name__ == "__main__":
    main()
