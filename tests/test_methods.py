"""Every registered method's two rounds in-process, checked by what its contract declares.

Parametrised over ``app.registry.METHODS``: a new method is covered with no new test code.
``InProcessRun`` drives each method's messages through Flower's encoding byte for byte, so
what the end-to-end tiers checked per method (the round records with the declared metrics,
the bytes counted, personal layers kept on the clients, finite accuracies) is checked here;
the Ray simulation and the TLS deployment run only ``selection.TRANSPORT_METHODS``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import check_method_record

from app.local.inprocess import InProcessRun
from app.registry import METHODS

CLIENTS = 4
# small and quick: two local steps of four examples; FATHOM's tuner works in epochs, so a tenth of one
QUICK = {"fraction-fit": 1.0, "min-available-clients": CLIENTS, "local-steps": 2, "batch-size": 4,
         "adapt-batch-size": 4, "perfedavg-outer-batch-size": 4, "perfedavg-hessian-batch-size": 4,
         "eval-every": 1}  # fmt: skip
OWN = {"fathom": {"local-epochs": 0.1, "fathom-batch-min": 2.0, "batch-size": 4}}


def rounds_of(run: InProcessRun, rounds: int) -> list[dict]:
    """``rounds`` rounds of fit and evaluation; each round's record as the strategy keeps it for metrics.jsonl."""
    records = []
    for _ in range(rounds):
        run.step()
        run.evaluate()
        records.append(dict(run.strategy.record))
    return records


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_records_its_declared_metrics_and_keeps_personal_arrays_home(name):
    contract = METHODS[name].contract
    run = InProcessRun(run_config={**contract.example, **QUICK, **OWN.get(name, {})}, num_clients=CLIENTS)
    strategy, client = run.strategy, run.clients[0]
    initial = [a.copy() for a in strategy.global_model]
    records = rounds_of(run, 2)
    assert [r["round"] for r in records] == [1, 2]
    for record in records:
        assert record["strategy"] == name and record["clients-failed"] == 0
        assert record["clients-succeeded"] == record["clients-sampled"] == CLIENTS
        assert record["eval-clients"] == CLIENTS
        check_method_record(record, contract)
        # the global and personalised figures are finite: accuracies of a classifier, losses of least squares
        scores = {k: v for k, v in record.items() if ("accuracy" in k or "loss" in k) and isinstance(v, float)}
        assert "loss" in scores and all(math.isfinite(v) for v in scores.values()), scores
        assert all(0 <= v <= 1 for k, v in scores.items() if "accuracy" in k), scores
    # the arrays the contract keeps on the clients never travel: the server's copies are the initial ones
    personal = set(contract.personal_arrays(client.method, client.layout))
    kept = [i for i, array_name in enumerate(client.layout.names) if array_name in personal]
    assert kept == [i for i in range(len(initial)) if i not in strategy.shared]
    for index in kept:
        np.testing.assert_array_equal(strategy.global_model[index], initial[index])
    assert all(np.all(np.isfinite(a)) for a in strategy.global_model)


def test_perfedavg_records_its_work_and_personalised_accuracy():
    run = InProcessRun(run_config={"strategy": "perfedavg", "fraction-fit": 0.5, "eval-every": 1}, num_clients=CLIENTS)
    for record in rounds_of(run, 2):
        assert record["clients-sampled"] == CLIENTS // 2 and record["clients-succeeded"] == CLIENTS // 2
        # perfedavg hf: 10 meta-steps of 4 gradient evaluations on each of the 2 sampled clients
        assert record["grad-evals"] == (CLIENTS // 2) * 10 * 4 and record["hp-perfedavg-variant"] == "hf"
        assert 0.0 <= record["accuracy-min"] <= record["accuracy"] <= record["accuracy-max"] <= 1.0
    assert run.settings.data.dataset == "mnist-5k"


def test_fedavg_baseline_reports_the_same_metrics():
    def last_record(strategy: str) -> dict:
        run = InProcessRun(run_config={"strategy": strategy, "fraction-fit": 0.5, "eval-every": 1},
                           num_clients=CLIENTS)  # fmt: skip
        return rounds_of(run, 2)[-1]

    fedavg, perfedavg = last_record("fedavg"), last_record("perfedavg")
    metric_keys = {k for k in perfedavg if not k.startswith(("hp-", "_"))}
    assert metric_keys == {k for k in fedavg if not k.startswith(("hp-", "_"))}
    assert fedavg["grad-evals"] == (CLIENTS // 2) * 10


def test_fathom_clients_receive_the_hyperparameters_the_strategy_moves_each_round():
    config = {**METHODS["fathom"].contract.example, "num-server-rounds": 3, "fraction-fit": 1.0, "eval-every": 1}
    rounds = rounds_of(InProcessRun(run_config=config, num_clients=CLIENTS), 3)
    for record in rounds:  # what every client received and used is what the strategy had in force
        assert record["client-lr-min"] == pytest.approx(record["hp-lr"], rel=1e-12)
        assert record["client-lr-max"] == pytest.approx(record["hp-lr"], rel=1e-12)
        assert -1.0 <= record["phi-mean"] <= 1.0
    assert rounds[0]["hp-lr"] == rounds[1]["hp-lr"] == 0.05  # H = 0 in round 1
    assert rounds[2]["hp-lr"] != rounds[1]["hp-lr"]  # H != 0 from round 2 on
    batch_sizes = [r["hp-batch-size"] for r in rounds]
    assert batch_sizes[0] == 8.0 and len(set(batch_sizes)) == 3  # G moves B every round
