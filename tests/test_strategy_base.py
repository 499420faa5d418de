import numpy as np
import pytest
from conftest import FakeFleet, FakeNode, settings
from helpers import (
    SHAPES,
    aggregate_evaluate,
    aggregate_fit,
    arrays,
    configure_evaluate,
    configure_fit,
    evaluation,
    fit_res,
    sent_arrays,
    start_run,
)
from helpers import stand_in_fedavg as make_strategy

from strategies.base import FederatedStrategy
from strategies.contracts.client_reports import FIT_METRICS
from strategies.contracts.code import code_identity
from strategies.methods.perfedavg import PerFedAvgServer
from strategies.rounds.records import progress_line
from strategies.rounds.summaries import summarise, weighted_mean
from strategies.screening.replies import evaluate_reply_problem, fit_reply_problem

SPECS = {m.name: m for m in FIT_METRICS}


def test_bad_replies_are_rejected_and_the_rest_averaged_exactly():
    strategy, fleet, nodes, recorder = make_strategy()
    instructions = configure_fit(strategy, 1, fleet)
    assert len(instructions) == 4 and instructions[0].config["lr"] == 0.1
    assert instructions[0].config["server-round"] == 1
    with_nan = arrays(1.0)
    with_nan[1][0] = np.nan
    wrong_shape = [np.ones((3, 2), np.float32), np.ones(3, np.float32)]
    results = [
        fit_res(nodes[0], arrays(1.0), 10),
        fit_res(nodes[1], arrays(3.0), 30),
        fit_res(nodes[2], with_nan, 1000),
        fit_res(nodes[3], wrong_shape, 1000),
    ]
    model, metrics = aggregate_fit(strategy, 1, results)
    for got in model:
        np.testing.assert_allclose(got, 2.5, rtol=0, atol=1e-6)  # (10*1 + 30*3) / 40
    assert metrics["examples"] == 40 and metrics["grad-evals"] == 8
    assert strategy.record["clients-failed"] == 2 and strategy.record["clients-rejected"] == 2


def test_round_of_only_bad_replies_leaves_the_model_alone():
    strategy, fleet, nodes, _ = make_strategy()
    configure_fit(strategy, 1, fleet)
    bad = [fit_res(nodes[0], arrays(np.inf), 5), fit_res(nodes[1], arrays(1.0), 0)]
    model, _ = aggregate_fit(strategy, 1, bad, [RuntimeError("client crashed")])
    assert model is None  # the global model stays as it was
    assert strategy.record["clients-failed"] == 3
    assert strategy.record["fit-failures"] == ["RuntimeError: client crashed"]


@pytest.mark.parametrize(
    "metrics",
    [{"train-loss": float("nan")}, {"train-loss": -1.0}, {"train-loss": 1e9}, {"grad-evals": -3},
     {"hvp-evals": -1}, {"sample-grads": "many"}],
)  # fmt: skip
def test_absurd_fit_metrics_are_rejected(metrics):
    assert fit_reply_problem(arrays(1.0), 10, metrics, SHAPES, SPECS) is not None


def test_fit_reply_checks():
    assert fit_reply_problem(arrays(1.0), 10, {}, SHAPES, SPECS) is None
    assert fit_reply_problem(arrays(1.0)[:1], 10, {}, SHAPES, SPECS) == "1 arrays, expected 2"
    assert "non-positive" in fit_reply_problem(arrays(1.0), -1, {}, SHAPES, SPECS)


def test_evaluate_reply_checks():
    from strategies.contracts.client_reports import EVALUATE_METRICS

    specs = {m.name: m for m in EVALUATE_METRICS}
    assert evaluate_reply_problem(0.3, 5, {"accuracy": 0.9}, specs) is None
    assert "outside [0, 1]" in evaluate_reply_problem(0.3, 5, {"accuracy": 1.2}, specs)
    assert "non-finite" in evaluate_reply_problem(float("nan"), 5, {"accuracy": 0.5}, specs)
    assert "not in [0, 1e+06]" in evaluate_reply_problem(2e6, 5, {"accuracy": 0.5}, specs)
    assert evaluate_reply_problem(0.3, 5, {}, specs) is None  # a regression reply: its loss only
    assert "non-finite" in evaluate_reply_problem(0.3, 5, {"global-loss": float("inf")}, specs)


