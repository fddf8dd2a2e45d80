"""``python -m tfm_course.distributed``: the training script of :mod:`tfm_course.distributed.train`."""

from __future__ import annotations

from .train import main

if __name__ == "__main__":
    raise SystemExit(main())
