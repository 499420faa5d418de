"""Hostile replies, tried in-process through Flower's encoding: each is refused, the run goes on, the model stays sane.

Every probe here broke or poisoned a run on the code before the screen compared replies
with what the server sent (issue 51): an integer reply, a float64 1e300 one, a set of
control variates or counts far out of scale, a claimed example count of 2**62, a metric
that is a string. Each test runs real clients on the embedded data (``InProcessRun``)
with one of them replaced, at the reply, by an attacker.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from app.config import ConfigError, parse_settings
from app.local.inprocess import InProcessRun
from app.registry import CONTRACTS
from strategies.contracts.fedproto import COUNTS
from strategies.contracts.payload import LAYOUT, pack, unpack
from strategies.flower.codec import LOSS, METRICS_RECORD, NUM_EXAMPLES, REPORTS_RECORD

BASE = {"dataset": "mnist-5k", "num-server-rounds": 3, "fraction-fit": 1.0, "min-fit-clients": 1,
        "min-available-clients": 1, "local-steps": 2, "batch-size": 16, "eval-every": 1, "lr": 0.05}  # fmt: skip
CLIENTS = 4


def run_of(clients: int = CLIENTS, **config) -> InProcessRun:
    return InProcessRun(run_config={**BASE, **{k.replace("_", "-"): v for k, v in config.items()}},
                        num_clients=clients)  # fmt: skip


def hostile_fit(run: InProcessRun, partition: int, transform, honest: list | None = None) -> None:
    """Make ``partition`` answer every fit with ``transform(sets, sent, num, metrics) -> (sets, num, metrics)``.

    ``sets`` are the honest reply's array sets by name (``model`` first); the honest
    replies' models are appended to ``honest`` when given.
    """
    client = run.clients[partition]
    answer = client.fit

    def fit(parameters, config):
        arrays, num, metrics = answer(parameters, config)
        metrics = dict(metrics)
        sets = unpack(list(arrays), metrics.get(LAYOUT))
        if honest is not None:
            honest.append([a.copy() for a in sets["model"]])
        sets, num, metrics = transform(sets, list(parameters), num, metrics)
        arrays, layout = pack(sets)
        return arrays, num, {**metrics, LAYOUT: layout}

    client.fit = fit


def hostile_evaluate(run: InProcessRun, partition: int, transform) -> None:
    """Make ``partition`` answer every evaluation with ``transform(loss, num, metrics) -> (loss, num, metrics)``."""
    client = run.clients[partition]
    answer = client.evaluate

    def evaluate(parameters, config):
        return transform(*answer(parameters, config))

    client.evaluate = evaluate


def hostile_reply(run: InProcessRun, partition: int, message_type: str, content: RecordDict) -> None:
    """Make ``partition``'s node answer every ``message_type`` message with ``content``, as no stamen client would."""
    client_app = run.grid.client_app

    def answer(message: Message, context: Context) -> Message:
        if message.metadata.message_type == message_type and context.node_config["partition-id"] == partition:
            return Message(content=content, reply_to=message)
        return client_app(message, context)

    run.grid.client_app = answer


def record_honest(run: InProcessRun, partition: int, into: list) -> None:
    hostile_fit(run, partition, lambda sets, sent, num, metrics: (sets, num, metrics), honest=into)


def global_model(run: InProcessRun) -> list[np.ndarray]:
    return [a.copy() for a in run.global_model]


def assert_sane(run: InProcessRun) -> None:
    for array in global_model(run):
        assert array.dtype == np.float32 or np.issubdtype(array.dtype, np.integer)
        assert np.all(np.isfinite(array)) and np.abs(array).max() < 1e3


# ------------------------------------------------------------------ the model's arrays


def as_integers(sets, sent, num, metrics):
    model = [np.round(a).astype(np.int64) for a in sets["model"]]
    model[0].flat[0] = 2**62
    return {**sets, "model": model}, num, metrics


@pytest.mark.parametrize("attacker", [0, 3])  # the lowest partition once set the global model's dtype
def test_an_integer_reply_is_refused_and_the_others_are_averaged_exactly(attacker, caplog):
    run = run_of(max_update_ratio=3.0)
    honest = {p: [] for p in range(CLIENTS)}
    for partition in range(CLIENTS):
        if partition != attacker:
            record_honest(run, partition, honest[partition])
    hostile_fit(run, attacker, as_integers)
    sent = global_model(run)
    with caplog.at_level(logging.WARNING):
        run.step()
    assert run.strategy.record["clients-rejected"] == 1
    assert "model array 0 is int64, the server sent float32" in caplog.text
    # the average of the three honest replies, computed here in float64
    others = [honest[p][0] for p in range(CLIENTS) if p != attacker]
    expected = [np.mean(np.stack(layer).astype(np.float64), axis=0) for layer in zip(*others, strict=True)]
    for got, want, before in zip(global_model(run), expected, sent, strict=True):
        assert got.dtype == before.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.complex128, np.float64])