def test_personalised_metrics_are_weighted_with_spread_and_bad_ones_dropped():
    strategy, fleet, nodes, _ = make_strategy()
    configure_fit(strategy, 2, fleet)
    replies = [
        evaluation(nodes[0], 0.2, 10, {"accuracy": 0.9, "global-accuracy": 0.5}),
        evaluation(nodes[1], 0.4, 30, {"accuracy": 0.5, "global-accuracy": 0.3}),
        evaluation(nodes[2], 0.1, 30, {"accuracy": 7.0, "global-accuracy": 0.3}),
    ]
    loss, metrics = aggregate_evaluate(strategy, 2, replies)
    assert loss == pytest.approx((0.2 * 10 + 0.4 * 30) / 40)
    assert metrics["accuracy"] == pytest.approx((0.9 * 10 + 0.5 * 30) / 40)
    assert metrics["accuracy-client-mean"] == pytest.approx(0.7)
    assert (metrics["accuracy-min"], metrics["accuracy-median"], metrics["accuracy-max"]) == (0.5, 0.7, 0.9)
    assert metrics["global-accuracy"] == pytest.approx((0.5 * 10 + 0.3 * 30) / 40)
    assert metrics["eval-clients"] == 2 and metrics["eval-clients-failed"] == 1


def test_every_round_is_recorded_evaluation_follows_eval_every_and_the_run_is_summarised():
    strategy, fleet, nodes, recorder = make_strategy(num_rounds=3, eval_every=2)
    for rnd in (1, 2, 3):
        configure_fit(strategy, rnd, fleet)
        aggregate_fit(strategy, rnd, [fit_res(n, arrays(1.0), 10) for n in nodes])
        instructions = configure_evaluate(strategy, rnd, fleet)
        assert bool(instructions) == (rnd in (2, 3)), rnd
        if instructions:
            assert instructions[0].config["server-round"] == rnd
            replies = [evaluation(n, 0.1, 5, {"accuracy": 0.8, "global-accuracy": 0.6}) for n in nodes]
            aggregate_evaluate(strategy, rnd, replies)
        strategy.end_round(rnd)
    assert [r["round"] for r in recorder.rounds] == [1, 2, 3]
    assert "accuracy" not in recorder.rounds[0] and recorder.rounds[2]["accuracy"] == pytest.approx(0.8)
    assert recorder.rounds[0]["hp-lr"] == 0.1
    assert recorder.summary["best-accuracy"] == pytest.approx(0.8) and recorder.summary["rounds"] == 3


def test_summaries():
    assert weighted_mean([1.0, 3.0], [1, 3]) == 2.5
    assert np.isnan(weighted_mean([], []))
    out = summarise("acc", [0.2, 0.4, 1.0], [1, 1, 2])
    assert out == {
        "acc": 0.65,
        "acc-client-mean": pytest.approx(1.6 / 3),
        "acc-min": 0.2,
        "acc-median": 0.4,
        "acc-max": 1.0,
    }


class StartingNode(FakeNode):
    def __init__(self, cid, error=None):
        super().__init__(cid)
        self.error = error

    def get_properties(self, config):
        if self.error:
            raise ValueError(self.error)
        return super().get_properties(config)


def test_preflight_asks_every_client_and_stops_the_run_with_their_reasons():
    run = settings(strategy="fedavg", preflight=True, min_fit_clients=1, min_available_clients=1)
    strategy = FederatedStrategy(settings=run, initial_model=arrays(0.0))
    fleet = FakeFleet(StartingNode("8"), StartingNode("9", error="perfedavg-outer-batch-size 40 must be in [1, 12]"))
    with pytest.raises(RuntimeError, match=r"1 of 2 clients \(node 9\): perfedavg-outer-batch-size 40"):
        start_run(strategy, fleet)
    assert "perfedavg-outer-batch-size 40" in strategy.recorder.texts["preflight-errors.log"]
    initial = strategy.global_model
    assert start_run(strategy, FakeFleet(StartingNode("1"))) is initial
    assert strategy.nodes.properties == {"1": {"partition-id": 1, "num-partitions": 0, **code_identity()}}


