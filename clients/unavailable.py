"""The client a node runs when it cannot build its real one: it reports why, as data.

An exception raised inside a ClientApp makes Flower's simulation engine print a full
Ray traceback per client (1,292 lines for ten clients asked for a GPU they lack). A
node whose client cannot be built (a missing GPU, an unreadable data file, a node
config without its partition) instead answers the preflight with the reason and the
traceback in its properties; the server condenses the answers into one line per cause.
"""

from __future__ import annotations

import traceback

import numpy as np
from flwr.client import NumPyClient

from datasets import LocalDataError
from strategies.contracts.client_reports import (
    DATA_DIR,
    NUM_PARTITIONS,
    PARTITION_ID,
    PREFLIGHT_DETAIL,
    PREFLIGHT_ERROR,
    PREFLIGHT_SCOPE,
)
from strategies.contracts.code import code_identity

DETAIL_CHARS = 20_000  # a message's properties are small; the traceback's tail is what matters


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (its type only when the message is empty)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


class UnavailableClient(NumPyClient):
    """Answers ``get_properties`` with why the node's client could not be built; refuses work.

    A fault in the node's own data is reported with scope ``node``: the server leaves
    that node out and the others go on. Any other fault is the run's (its config, its
    code) and stops the run.

    Parameters
    ----------
    error
        What building the client raised.
    partition_id, num_partitions
        The node's partition, when its node config gave one (-1 and 0 otherwise).
    data_dir
        The node's own data folder, when it has one (a deployed device).
    scope
        ``node`` or ``run``; by default ``node`` exactly for :class:`datasets.LocalDataError`.

    """

    def __init__(self, *, error: BaseException, partition_id: int = -1, num_partitions: int = 0,
                 data_dir: str = "", scope: str = "") -> None:  # fmt: skip
        self.reason = one_line(error)
        self.detail = "".join(traceback.format_exception(error))[-DETAIL_CHARS:]
        self.scope = scope or ("node" if isinstance(error, LocalDataError) else "run")
        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self.data_dir = data_dir

    def get_properties(self, config: dict) -> dict:
        return {PARTITION_ID: self.partition_id, NUM_PARTITIONS: self.num_partitions, DATA_DIR: self.data_dir,
                PREFLIGHT_ERROR: self.reason, PREFLIGHT_DETAIL: self.detail, PREFLIGHT_SCOPE: self.scope,
                **code_identity()}  # fmt: skip

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        raise RuntimeError(f"this node cannot train: {self.reason}")

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        raise RuntimeError(f"this node cannot evaluate: {self.reason}")
