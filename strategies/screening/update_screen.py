"""The update-norm screen: a fit reply whose update is outsized against its round's median is dropped.

A member of every strategy (``strategy.update_screen``). Three scales are screened, each
against its own round median: the model's floating-point update, its integer arrays'
change (BatchNorm's step counters), and the norm of every returned array set of kind
``update`` or ``values`` (SCAFFOLD's ``delta-control``, FedProto's prototypes). A
non-finite norm is dropped whatever the ratio. A method whose model never travels has no
update: only its array sets are screened.
"""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common.logger import log

from strategies.contracts.payload import ArraySet
from strategies.nodes.directory import NodeDirectory
from strategies.screening.replies import Reply, outsized, set_norm, update_norm


class UpdateNormScreen:
    """Drops replies beyond ``ratio`` times their round's median norm (``max-update-ratio``; 0 keeps every reply).

    Parameters
    ----------
    ratio
        The run's ``max-update-ratio``.
    returns
        The array sets the method's replies return (its contract's ``returns``).
    nodes
        The node directory, to name a dropped reply's node in the log.

    """

    def __init__(self, *, ratio: float, returns: tuple[ArraySet, ...], nodes: NodeDirectory) -> None:
        self.ratio, self.returns, self.nodes = ratio, returns, nodes

    def screen(self, server_round: int, replies: list[Reply],
               sent: list[list[np.ndarray]] | None) -> tuple[list[Reply], int, dict[str, float | int]]:  # fmt: skip
        """The replies kept, how many were dropped, and the round record's entries.

        ``sent`` holds, per reply, the model arrays its partition was sent (``None`` when
        no model travels). The entries are ``update-norm-median`` and ``-max`` (when the
        model travels) and ``clients-outsized`` (when it travels or a set was dropped).
        """
        if not replies:
            return replies, 0, {}
        entries: dict[str, float | int] = {}
        why: list[str | None] = [None] * len(replies)
        if sent is not None:
            norms = [update_norm(reply.arrays, before) for reply, before in zip(replies, sent, strict=True)]
            entries.update({"update-norm-median": float(np.median(norms)), "update-norm-max": max(norms)})
            _flag(why, norms, self.ratio, "update norm")
            counters = [update_norm(r.arrays, before, counters=True) for r, before in zip(replies, sent, strict=True)]
            _flag(why, counters, self.ratio, "integer arrays' change")
        for array_set in self.returns:
            if array_set.kind in ("update", "values"):
                _flag(why, [set_norm(reply.extras[array_set.name]) for reply in replies], self.ratio,
                      f"{array_set.name!r} norm")  # fmt: skip
        for reply, reason in zip(replies, why, strict=True):
            if reason is not None:
                log(WARNING, "round %s: rejected fit reply from %s: %s (max-update-ratio %g)", server_round,
                    self.nodes.label(reply.node), reason, self.ratio)  # fmt: skip
        dropped = sum(reason is not None for reason in why)
        if sent is not None or dropped:
            entries["clients-outsized"] = dropped
        return [reply for reply, reason in zip(replies, why, strict=True) if reason is None], dropped, entries


def _flag(why: list[str | None], norms: list[float], ratio: float, what: str) -> None:
    """Set ``why[i]`` for every norm :func:`outsized` flags (the first reason found stays)."""
    median = float(np.median(norms))
    for i, (norm, flag) in enumerate(zip(norms, outsized(norms, ratio), strict=True)):
        if flag and why[i] is None:
            scale = f"{norm / median:.1f} times" if median > 0 and np.isfinite(norm) else "beyond"
            why[i] = f"{what} {norm:.4g} is {scale} the round's median {median:.4g}"
