"""FATHOM's tuner over any method (``tune = "fathom"``): the part, Per-FedAvg's phi, bad input.

The update rule itself is tested in ``tests/test_fathom.py``; here: which keys a tuned
method broadcasts, that the tuner moves exactly what ``fathom_update`` says, that a
tuned Per-FedAvg client's ``phi`` is the alignment of its meta-gradients (replayed
independently), and that a tuner no method can take stops the run at parse time.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import FakeFleet, FakeNode, settings
from helpers import aggregate_fit, configure_evaluate, configure_fit, received

from app.config import ConfigError, ignored_keys, parse_settings, tuned_keys
from app.local.inprocess import InProcessRun
from app.registry import METHODS
from clients.losses import axpy, model_loss
from clients.meta import meta_gradient
from clients.models import build_model
from clients.perfedavg import PerFedAvgClient
from clients.runtime import round_generator
from datasets import ClientData
from strategies.methods.perfedavg import PerFedAvgServer
from strategies.tuning.fathom_math import FathomState, RoundAggregate, cosine, fathom_update

SHAPES = [(2, 3), (3,)]


def tuned_perfedavg(**config):
    base = {"strategy": "perfedavg", "tune": "fathom", "perfedavg-beta": 0.05, "local-steps": 4, "batch-size": 8,
            "num-server-rounds": 3, "fraction-fit": 1.0, "min-fit-clients": 1, "min-available-clients": 1,
            "preflight": False}  # fmt: skip
    return parse_settings({**base, **config})


def test_each_method_names_what_the_tuner_moves():
    assert tuned_keys(tuned_perfedavg()) == {"step": "perfedavg-beta", "work": "local-steps", "batch": "batch-size"}
    fedavg = parse_settings({"strategy": "fedavg", "tune": "fathom"})
    assert tuned_keys(fedavg) == {"step": "lr", "work": "local-steps", "batch": "batch-size"}
    epochs = parse_settings({"strategy": "fedprox", "tune": "fathom", "local-epochs": 1.0})
    assert tuned_keys(epochs)["work"] == "local-epochs"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"strategy": "ditto", "tune": "fathom"},
         r"^run config key 'tune': strategy 'ditto' declares nothing tunable; tune one of \['fedavg', 'perfedavg', "),
        ({"strategy": "diffusion", "tune": "fathom", "dataset": "least-squares", "model": "linear",
          "partitioner": "natural"}, r"^run config key 'tune': strategy 'diffusion' declares nothing tunable"),
        ({"strategy": "fathom", "tune": "fathom", "local-epochs": 1.0},
         r"^run config key 'tune': strategy 'fathom' is already tuned"),
        ({"strategy": "perfedavg", "tune": "fathom", "fathom-steps-max": 2e6},
         r"^run config key 'fathom-steps-max': 2e\+06 is outside the range of 'local-steps', \[1, 1000000\]"),
        ({"strategy": "fedavg", "tune": "fathom", "fathom-batch-max": 2e6},
         r"^run config key 'fathom-batch-max': 2e\+06 is outside the range of 'batch-size'"),
        ({"strategy": "perfedavg", "tune": "fathom", "perfedavg-beta": 2.0},
         r"^run config key 'perfedavg-beta': the tuner starts at 2.0, outside \[fathom-lr-min, fathom-lr-max\]"),
        ({"strategy": "perfedavg", "tune": "fathom", "local-steps": 500},
         r"^run config key 'local-steps': the tuner starts at 500, outside \[fathom-steps-min, fathom-steps-max\]"),
        ({"strategy": "fathom", "local-epochs": 1.0, "fathom-step": "perfedavg-beta"},
         r"^run config key 'fathom-step': strategy 'fathom' tunes lr; got 'perfedavg-beta'"),
        ({"tune": "hyperband"}, r"'tune': 'hyperband' is not allowed; choose one of \['none', 'fathom'\]"),
        ({"strategy": "perfedavg", "tune": "fathom", "fathom-step": "lr"},
         r"^run config key 'fathom-step': 'lr' is not a step size perfedavg lets the tuner move; choose one of "
         r"\['', 'perfedavg-beta', 'perfedavg-alpha'\]"),
    ],
)  # fmt: skip
def test_a_tuner_no_method_can_take_stops_the_run_naming_the_key(config, message):
    with pytest.raises(ConfigError, match=message):
        parse_settings(config)


def test_a_held_dimension_is_neither_checked_nor_moved():
    run = tuned_perfedavg(**{"fathom-steps-max": 2e6, "fathom-gamma-epochs": 0.0, "local-steps": 500})
    assert tuned_keys(run)["work"] == "local-steps"  # accepted: gamma 0 holds local-steps at 500
    state, _ = fathom_update(FathomState(lr=0.1, epochs=500.0, batch_size=8.0),
                             RoundAggregate(update=np.ones(3), phis=np.array([0.3]), examples=np.ones(1)),
                             run.tuner, work_bounds=(1.0, 100.0))  # fmt: skip
    assert state.epochs == 500.0  # not clipped to the bound 100


def test_the_tuners_keys_are_not_reported_as_unused():
    config = {"strategy": "perfedavg", "tune": "fathom", "fathom-gamma-lr": 0.05}
    assert ignored_keys(config, parse_settings(config)) == {}
    untuned = {"strategy": "perfedavg", "fathom-gamma-lr": 0.05}
    assert "fathom-gamma-lr" in ignored_keys(untuned, parse_settings(untuned))


def strategy_with_clients(run, count):
    """A Per-FedAvg strategy from a zero model, and a fleet of ``count`` stand-in nodes: (strategy, fleet, nodes)."""
    strategy = PerFedAvgServer(settings=run, initial_model=zero_model())
    nodes = [FakeNode(str(i)) for i in range(count)]
    return strategy, FakeFleet(*nodes), nodes


def zero_model():
    return [np.zeros(s, np.float32) for s in SHAPES]


def fit_res(node, value, phi, examples=10):
    """``node``'s fit reply: every array ``value``, with ``phi``."""
    arrays = [np.full(s, value, np.float32) for s in SHAPES]
    return received(node, arrays, examples, {"phi": phi, "train-loss": 1.0})