def test_uniform_aggregation_ignores_example_counts():
    strategy, fleet, nodes, _ = make_strategy(aggregation="uniform")
    configure_fit(strategy, 1, fleet)
    results = [fit_res(nodes[0], arrays(1.0), 10), fit_res(nodes[1], arrays(3.0), 30)]
    model, metrics = aggregate_fit(strategy, 1, results)
    for got in model:
        np.testing.assert_allclose(got, 2.0, atol=1e-6)  # (1 + 3) / 2, not (10 + 90) / 40
    assert metrics["examples"] == 40


def test_replies_are_combined_in_partition_order_whatever_their_arrival():
    strategy, fleet, nodes, _ = make_strategy()
    configure_fit(strategy, 1, fleet)
    rng = np.random.default_rng(0)
    replies = [fit_res(n, [rng.normal(size=s).astype(np.float32) for s in SHAPES], int(rng.integers(1, 50)))
               for n in nodes]  # fmt: skip
    first, _ = aggregate_fit(strategy, 1, replies)
    shuffled = [replies[i] for i in (2, 0, 3, 1)]
    configure_fit(strategy, 1, fleet)
    again, _ = aggregate_fit(strategy, 1, shuffled)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit: the sum runs in the same order


def test_perfedavg_broadcasts_its_hyperparameters_and_adapts_with_alpha():
    run = settings(strategy="perfedavg", perfedavg_alpha=0.03, perfedavg_beta=0.07, perfedavg_delta=1e-4,
                   perfedavg_variant="so", local_steps=4, batch_size=5, perfedavg_outer_batch_size=6,
                   perfedavg_hessian_batch_size=7, num_server_rounds=2)  # fmt: skip
    strategy = PerFedAvgServer(settings=run, initial_model=arrays(0.0))
    assert strategy.name == "perfedavg" and run.run.aggregation == "uniform"
    assert strategy.fit_config(3) == {
        "local-steps": 4, "local-epochs": 0.0, "batch-size": 5, "perfedavg-alpha": 0.03, "perfedavg-beta": 0.07,
        "perfedavg-delta": 1e-4, "perfedavg-delta-scale": "gradient", "perfedavg-variant": "so",
        "perfedavg-curvature-bound": -1.0, "perfedavg-outer-batch-size": 6, "perfedavg-hessian-batch-size": 7,
        "server-round": 3}  # fmt: skip
    assert strategy.evaluate_config() == {"adapt-steps": 1, "adapt-lr": 0.03, "adapt-batch-size": 10}
    explicit = PerFedAvgServer(settings=settings(strategy="perfedavg", adapt_lr=0.5),
                         initial_model=arrays(0.0))  # fmt: skip
    assert explicit.evaluate_config()["adapt-lr"] == 0.5


def test_a_strategy_refuses_another_methods_settings():
    with pytest.raises(TypeError, match="PerFedAvgServer needs PerFedAvgSettings, got FedAvgSettings"):
        PerFedAvgServer(settings=settings(strategy="fedavg"), initial_model=arrays(0.0))


def test_central_evaluation_is_recorded_every_round_on_the_aggregated_model():
    strategy, fleet, nodes, recorder = make_strategy(num_rounds=2, eval_every=2)
    seen = []

    def central(arrays):
        seen.append([a.copy() for a in arrays])
        return {"accuracy": 0.25, "loss": float(arrays[0].sum())}

    strategy.phases.central_evaluation = central
    configure_fit(strategy, 1, fleet)
    replies = [fit_res(nodes[0], arrays(2.0), 5), fit_res(nodes[1], arrays(4.0), 5)]
    strategy.phases.take_fit(1, replies, [])
    metrics = strategy.phases.central_test(1)
    np.testing.assert_allclose(seen[0][0], 3.0)  # the aggregate (5 examples each)
    assert metrics["loss"] == pytest.approx(3.0 * 6)
    assert configure_evaluate(strategy, 1, fleet) == []  # not an evaluation round
    strategy.end_round(1)
    assert recorder.rounds[0]["central-accuracy"] == 0.25
    assert "central acc 0.2500" in progress_line(recorder.rounds[0], 2)


