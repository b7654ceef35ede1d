"""Loose input → the typed request: one row per request field (`fields`: its parsers, defaults, wire format and
flag), field values from config files, flags and JSON (`normalise`), and old Trainer flags (`legacy`, the
deprecation bridge).

Pure, like `spec` and `resolve`: reads the rule set, never the machine. The records call in here
(`Request.from_config`, `Request.from_legacy`) and hand their class over, so nothing here imports them.
"""