def test_tuned_per_fedavg_broadcasts_beta_moves_it_by_fathoms_rule_and_rejects_replies_without_phi():
    run = tuned_perfedavg(**{"fathom-gamma-lr": 0.5, "fathom-safe-ascent": 0.0})  # FATHOM's own rule
    strategy, fleet, nodes = strategy_with_clients(run, 3)
    first, *_ = configure_fit(strategy, 1, fleet)
    assert first.config["perfedavg-beta"] == 0.05 and first.config["local-steps"] == 4.0
    assert first.config["batch-size"] == 8.0 and first.config["perfedavg-alpha"] == run.method.alpha

    # round 1: two replies average to 1 everywhere (uniform aggregation), one lacks phi
    no_phi = received(nodes[2], [np.full(s, 9.0, np.float32) for s in SHAPES], 10, {})
    _, metrics = aggregate_fit(strategy, 1, [fit_res(nodes[0], 0.5, 0.2), fit_res(nodes[1], 1.5, 0.6), no_phi])
    assert strategy.record["clients-rejected"] == 1
    assert metrics["H"] == 0.0 and metrics["G"] == pytest.approx(-0.4) and metrics["phi-mean"] == pytest.approx(0.4)
    strategy.end_round(1)
    # round 2: the global model moves back by half; H = -cos(update, smoothed) = 1 with the update reversed
    configure_fit(strategy, 2, fleet)
    _, metrics = aggregate_fit(strategy, 2, [fit_res(nodes[0], 0.5, 1.0), fit_res(nodes[1], 0.5, 1.0)])
    assert metrics["H"] == pytest.approx(1.0)
    tuner = run.tuner
    beta = 0.05 * math.exp(-0.5 * 0.0)  # round 1: H = 0
    beta = beta * math.exp(-0.5 * 1.0)  # round 2: H = 1
    steps = 4.0 * math.exp(-tuner.gamma_epochs * (0.0 - 0.4)) * math.exp(-tuner.gamma_epochs * (1.0 - 1.0))
    batch = 8.0 * math.exp(tuner.gamma_batch * -0.4) * math.exp(tuner.gamma_batch * -1.0)
    values = strategy.fit_config(3)
    assert values["perfedavg-beta"] == pytest.approx(beta)
    assert values["local-steps"] == pytest.approx(steps) and values["batch-size"] == pytest.approx(batch)
    assert strategy.record["hp-perfedavg-beta"] == pytest.approx(0.05)  # the record keeps round 2's value in force...
    strategy.end_round(2)
    assert strategy.history[1]["hp-perfedavg-beta"] == pytest.approx(0.05 * math.exp(0.0))  # ...as it was sent

    # a checkpoint keeps the tuner; a resumed strategy broadcasts the same values
    checkpoint = strategy.checkpoint(2)
    again = PerFedAvgServer(settings=run, initial_model=zero_model())
    again.resume(checkpoint)
    assert again.fit_config(3) == values


