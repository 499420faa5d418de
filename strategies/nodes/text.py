"""A node's strings made safe for one log line: escaped and cut (pure).

An answer is the node's word, not a fact (docs: DESIGN.md, trust boundaries): every
string a node sent is escaped (:func:`escaped`) before it reaches a log line, so a
newline or a terminal escape in a node's answer cannot forge one.
"""

from __future__ import annotations

NAME_CHARS = 120  # a node's string (its data-dir, a bad value) in a log line is cut to this
PROBLEM_CHARS = 2_000  # a node's own account of its fault: a sentence or two, and the server's hint after it


def escaped(text: object, limit: int = NAME_CHARS) -> str:
    r"""``text`` safe for one log line: each non-printable character written as a repr writes it, cut to ``limit``.

    A newline, a terminal escape or a bidirectional override in a node's string becomes
    ``\n``, ``\x1b``, ``\u202e``, so it cannot start a forged log line or recolour one;
    printable text (a non-ASCII folder name too) stays as it is. A cut ends in ``...``.

    >>> escaped("a\nb\x1b[31m")
    'a\\nb\\x1b[31m'
    """
    raw = str(text)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit])
    return out[:limit] + "..." if len(out) > limit or len(raw) > limit else out


def shown(value: object, limit: int = NAME_CHARS) -> str:
    """A node's value in a log line: its repr (quoted where a text), escaped and cut (:func:`escaped`)."""
    return escaped(repr(value), limit)
