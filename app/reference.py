"""The configuration reference and the table of models, generated from the declarations and the registries.

    python -m app.reference            # print the tables
    python -m app.reference --write    # rewrite them in docs/configuration.md, docs/models.md and docs/own-app.md

(between markers). ``tests/test_app_config.py`` fails when a page and this output differ.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from app.registry import CONTRACTS, METHODS, Method
from clients.models import model_cards
from strategies.contracts.common import SHARED_GROUPS
from strategies.contracts.contract import Contract
from strategies.contracts.keys import KeySpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN, END = "<!-- keys:begin (python -m app.reference --write) -->", "<!-- keys:end -->"
MODELS_DOC = DOC.with_name("models.md")
MODELS_BEGIN, MODELS_END = "<!-- models:begin (python -m app.reference --write) -->", "<!-- models:end -->"
METHODS_DOC = DOC.with_name("own-app.md")
METHODS_BEGIN, METHODS_END = "<!-- methods:begin (python -m app.reference --write) -->", "<!-- methods:end -->"


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _table(specs: tuple[KeySpec, ...], contracts: Mapping[str, Contract]) -> list[str]:
    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for spec in specs:
        choices = {"strategy": tuple(contracts), "model": tuple(model_cards())}.get(spec.name, spec.choices)
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


def models_table() -> str:
    """Markdown: one row per registered model, its traits as the settings checks read them."""
    lines = ["| `model` | network | inputs | smooth | norm | task |", "|---|---|---|---|---|---|"]
    for name, card in model_cards().items():
        smooth = "yes" if card.smooth else "no (ReLU)"
        lines.append(f"| `{name}` | {card.summary} | {card.inputs} | {smooth} | {card.norm} | {card.task} |")
    return "\n".join(lines) + "\n"


def methods_table(methods: Mapping[str, Method] = METHODS) -> str:
    """Markdown: one row per registered method, its classes (as an installed stamen names them) and its keys.

    The strategy is the method's Message API class (``stamen.PerFedAvg``); the server is the
    method object it plays (the base, :class:`FederatedStrategy`, where the contract says all).
    """
    lines = ["| `strategy` | strategy class | server class | client class | keys it reads besides the run's |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, method in methods.items():
        classes = [f"`stamen.{c.__module__.removeprefix('stamen.')}.{c.__name__}`"
                   for c in (method.server, method.client)]  # fmt: skip
        keys = ", ".join(f"`{k}`" for k in method.keys)
        lines.append(f"| [`{name}`](methods/{name}.md) | `stamen.{method.class_name}` | {classes[0]} | {classes[1]} "
                     f"| {keys} |")
    return "\n".join(lines) + "\n"


def documented(text: str, begin: str = BEGIN, end: str = END) -> str:
    """The generated part of a page's text, between its markers."""
    if begin not in text or end not in text:
        raise ValueError(f"the page lacks the markers {begin!r} and {end!r}")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def write_between(page: Path, begin: str, end: str, generated: str) -> None:
    """Replace what lies between ``begin`` and ``end`` in ``page`` with ``generated``."""
    text = page.read_text()
    documented(text, begin, end)  # the markers are there
    head, rest = text.split(begin, 1)
    page.write_text(f"{head}{begin}\n{generated}{end}{rest.split(end, 1)[1]}")
    print(f"wrote {page}")


def main() -> None:
    """Print the tables, or write them into their pages."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite the tables in {DOC}, {MODELS_DOC} and {METHODS_DOC}")  # fmt: skip
    args = parser.parse_args()
    if not args.write:
        print(reference(), models_table(), methods_table(), sep="\n", end="")
        return
    write_between(DOC, BEGIN, END, reference())
    write_between(MODELS_DOC, MODELS_BEGIN, MODELS_END, models_table())
    write_between(METHODS_DOC, METHODS_BEGIN, METHODS_END, methods_table())


if __name__ == "__main__":
    main()