def test_decode_once_aggregation_is_bit_for_bit_flowers_inplace_fedavg():
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters  # Flower's own average, the reference
    from flwr.server.strategy.aggregate import aggregate_inplace

    from strategies.aggregation.rules import weighted_average_inplace

    rng = np.random.default_rng(3)
    shapes = [(80, 784), (80,), (10, 80), (10,)]
    models = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(7)]
    counts = [int(c) for c in rng.integers(1, 500, size=7)]
    replies = [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(m), c, {}))
               for m, c in zip(models, counts, strict=True)]  # fmt: skip
    expected = aggregate_inplace(replies)
    mine = weighted_average_inplace([[a.copy() for a in m] for m in models], counts)
    for ours, flowers in zip(mine, expected, strict=True):
        assert ours.dtype == flowers.dtype
        np.testing.assert_array_equal(ours, flowers)


class RayNode(FakeNode):
    """A node that answers the preflight from the given Ray node ("" outside Ray)."""

    def __init__(self, cid: str, ray_node: str) -> None:
        super().__init__(cid)
        self.ray_node = ray_node

    def get_properties(self, config):
        return {**super().get_properties(config), "num-partitions": 5, "ray-node": self.ray_node}


def test_the_preflight_counts_the_ray_nodes_the_clients_ran_on_and_the_summary_keeps_them():
    fleet = FakeFleet(*(RayNode(str(cid), node) for cid, node in enumerate(["ray-a", "ray-b", "ray-a", "ray-a",
                                                                             "ray-b"])))  # fmt: skip
    strategy = FederatedStrategy(settings=settings(strategy="fedavg", min_available_clients=5),
                      initial_model=[np.zeros(3, dtype=np.float32)])  # fmt: skip
    start_run(strategy, fleet)
    assert strategy.nodes.ray_nodes() == {"ray-a": 3, "ray-b": 2}
    summary = strategy.summary("completed")
    assert summary["ray-nodes"] == {"ray-a": 3, "ray-b": 2}
    assert [entry["ray-node"] for entry in summary["nodes"]] == ["ray-a", "ray-b", "ray-a", "ray-a", "ray-b"]


def test_outside_ray_no_ray_node_is_reported():
    from clients.runtime import ray_node

    strategy = FederatedStrategy(settings=settings(strategy="fedavg", min_available_clients=3),
                      initial_model=[np.zeros(3, dtype=np.float32)])  # fmt: skip
    start_run(strategy, FakeFleet(*(RayNode(str(cid), "") for cid in range(3))))
    assert strategy.nodes.ray_nodes() == {} and "ray-nodes" not in strategy.summary("completed")
    assert ray_node() == ""  # this test process has started no Ray