def test_a_reply_of_another_float_dtype_never_sets_the_global_models_dtype(dtype, caplog):
    def retyped(sets, sent, num, metrics):
        model = [a.astype(dtype) for a in sets["model"]]
        if dtype == np.float64:  # finite in float64, inf once cast to the float32 model
            model[0][...] = 1e300
        return {**sets, "model": model}, num, metrics

    run = run_of()  # the default max-update-ratio
    hostile_fit(run, 0, retyped)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            run.step()
    assert f"is {np.dtype(dtype)}, the server sent float32" in caplog.text
    assert_sane(run)


def test_the_default_config_survives_a_1e300_reply_every_round_to_the_end():
    def huge(sets, sent, num, metrics):
        return {**sets, "model": [np.full(a.shape, 1e300) for a in sets["model"]]}, num, metrics

    run = run_of(num_server_rounds=4, eval_every=4)
    hostile_fit(run, 2, huge)
    for _ in range(4):
        run.step()
        run.strategy.end_round(run.round)  # the divergence watch runs here: it must not stop the run
    assert [r["clients-rejected"] for r in run.strategy.history] == [1, 1, 1, 1]
    assert_sane(run)


def test_fedamp_sends_every_client_a_finite_cloud_model_after_a_1e300_reply():
    def huge(sets, sent, num, metrics):
        return {**sets, "model": [np.full(a.shape, 1e300) for a in sets["model"]]}, num, metrics

    run = run_of(strategy="fedamp")
    hostile_fit(run, 1, huge)
    for _ in range(2):
        run.step()
    run.strategy.begin_round(3, list(range(CLIENTS)), "fit")
    for partition in range(CLIENTS):
        assert all(np.all(np.isfinite(a)) for a in run.strategy.parameters_for(partition, "fit"))


def test_finite_replies_whose_combination_overflows_keep_the_previous_model(caplog):
    # SCAFFOLD with eta_g = 2 extrapolates x + 2 (avg - x): float32 replies near their largest value overflow
    def near_max(sets, sent, num, metrics):
        return {**sets, "model": [np.full(a.shape, 3e38, np.float32) for a in sets["model"]]}, num, metrics

    run = run_of(strategy="scaffold", scaffold_server_lr=2.0, max_update_ratio=0.0)
    before = global_model(run)
    for partition in range(CLIENTS):
        hostile_fit(run, partition, near_max)
    with caplog.at_level(logging.WARNING):
        run.step()
    assert "the combined model holds non-finite values" in caplog.text
    assert run.strategy.record["aggregate-nonfinite"] == 1
    for got, want in zip(global_model(run), before, strict=True):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ the sets beside the model


def test_scaffold_refuses_an_outsized_delta_control_and_c_stays_small(caplog):
    def huge_control(sets, sent, num, metrics):
        return {**sets, "delta-control": [np.full(a.shape, 1e30, np.float32) for a in sets["delta-control"]]}, num, \
            metrics

    run = run_of(strategy="scaffold")  # the default max-update-ratio
    hostile_fit(run, 0, huge_control)
    with caplog.at_level(logging.WARNING):
        run.step()
    assert "'delta-control' norm" in caplog.text and run.strategy.record["clients-outsized"] == 1
    norm = float(np.sqrt(sum(float(np.vdot(c, c)) for c in run.strategy.control)))
    assert np.isfinite(norm) and norm < 1e3


@pytest.mark.parametrize("counts", ["negative", "overflowing", "fractional"])
def test_fedproto_refuses_counts_a_node_cannot_have(counts, caplog):
    def bad_counts(sets, sent, num, metrics):
        value = {"negative": -5.0, "overflowing": 3e38, "fractional": 0.5}[counts]
        return {**sets, COUNTS: [np.full(sets[COUNTS][0].shape, value, np.float32)]}, num, metrics

    run = run_of(strategy="fedproto")
    hostile_fit(run, 0, bad_counts)
    with caplog.at_level(logging.WARNING):
        run.step()
    assert f"array set {COUNTS!r}" in caplog.text and run.strategy.record["clients-rejected"] == 1
    assert np.all(run.strategy.counts >= 0) and np.all(np.isfinite(run.strategy.counts))
    assert run.strategy.counts.sum() <= sum(len(c.train_y) for c in run.clients)
    assert np.all(np.isfinite(run.strategy.prototypes))


# ------------------------------------------------------------------ claims


