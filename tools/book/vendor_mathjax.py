"""Put MathJax beside the book, so that its maths renders offline and behind firewalls.

Sphinx loads MathJax from a public CDN by default; a reader offline, or behind a firewall that
blocks that CDN, then sees raw TeX. ``_config.yml`` points ``mathjax_path`` at
``_static/mathjax/tex-chtml.js`` instead, and this script installs that file (with the fonts and
TeX extensions it loads on demand) from the official ``mathjax`` package on the npm registry,
pinned, into ``book/_static/mathjax/`` (ignored by git: a build artefact, never committed).

    python tools/book/vendor_mathjax.py          # once, before `jupyter-book build`; needs npm

``npm pack`` checks the tarball against the registry's integrity hash.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "3.2.2"  # MathJax 3, the major version Sphinx's mathjax extension configures
ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "book" / "_static" / "mathjax"
ENTRY = "tex-chtml.js"


def installed() -> bool:
    return (TARGET / ENTRY).exists() and (TARGET / "VERSION").read_text().strip() == VERSION \
        if (TARGET / "VERSION").exists() else False


def main() -> int:
    if installed():
        print(f"MathJax {VERSION} already in {TARGET.relative_to(ROOT)}")
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("npm not found: install Node.js (npm), or the book will need a network to show maths")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([npm, "pack", f"mathjax@{VERSION}", "--pack-destination", tmp, "--silent"],
                       check=True, stdout=subprocess.DEVNULL)
        (tarball,) = Path(tmp).glob("mathjax-*.tgz")
        with tarfile.open(tarball) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith("package/es5/") and m.isfile()]
            archive.extractall(tmp, members=members, filter="data")
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(Path(tmp) / "package" / "es5", TARGET)
    (TARGET / "VERSION").write_text(VERSION + "\n")
    print(f"MathJax {VERSION} installed in {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
