"""Text Flower reads: TOML strings (``config.toml``) and ``key=value`` options (``--run-config``, ``--node-config``)."""

from __future__ import annotations

TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _control(char: str) -> bool:
    """Whether TOML forbids ``char`` unescaped in a string (U+0000-U+001F but tab, and U+007F)."""
    return (ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F


def toml_string(text: str) -> str:
    r"""``text`` as a TOML basic string (``"..."``), every character escaped that TOML asks to be.

    A path holding ``'``, ``"`` or ``\`` written between quotes as it is would end the
    string early or start an escape, and ``flwr`` would refuse the whole config file.
    """
    escaped = (TOML_ESCAPES.get(char) or (f"\\u{ord(char):04x}" if _control(char) else char) for char in text)
    return '"' + "".join(escaped) + '"'


def option_string(text: str) -> str:
    """``text`` as a string value in Flower's ``key=value`` options (``--node-config``, ``--run-config``).

    Flower finds each value with a pattern that ends a quoted value at its first quote
    (``flwr/common/config.py``, ``parse_config_args``) and then reads it as TOML: a literal
    string ``'...'`` (taken as it is) where ``text`` has no ``'``, else a basic string
    where it has no ``"``.

    Raises
    ------
    ValueError
        For text holding both quotes, which that syntax cannot carry.

    """
    if "'" not in text and not any(_control(char) for char in text):
        return f"'{text}'"
    if '"' not in text:
        return toml_string(text)
    raise ValueError(f"{text!r} holds both ' and \", which Flower's key=value options cannot carry; rename it")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def run_config_text(config: dict[str, object]) -> str:
    """``{"lr": 0.1, "dataset": "mnist"}`` -> ``lr=0.1 dataset='mnist'`` for ``--run-config``."""
    return " ".join(f"{key}={_toml_value(value)}" for key, value in config.items())
