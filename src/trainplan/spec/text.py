"""Text that travels: the host check every address passes (resolved or read back), which characters a plan's text
may hold, and how free text is made safe for one line of a shell script or a YAML comment.

Pure, stdlib only, at the bottom of the layers so the resolver, the plan reader and the emitters share one check.
"""

from __future__ import annotations

import ipaddress
import re

_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})", flags=re.ASCII)


def host_address(text: str) -> str | None:
    """`text` as a host to meet at (a name, an IPv4 or an IPv6 address; `[::1]` loses its brackets), or None
    for anything else: a port glued on (`host:1234`), control characters, spaces, shell metacharacters."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:
            return None
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text.split("%", 1)[0])) if text.count(":") >= 2 else None
        except ValueError:
            return None
    return text if _HOST_NAME.fullmatch(text) else None


# C0 and C1 controls and DEL (line breaks, escapes, NUL), lone surrogates (no encoding writes them), the Unicode
# line and paragraph separators (YAML ends a line there), and U+FEFF, U+FFFE, U+FFFF (YAML refuses them).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\ufeff\ufffe\uffff]")


def unsafe_character(text: str) -> str | None:
    """The first character of `text` that a plan's text may not hold, or None: a plan's strings (notes, reasons,
    names, addresses) are written into explain(), comments of emitted scripts and manifests, and the
    environment of workers, where a line break starts a new command and a surrogate cannot be encoded."""
    found = _UNSAFE.search(text)
    return None if found is None else found.group()


def one_line(text: str) -> str:
    """`text` safe to write after `#` in a shell script or a YAML file: every character `unsafe_character` names
    written as its escape (`\\n`, `\\x1b`, `\\u2028`), so the comment cannot end early or be unreadable."""
    return _UNSAFE.sub(lambda found: repr(found.group())[1:-1], text)


__all__ = ["host_address", "one_line", "unsafe_character"]