def test_a_tuner_moving_alpha_evaluates_with_the_alpha_in_force_and_records_it():
    run = tuned_perfedavg(**{"fathom-step": "perfedavg-alpha", "perfedavg-alpha": 0.01, "fathom-gamma-lr": 0.5,
                             "eval-every": 1})  # fmt: skip
    assert tuned_keys(run)["step"] == "perfedavg-alpha"
    strategy, fleet, nodes = strategy_with_clients(run, 2)
    for server_round, value in ((1, 1.0), (2, 0.5)):  # round 2 reverses round 1: H = 1, alpha falls
        ins, *_ = configure_fit(strategy, server_round, fleet)
        assert ins.config["perfedavg-beta"] == run.method.beta  # beta is held
        aggregate_fit(strategy, server_round, [fit_res(n, value, 0.5) for n in nodes])
        evaluation, *_ = configure_evaluate(strategy, server_round, fleet)
        assert evaluation.config["adapt-lr"] == strategy.tuner.values()["perfedavg-alpha"]
        assert strategy.record["eval-adapt-lr"] == evaluation.config["adapt-lr"]
        strategy.end_round(server_round)
    assert strategy.tuner.values()["perfedavg-alpha"] == pytest.approx(0.01 * math.exp(-0.5 * 1.0))


def test_a_tuned_per_fedavg_clients_phi_is_the_alignment_of_its_meta_gradients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(0, 3, 30).astype(np.int64)
    data = ClientData(x, y, x[:5], y[:5], num_classes=3)
    run = tuned_perfedavg(**{"perfedavg-alpha": 0.1, "perfedavg-variant": "hf", "perfedavg-outer-batch-size": 6,
                             "perfedavg-hessian-batch-size": 5, "model": "logreg", "device": "cpu",
                             "seed": 3})  # fmt: skip
    client = PerFedAvgClient(model=build_model("logreg", input_shape=(4,), num_classes=3), data=data, settings=run,
                             partition_id=2)  # fmt: skip
    start = [v.detach().numpy().copy() for v in build_model("logreg", input_shape=(4,), num_classes=3,
                                                            seed=9).state_dict().values()]  # fmt: skip
    # the server sends a real number of steps (the tuner's); the client rounds it (5.4 -> 5)
    config = {"server-round": 7, "perfedavg-beta": 0.3, "local-steps": 5.4, "batch-size": 8.0}
    new, _, metrics = client.fit(start, config)
    assert metrics["local-steps"] == 5

    # replay: the same batches (same generator), meta-gradients computed afresh, recorded, then phi by hand
    model = build_model("logreg", input_shape=(4,), num_classes=3)
    loss = model_loss(model)
    params = tuple(torch.as_tensor(a) for a in start)
    generator = round_generator(3, 2, 7, "fit")
    recorded = []
    for batches in client.meta_batches((8, 6, 5), 5, generator):
        meta = meta_gradient(loss, params, batches, alpha=0.1, variant="hf", delta=run.method.delta)
        recorded.append(np.concatenate([d.numpy().ravel() for d in meta.direction]).astype(np.float64))
        params = axpy(params, meta.direction, -0.3)
    expected = min(cosine(g, np.sum(recorded[: k + 1], axis=0)) for k, g in enumerate(recorded))
    assert metrics["phi"] == pytest.approx(expected, abs=1e-5)
    assert -1.0 <= expected < 0.999  # the steps are not all aligned: the check is not vacuous
    for got, want in zip(new, params, strict=True):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6)


def test_an_untuned_client_reports_no_phi():
    data = ClientData(np.ones((8, 2), np.float32), np.arange(8) % 2, np.ones((2, 2), np.float32), np.array([0, 1]),
                      num_classes=2)  # fmt: skip
    run = settings(strategy="perfedavg", batch_size=4, perfedavg_outer_batch_size=4, perfedavg_hessian_batch_size=4,
                   model="logreg", device="cpu")  # fmt: skip
    client = PerFedAvgClient(model=build_model("logreg", input_shape=(2,), num_classes=2), data=data, settings=run,
                             partition_id=0)  # fmt: skip
    _, _, metrics = client.fit(client.get_parameters({}), {})
    assert "phi" not in metrics


