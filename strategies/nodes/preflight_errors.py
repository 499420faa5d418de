"""Why nodes cannot start: the preflight's errors, one line per cause, and every node's full report.

The causes are grouped as every failure is (:func:`strategies.nodes.failure_groups.group_by_cause`), each
node named by its partition, its data-dir or its node id; a cause the server names itself
(no reply within the wait) comes with its advice.
"""

from __future__ import annotations

from strategies.contracts.client_reports import DATA_DIR, PARTITION_ID, PREFLIGHT_DETAIL
from strategies.contracts.payload import Scalar
from strategies.nodes.directory import is_int
from strategies.nodes.failure_groups import group_by_cause, problem_of
from strategies.nodes.failures import NO_REPLY
from strategies.nodes.text import escaped

REPLY_KEY = "preflight-timeout"


class PreflightError(RuntimeError):
    """Some nodes cannot start: ``lines`` has one line per distinct cause, ``detail`` every node's full report.

    ``groups`` holds the causes as data (:func:`failure_groups`), for ``summary.json``.
    """

    def __init__(self, lines: list[str], detail: str, groups: list[dict] | None = None) -> None:
        super().__init__("stamen preflight: " + "; ".join(lines))
        self.lines = lines
        self.detail = detail
        self.groups = groups or []


class MixedCodeError(PreflightError):
    """Round 1 of a run without a preflight found simulated clients running other stamen code than the server."""

    def __str__(self) -> str:
        return "stamen: before round 1: " + "; ".join(self.lines)


def _who(cid: str, answer: dict[str, Scalar] | Exception) -> int | str:
    """A node's partition when it names one, else its data-dir, else its (random) node id; strings escaped.

    A problem answer is not checked (:func:`checked`): a ``partition-id`` that is not a
    non-negative int is passed over.
    """
    partition = -1 if isinstance(answer, Exception) else answer.get(PARTITION_ID, -1)
    if is_int(partition) and partition >= 0:
        return partition
    if isinstance(answer, dict) and answer.get(DATA_DIR):
        return f"data-dir {escaped(answer[DATA_DIR])}"
    return f"node {escaped(cid)}"


def failure_groups(problems: list[tuple[str, dict[str, Scalar] | Exception]], asked: int) -> list[dict]:
    """The problems grouped by cause, most common first: ``cause``, ``count``, ``asked``, the first few ``clients``.

    The groups are those of every failure (:func:`strategies.nodes.failure_groups.group_by_cause`, node
    ids taken out of the causes), with the server's advice on a cause it names itself.
    """
    groups = group_by_cause((_who(cid, answer), problem_of(answer) or "") for cid, answer in problems)
    return [{"cause": g["cause"] + _advice(g["cause"], g["count"], asked), "count": g["count"], "asked": asked,
             "clients": g["clients"]} for g in groups]  # fmt: skip


def _advice(cause: str, silent: int, asked: int) -> str:
    """What to do about a cause the server itself names (no reply within the wait)."""
    if not cause.startswith(NO_REPLY):
        return ""
    return (f" ({asked - silent} of {asked} answered; run config key {REPLY_KEY!r} sets the wait: raise it on a "
            "loaded machine or a large federation, where each node's first message imports torch and loads its data)")


def preflight_error(
    problems: list[tuple[str, dict[str, Scalar] | Exception]], asked: int,
    kind: type[PreflightError] | None = None,
) -> PreflightError:
    """The error (``kind``, default :class:`PreflightError`) for ``problems``: its lines, every report, its groups."""
    groups = failure_groups(problems, asked)
    return (kind or PreflightError)(condensed(groups), details(problems), groups)


def condensed(groups: list[dict]) -> list[str]:
    """One line per group (:func:`failure_groups`): how many clients of those asked, which ones, and the cause."""
    return [f"{g['count']} of {g['asked']} clients ({', '.join(g['clients'])}): {g['cause']}" for g in groups]


def details(problems: list[tuple[str, dict[str, Scalar] | Exception]]) -> str:
    """Every failing node's full report (its traceback), for a log file."""
    parts = []
    for cid, answer in problems:
        who = _who(cid, answer)
        label = f"partition {who} (node {cid})" if isinstance(who, int) else str(who)
        body = str(answer) if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_DETAIL, ""))
        parts.append(f"===== {label}: {problem_of(answer)}\n{body.rstrip()}\n")
    return "\n".join(parts)
