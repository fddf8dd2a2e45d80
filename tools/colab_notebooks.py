"""Moved to tools/book/colab_notebooks.py (issue 18); this forwards to it, for commands written before the move."""

import runpy
import sys
from pathlib import Path

print("note: tools/colab_notebooks.py moved to tools/book/colab_notebooks.py", file=sys.stderr)
target = Path(__file__).resolve().parent / "book" / "colab_notebooks.py"
sys.path.insert(0, str(target.parent))
sys.argv[0] = str(target)
runpy.run_path(str(target), run_name="__main__")