@pytest.mark.e2e
def test_a_tuned_simulation_broadcasts_and_records_its_trajectory(tmp_path, local_simulation):
    # Per-FedAvg with FATHOM's rule alone through flwr run: the hyperparameters travel in the fit config
    config = {"tune": "fathom", "perfedavg-beta": 0.1, "fathom-gamma-lr": 0.2, "num-server-rounds": 4,
              "eval-every": 4, "results-dir": str(tmp_path), "run-name": "tuned"}  # fmt: skip
    outcome = local_simulation.run(run_config=config, num_supernodes=10, timeout_s=300)
    assert outcome.ok, outcome.log_tail
    records = [json.loads(line) for line in (tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines()]
    betas = [r["hp-perfedavg-beta"] for r in records]
    assert betas[0] == 0.1 and len(set(betas)) > 1  # it moved
    assert all(-1 <= r["phi-mean"] <= 1 and "H" in r and "G" in r for r in records)
    assert (tmp_path / "tuned" / "tuning.png").stat().st_size > 0
    summary = json.loads((tmp_path / "tuned" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["settings"]["tune"] == "fathom"


# FedAvg and Per-FedAvg each with a 2-round start probe first and the stationarity test after it (FedAvg's started by
# the loss gate), and issue 39's rescue: the overshoot and setback tests behind a gate nearly open from the start
TRAJECTORIES = (
    {"strategy": "fedavg", "tune": "fathom", "lr": 0.01, "fathom-probe-rounds": 2, "fathom-probe-points": 3,
     "fathom-probe-factor": 10.0, "fathom-decay-window": 2, "fathom-decay-arm": 0.95, "num-server-rounds": 4,
     "eval-every": 4, "fraction-fit": 0.6},
    {"tune": "fathom", "perfedavg-beta": 0.1, "fathom-gamma-lr": 0.2, "fathom-probe-rounds": 2,
     "fathom-probe-points": 3, "fathom-decay-window": 2, "num-server-rounds": 7, "eval-every": 7, "fraction-fit": 0.6},
    {"strategy": "fedavg", "tune": "fathom", "lr": 0.1, "fathom-gamma-lr": 0.2, "fathom-decay-window": 2,
     "fathom-decay-test": "overshoot", "fathom-setback": 0.5, "fathom-decay-arm": 0.99, "num-server-rounds": 6,
     "eval-every": 6, "fraction-fit": 0.6},
)  # fmt: skip


def played(config: dict) -> list[dict]:
    """The records of a run of ``config`` on 10 nodes, played in process round by round as Flower's server plays it."""
    run = InProcessRun(run_config=config, num_clients=10)
    return [run.play_round() for _ in range(int(config["num-server-rounds"]))]


def test_a_start_probe_hands_its_choice_to_the_tuner_and_the_gate_and_decays_follow_the_rule():
    probed, decayed, rescued = (played(config) for config in TRAJECTORIES)
    # the probe: rounds 1-2 try lr 0.001, 0.01 and 0.1 and report their tally; round 3 starts from the choice
    assert [r.get("probe-round") for r in probed] == [1.0, 2.0, None, None]
    factor = probed[1]["probe-factor"]
    assert factor in (0.1, 1.0, 10.0) and 0 < probed[1]["probe-rho"] < 2
    assert probed[0]["hp-lr"] == probed[1]["hp-lr"] == 0.01
    assert probed[2]["hp-lr"] == pytest.approx(0.01 * factor)  # the probe's choice is the tuner's start
    assert all("start-loss" in r for r in probed)
    assert [r.get("lr-decays") for r in probed] == [None, None, 0.0, 0.0]  # round 3 has no H, round 4 one value
    # the gate: round 3's loss is the first; round 4 opens it if its loss is at most 0.95 of that
    assert [r.get("decay-armed") for r in probed] == [None, None, 0.0,
                                                      float(probed[3]["start-loss"] <= 0.95 * probed[2]["start-loss"])]
    # Per-FedAvg: the probe's choice starts the rule; after it every round's beta is the last one moved by
    # exp(-gamma H), then halved once per decay the stationarity test made (window 2, then 4)
    betas = [r["hp-perfedavg-beta"] for r in decayed]
    assert [r.get("probe-round") for r in decayed[:2]] == [1.0, 2.0]
    assert betas[2] == pytest.approx(0.1 * decayed[1]["probe-factor"])
    decays = [r["lr-decays"] for r in decayed[2:]]
    assert decays == sorted(decays) and decays[0] == 0 and set(decays) <= {0.0, 1.0, 2.0}
    for before, after, previous in zip(decayed[2:-1], decayed[3:], [0.0, *decays], strict=False):
        halvings = before["lr-decays"] - previous
        expected = before["hp-perfedavg-beta"] * math.exp(-0.2 * before["H"]) / 2**halvings
        assert after["hp-perfedavg-beta"] == pytest.approx(expected)
    # the rescue: each round's lr is the last one moved by exp(-gamma H), halved once per decay and per setback
    assert all("lr-setbacks" in r and "lr-decays" in r and "decay-armed" in r for r in rescued)
    previous = [{"lr-decays": 0.0, "lr-setbacks": 0.0}, *rescued]
    for earlier, before, after in zip(previous, rescued, rescued[1:], strict=False):
        halvings = sum(before[key] - earlier[key] for key in ("lr-decays", "lr-setbacks"))
        assert after["hp-lr"] == pytest.approx(before["hp-lr"] * math.exp(-0.2 * before["H"]) / 2**halvings)


def test_a_probe_round_sends_each_slot_its_step_and_the_model_takes_the_middle_slot_alone():
    run = tuned_perfedavg(**{"fathom-probe-rounds": 1, "fathom-probe-points": 3, "fathom-probe-factor": 2.0,
                             "fraction-fit": 1.0})  # fmt: skip
    strategy, fleet, nodes = strategy_with_clients(run, 3)
    instructions = configure_fit(strategy, 1, fleet)
    betas = {int(ins.config["partition-id"]): ins.config["perfedavg-beta"] for ins in instructions}
    chosen = strategy.record["fit-partitions"]  # in sampling order: slots 1, 2, 0 in round 1
    assert [betas[p] for p in chosen] == pytest.approx([0.05, 0.1, 0.025])
    assert strategy.record["hp-perfedavg-beta"] == 0.05  # the record keeps the value in force
    by_partition = {node.partition: node for node in nodes}
    # the middle slot (beta 0.05) replies 1.0; the others 7.0 and 9.0; only the middle reaches the model
    values = {chosen[0]: (1.0, 3.0), chosen[1]: (7.0, 2.0), chosen[2]: (9.0, 3.9)}
    results = [received(by_partition[p], [np.full(s, v, np.float32) for s in SHAPES], 10,
                        {"phi": 0.0, "train-loss": loss, "start-loss": 4.0, "partition-id": p})
               for p, (v, loss) in values.items()]  # fmt: skip
    _, metrics = aggregate_fit(strategy, 1, results)
    assert all(np.all(a == 1.0) for a in strategy.global_model)
    # rho: 0.75 (middle), 0.5 (x2), 0.975 (x0.5): the tuner starts from beta 0.1
    assert metrics["probe-factor"] == 2.0 and metrics["probe-rho"] == pytest.approx(0.5)
    assert strategy.fit_config(2)["perfedavg-beta"] == pytest.approx(0.1)


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.contract.tunable is not None and n != "fathom"])
def test_every_method_that_declares_itself_tunable_runs_under_the_tuner(name):
    # a contract's Tunable is a promise: the tuner reads the method's global update and its replies' phi each round
    from app.local.inprocess import InProcessRun

    example = METHODS[name].contract.example
    config = {**example, "tune": "fathom", "fraction-fit": 1.0, "local-steps": 2, "batch-size": 4,
              "adapt-batch-size": 4, "min-available-clients": 4, "perfedavg-outer-batch-size": 4,
              "perfedavg-hessian-batch-size": 4, "num-server-rounds": 3, "fathom-batch-min": 2.0}  # fmt: skip
    run = InProcessRun(run_config=config, num_clients=4)
    step = tuned_keys(run.settings)["step"]
    start = run.strategy.tuner.values()[step]
    for _ in range(3):
        metrics = run.step()
        assert run.strategy.record["clients-succeeded"] == 4
    assert math.isfinite(metrics["H"]) and math.isfinite(metrics["phi-mean"])
    assert run.strategy.tuner.values()[step] != start  # it moved the step size


def test_fedproto_is_refused_by_the_tuner_it_has_no_global_model_to_read():
    # no model travels: the tuner's hypergradient is the global model's update, which FedProto does not have
    with pytest.raises(ConfigError, match=r"^run config key 'tune': strategy 'fedproto' declares nothing tunable"):
        parse_settings({**METHODS["fedproto"].contract.example, "tune": "fathom"})
