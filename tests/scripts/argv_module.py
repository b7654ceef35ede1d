"""Run as a module (`trainplan launch -m tests.scripts.argv_module ...`): prints what it was given."""

from __future__ import annotations

import os
import sys

print("module", __name__, "args", sys.argv[1:], "rank", os.environ["RANK"], "omp", os.environ.get("OMP_NUM_THREADS"))