def test_a_claim_of_2_62_examples_is_refused_in_fit_and_in_evaluation(caplog):
    def claims(sets, sent, num, metrics):
        return sets, 2**62, metrics

    run = run_of(aggregation="examples")
    hostile_fit(run, 0, claims)
    hostile_evaluate(run, 0, lambda loss, num, metrics: (0.0, 2**62, {**metrics, "accuracy": 1.0}))
    with caplog.at_level(logging.WARNING):
        run.step()
        metrics = run.evaluate()
    assert "exceeds the" in caplog.text and "(num-train)" in caplog.text and "(num-test)" in caplog.text
    assert run.strategy.record["clients-rejected"] == 1 and metrics["eval-clients-failed"] == 1
    assert metrics["accuracy"] < 0.99


@pytest.mark.parametrize(
    ("where", "metrics"),
    [("fit", {"train-loss": "0.5"}), ("fit", {"grad-evals": True}), ("fit", {"grad-evals": 2**64 - 1}),
     ("evaluate", {"accuracy": "1.0"}), ("evaluate", {"accuracy": True})],
)
def test_a_declared_metric_that_is_not_a_number_is_refused(where, metrics, caplog):
    # 2**64 - 1: the largest count a reply can carry (Flower's MetricRecord holds up to uint64; 10**30 cannot travel)
    run = run_of()
    if where == "fit":
        hostile_fit(run, 0, lambda sets, sent, num, honest: (sets, num, {**honest, **metrics}))
    else:
        hostile_evaluate(run, 0, lambda loss, num, honest: (loss, num, {**honest, **metrics}))
    with caplog.at_level(logging.WARNING):
        run.step()
        summary = run.evaluate()
    assert f"rejected {where} reply from partition 0" in caplog.text
    if where == "evaluate":
        assert summary["eval-clients-failed"] == 1


def test_a_string_loss_in_evaluation_is_refused(caplog):
    # a stamen client's reply makes its loss a float; a hostile node can send the loss as text, among the reports
    run = run_of()
    hostile_reply(run, 1, MessageType.EVALUATE, RecordDict({METRICS_RECORD: MetricRecord({NUM_EXAMPLES: 10}),
                                                            REPORTS_RECORD: ConfigRecord({LOSS: "0.1"})}))
    run.step()
    with caplog.at_level(logging.WARNING):
        summary = run.evaluate()
    assert "loss '0.1' is a str, not a number" in caplog.text and summary["eval-clients-failed"] == 1


# ------------------------------------------------------------------ robust aggregation


def test_a_robust_aggregation_is_refused_by_a_method_that_combines_by_its_own_maths():
    for method in ("fedamp", "fedproto", "fathom", "diffusion"):
        with pytest.raises(ConfigError, match=r"'aggregation': 'median'.*takes 'examples' or 'uniform'"):
            parse_settings({**CONTRACTS[method].example, "aggregation": "median"})


def test_krum_keeps_the_model_nearest_its_neighbours_and_multi_krum_averages_the_best():
    from strategies.aggregation.rules import aggregate

    models = [[np.array([v], np.float32)] for v in (1.0, 1.1, 0.9, 1.05, 50.0)]
    # n = 5, f = 1: a score sums the n - f - 2 = 2 nearest squared distances: 1.05's is 0.05^2 + 0.05^2 = 0.005,
    # below 1.0's 0.0125, 1.1's 0.0125 and 0.9's 0.0325; multi-Krum keeps the n - f = 4 best, all but 50
    assert aggregate([[a.copy() for a in m] for m in models], [1.0] * 5, rule="krum", attackers=1)[0][0] == 1.05
    multi = aggregate([[a.copy() for a in m] for m in models], [1.0] * 5, rule="multi-krum", attackers=1)
    np.testing.assert_allclose(multi[0], [np.mean([1.0, 1.1, 0.9, 1.05])], rtol=1e-6)
    assert aggregate(models, [1.0] * 5, rule="median")[0][0] == np.float32(1.05)


def distance(first: list[np.ndarray], second: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.sum((a - b) ** 2.0)) for a, b in zip(first, second, strict=True))))


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum", "multi-krum", "centered-clip"])
def test_a_robust_rule_keeps_a_hundredfold_attacker_from_moving_the_model(rule):
    def scaled(sets, sent, num, metrics):
        return {**sets, "model": [s + 100 * (a - s) for a, s in zip(sets["model"], sent, strict=True)]}, num, metrics

    # six clients: f = 1 attacker is what Krum can bear (n >= 2f + 3); a fifth trimmed drops one value each side
    config = {"max_update_ratio": 0.0, "trim_fraction": 0.2, "clients": 6}
    runs = {name: run_of(aggregation=aggregation, **config)
            for name, aggregation in (("clean", "uniform"), ("mean", "uniform"), ("robust", rule))}  # fmt: skip
    for name in ("mean", "robust"):
        hostile_fit(runs[name], 0, scaled)
    for run in runs.values():
        run.step()
    clean = global_model(runs["clean"])
    pulled = distance(global_model(runs["mean"]), clean)  # about 100 / 6 times the attacker's honest update
    assert distance(global_model(runs["robust"]), clean) < 0.2 * pulled
