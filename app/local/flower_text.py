"""Text Flower reads: TOML strings (``config.toml``) and ``key=value`` options (``--run-config``, ``--node-config``)."""

from __future__ import annotations

TOML_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _control(char: str) -> bool:
    """Whether TOML forbids ``char`` unescaped in a string (U+0000-U+001F but tab, and U+007F)."""
    return (ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F


def _escaped(text: str, quote: str) -> str:
    """``text`` between double quotes, escaped for a TOML basic string, each ``"`` written as ``quote``."""
    escaped = (quote if char == '"' else TOML_ESCAPES.get(char) or (f"\\u{ord(char):04x}" if _control(char) else char)
               for char in text)  # fmt: skip
    return '"' + "".join(escaped) + '"'


def toml_string(text: str) -> str:
    r"""``text`` as a TOML basic string (``"..."``), every character escaped that TOML asks to be.

    A path holding ``'``, ``"`` or ``\`` written between quotes as it is would end the
    string early or start an escape, and ``flwr`` would refuse the whole config file.
    """
    return _escaped(text, '\\"')


def option_string(text: str) -> str:
    r"""``text`` as a string value in Flower's ``key=value`` options (``--run-config``, ``--node-config``).

    Flower finds each value with a pattern that ends a quoted value at its first quote of
    the same kind (``flwr/common/config.py``, ``parse_config_args``) and then reads it as
    TOML. A TOML basic string carries any text, and a ``"`` written as ``\u0022`` holds no
    quote for that pattern to stop at: so every text (both quotes, backslashes, newlines,
    ``=`` and spaces) reaches the run or the node as it was.
    Every string value is quoted, so a ``--run-config`` text never ends in ``.toml`` (which
    Flower would read as a file name).
    """
    return _escaped(text, "\\u0022")


def _toml_value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return option_string(value)
    if isinstance(value, int | float):
        return repr(value)
    raise TypeError(f"config key {key!r}: {value!r} is not a bool, int, float or str, the values Flower's "
                    "run and node configs hold")  # fmt: skip


def options_text(config: dict[str, object]) -> str:
    """``{"lr": 0.1, "dataset": "mnist"}`` -> ``lr=0.1 dataset="mnist"``: a ``--run-config`` or ``--node-config``.

    The one way stamen writes either: every string through :func:`option_string`, so
    Flower's parser gives back ``config`` as it was (tests/test_hostile_deploy.py).
    """
    return " ".join(f"{key}={_toml_value(key, value)}" for key, value in config.items())
