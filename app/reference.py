"""The configuration reference, generated from the declarations, so the docs cannot drift from the code.

    python -m app.reference            # print the tables
    python -m app.reference --write    # rewrite them in docs/configuration.md (between the markers)

``tests/test_app_config.py`` fails when docs/configuration.md and this output differ.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from app.registry import CONTRACTS
from strategies.contracts.common import SHARED_GROUPS
from strategies.contracts.contract import Contract
from strategies.contracts.keys import KeySpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN, END = "<!-- keys:begin (python -m app.reference --write) -->", "<!-- keys:end -->"


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _table(specs: tuple[KeySpec, ...], contracts: Mapping[str, Contract]) -> list[str]:
    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for spec in specs:
        choices = tuple(contracts) if spec.name == "strategy" else spec.choices
        allowed = ", ".join(f"`{c}`" for c in choices) if choices else spec.allowed()
        allowed = allowed.replace("|", "\\|")
        meaning = spec.doc.replace("|", "\\|") + (" (server only)" if spec.server_only else "")
        lines.append(f"| `{spec.name}` | {_cell(spec.default)} | {allowed} | {meaning} |")
    return lines


def reference(contracts: Mapping[str, Contract] = CONTRACTS) -> str:
    """Markdown: one table per shared group, then one per method (its summary and the shared keys it reads)."""
    lines: list[str] = []
    for group in SHARED_GROUPS:
        lines += [f"### {group.__doc__.splitlines()[0].rstrip('.')}", "", *_table(group.key_specs(), contracts), ""]
    for name, contract in contracts.items():
        lines += [f"### `{name}`: {contract.summary}", ""]
        uses = ", ".join(f"`{k}`" for k in contract.uses)
        specs = contract.settings.key_specs()
        lines += [f"Reads the shared {uses}." + ("" if specs else " No keys of its own."), ""]
        if specs:
            lines += [*_table(specs, contracts), ""]
    return "\n".join(lines).rstrip() + "\n"


def documented(text: str) -> str:
    """The generated part of docs/configuration.md's text."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} lacks the markers {BEGIN!r} and {END!r}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main() -> None:
    """Print the tables, or write them into docs/configuration.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the tables in {DOC}")
    args = parser.parse_args()
    tables = reference()
    if not args.write:
        print(tables, end="")
        return
    text = DOC.read_text()
    documented(text)  # the markers are there
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{tables}{END}{rest.split(END, 1)[1]}")
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
