"""Moved to tools/book/expected_outputs.py (issue 18); this forwards to it, for commands written before the move."""

import runpy
import sys
from pathlib import Path

print("note: tools/expected_outputs.py moved to tools/book/expected_outputs.py", file=sys.stderr)
target = Path(__file__).resolve().parent / "book" / "expected_outputs.py"
sys.path.insert(0, str(target.parent))
sys.argv[0] = str(target)
runpy.run_path(str(target), run_name="__main__")
