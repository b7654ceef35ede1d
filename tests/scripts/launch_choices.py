"""A script with its own Request under `trainplan launch`: it prints what it runs (precision, options)."""

import json
import sys

import trainplan as tp

precision = sys.argv[1] if len(sys.argv) > 1 else None
request = tp.Request(accelerator="cpu") if precision is None else tp.Request(accelerator="cpu", precision=precision)  # type: ignore[arg-type]
plan = tp.resolve(request)
print("REPORT " + json.dumps({"precision": plan.precision, "options": repr(plan.request.strategy_options)}), flush=True)