class OneGrid:
    """A grid that answers every query message at once, and counts the pushes."""

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.calls = failing, []

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import ConfigRecord, Error, Message, RecordDict

        messages = list(messages)
        self.calls.append(len(messages))
        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            message.metadata.__dict__["_message_id"] = f"m{node}"  # what the grid's push would set
            if node in self.failing:
                reply = Message(Error(code=0, reason=f"client {node} crashed"), reply_to=message)
            else:
                answer = {"partition-id": node - 100, "num-partitions": 0, **code_identity()}
                reply = Message(RecordDict({"properties": ConfigRecord(answer)}), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = node
            replies.append(reply)
        return replies


def test_the_preflight_asks_every_node_behind_a_grid_in_one_push_and_reads_failures_as_flower_does(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    from strategies.flower.fleet import GridFleet

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # what a ServerApp process has
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)

    grid = OneGrid(failing={103})
    answers = GridFleet(grid=grid).ask([str(100 + i) for i in range(6)], {"server-round": 0}, reply_s=5)
    assert grid.calls == [6]  # one push of six messages, not six waits
    assert [a["partition-id"] for i, a in enumerate(answers) if i != 3] == [0, 1, 2, 4, 5]
    assert isinstance(answers[3], ValueError) and "client 103 crashed" in str(answers[3])


def test_every_declared_metric_is_summarised_as_declared_and_floats_are_never_truncated():
    from strategies.contracts.contract import Contract, Metric
    from strategies.contracts.ditto import CONTRACT as DITTO
    from strategies.contracts.fedavg import FedAvgSettings
    from strategies.rounds.records import fit_summary
    from strategies.screening.replies import Reply

    specs = [*FIT_METRICS, *DITTO.metrics, Metric("norm", "a float", 0.0, summary=("mean", "min", "max", "sum"))]
    replies = [Reply("a", 0, [], 10, {"train-loss": 0.5, "grad-evals": 4, "ditto-personal-loss": 0.25,
                                      "ditto-personal-rounds": 1, "norm": 0.7}),
               Reply("b", 1, [], 30, {"train-loss": 1.5, "grad-evals": 6, "ditto-personal-loss": 0.75,
                                      "ditto-personal-rounds": 2, "norm": 0.1})]  # fmt: skip
    out = fit_summary(replies, specs)
    assert out["examples"] == 40 and out["train-loss"] == pytest.approx((0.5 * 10 + 1.5 * 30) / 40)
    assert out["grad-evals"] == 10 and type(out["grad-evals"]) is int and out["hvp-evals"] == 0
    assert out["ditto-personal-loss"] == pytest.approx(0.625) and type(out["ditto-personal-loss"]) is float
    assert out["ditto-personal-rounds"] == 3
    assert (out["norm-min"], out["norm-max"]) == (0.1, 0.7) and out["norm-sum"] == pytest.approx(0.8)
    assert "partition-id" not in out  # declared as identification only (summary ())
    with pytest.raises(ValueError, match="summary .* must be distinct ones of"):
        Metric("x", "", summary=("median",))
    with pytest.raises(ValueError, match="declare no summary"):
        Contract(name="fedavg", summary="", settings=FedAvgSettings, uses=(), metrics=(Metric("x", "", summary=()),))


def test_the_global_model_is_summarised_only_where_the_replies_test_one():
    strategy, fleet, nodes, _ = make_strategy()
    configure_fit(strategy, 2, fleet)
    replies = [evaluation(n, 0.2, 10, {"accuracy": 0.9}) for n in nodes[:2]]  # clients with personal layers
    _, metrics = aggregate_evaluate(strategy, 2, replies)
    assert metrics["accuracy"] == pytest.approx(0.9) and "global-accuracy" not in metrics
    strategy.record.update({"round-seconds": 0.1})
    assert "global acc" not in progress_line(strategy.record, 3)


def test_begin_round_sees_the_chosen_partitions_before_any_message_is_built():
    calls = []

    class PerClient(FederatedStrategy):
        def begin_round(self, server_round, partitions, purpose):
            calls.append((server_round, list(partitions), purpose))
            self.payloads = {p: arrays(float(p)) for p in partitions}

        def parameters_for(self, partition, purpose):
            return self.payloads[partition]  # KeyError unless begin_round ran first

    strategy, fleet, nodes, _ = make_strategy(clients=3, eval_every=1)
    strategy.__class__ = PerClient
    instructions = configure_fit(strategy, 1, fleet)
    assert calls == [(1, [0, 1, 2], "fit")]
    for ins in instructions:
        np.testing.assert_array_equal(sent_arrays(ins)[0], float(fleet.nodes[ins.node].partition))
    # the update norms are measured from what each partition was sent
    aggregate_fit(strategy, 1, [fit_res(n, arrays(float(n.partition) + 1.0), 10) for n in nodes])
    assert strategy.record["update-norm-max"] == pytest.approx(np.sqrt(9))
    configure_evaluate(strategy, 1, fleet)
    assert calls[-1] == (1, [0, 1, 2], "evaluate")


def test_a_round_closed_without_a_fit_is_recorded_with_no_time_of_an_earlier_one():
    strategy, fleet, _, _ = make_strategy(num_rounds=3)
    configure_fit(strategy, 1, fleet)
    strategy.phases.open[1].started -= 100.0  # as if round 1's fit was configured long ago
    strategy.end_round(1)
    strategy.end_round(2)
    first, second = strategy.history
    assert first["round"] == 1 and first["round-seconds"] >= 100.0
    assert second["round"] == 2 and second["round-seconds"] < 50.0
