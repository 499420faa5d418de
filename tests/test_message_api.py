"""The round engine on Flower's Message API: records, failures, screens, subclasses, wrappers, removed keys.

Runs go through a Flower ``Grid`` whose nodes answer with stamen's ClientApp in this
process (``app.local.message_grid``), every message through Flower's wire encoding.
Every method's records against those kept before the engine changed: tests/test_method_records.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Error
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
from helpers import CLIENTS, config_of, message_run, records

from app.client_app import app as stamen_client_app
from app.config import ConfigError
from app.local.message_grid import InProcessGrid, wired
from app.message_methods import message_strategy
from app.registry import METHODS
from strategies.contracts.payload import to_bytes
from strategies.flower.codec import (
    MessageFormatError,
    instruction,
    read_instruction,
    read_reply,
    reply,
)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_records_every_round_with_its_evaluation_and_the_servers_test(name, tmp_path):
    config = config_of(name, tmp_path, "message")
    message_run(config)
    rounds = records(tmp_path, "message")
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert "eval-clients" in rounds[-1]  # the clients' evaluation ran, and the server's own test where it can
    assert ("central-loss" in rounds[-1]) == config["central-eval"]
    assert all(r["clients-succeeded"] == r["clients-sampled"] for r in rounds)


@pytest.mark.parametrize("key", ["api", "server-threads"])
def test_a_run_config_naming_a_removed_key_is_refused_in_one_line_saying_what_replaced_it(key, tmp_path):
    config = config_of("fedavg", tmp_path, "removed", **{key: "legacy" if key == "api" else 64})
    with pytest.raises(ConfigError, match=f"run config key '{key}' was removed: .*drop the key") as refused:
        message_strategy("fedavg")(run_config=config)
    assert "\n" not in str(refused.value)


def test_arrays_travel_by_name_and_each_set_in_its_own_record():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32), np.zeros(4, np.int64)]
    tensors = [to_bytes(a) for a in arrays]
    content = instruction(tensors, {"lr": 0.1, "payload": "model:2 control:1"}, names=("fc.weight", "fc.bias"))
    received = wired(Message(content=content, dst_node_id=5, message_type="train")).content
    assert list(received.array_records["arrays"].keys()) == ["fc.weight", "fc.bias"]
    assert list(received.array_records["control"].keys()) == ["0"]
    assert received.array_records["arrays"]["fc.weight"].shape == (2, 3)
    assert received.array_records["control"]["0"].dtype == "int64"
    np.testing.assert_array_equal(received.array_records["arrays"].to_torch_state_dict()["fc.weight"].numpy(),
                                  arrays[0])  # a template's reading of the model works  # fmt: skip
    read, config, names = read_instruction(received)
    assert read == tensors and config == {"lr": 0.1, "payload": "model:2 control:1"}
    assert names == ["fc.weight", "fc.bias"]
    with pytest.raises(MessageFormatError, match="names 3 arrays, the message holds 2"):
        instruction(tensors[:2], {"payload": "model:2 control:1"})


def test_a_reply_carries_numbers_as_metrics_and_text_as_reports():
    tensor = to_bytes(np.ones(2, np.float32))
    content = reply([tensor], 7, {"train-loss": 0.5, "steps": np.int64(3), "ok": True, "note": "x",
                                  "payload": "model:1"}, names=["w"])  # fmt: skip
    assert dict(content.metric_records["metrics"]) == {"train-loss": 0.5, "steps": 3, "num-examples": 7}
    assert dict(content.config_records["reports"]) == {"ok": True, "note": "x"}
    tensors, num_examples, metrics, names = read_reply(wired(Message(content, dst_node_id=5, message_type="train"))
                                                       .content)  # fmt: skip
    assert (tensors, num_examples, names) == ([tensor], 7, ["w"])
    assert metrics == {"train-loss": 0.5, "steps": 3, "ok": True, "note": "x", "payload": "model:1"}
    with pytest.raises(MessageFormatError, match="reply's own keys"):
        reply([], 1, {"num-examples": 3})
    with pytest.raises(MessageFormatError, match="no 'metrics' MetricRecord"):
        read_reply(RecordDict({"arrays": ArrayRecord()}))


class HostileGrid(InProcessGrid):
    """In train: partition 1 is silent, 2 sends 1e30-sized arrays, 3 renames its arrays, 6 is lost (the SuperLink says).

    (Partition 0's ClientApp raises: :func:`raising_on_partition_0`.)
    """

    def push_messages(self, messages):
        self.dropped = []
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        replies = []
        for answer in super().pull_messages(message_ids):
            partition = answer.metadata.src_node_id - min(self.contexts)
            if answer.metadata.message_type != "train" or answer.has_error():
                replies.append(answer)
            elif partition == 1:
                continue  # silent: no reply comes back
            elif partition == 6:  # as Flower's SuperLink answers for a node it lost: an error from itself
                lost = Message(Error(code=0, reason="Node Unavailable"), reply_to=answer)
                lost.metadata.__dict__.update(_src_node_id=SUPERLINK_NODE_ID,
                                              _reply_to_message_id=answer.metadata.reply_to_message_id)
                replies.append(lost)
            elif partition in (2, 3):
                model = answer.content.array_records["arrays"]
                arrays = {(f"x{k}" if partition == 3 else k): Array(a.numpy() * np.float32(1e30))
                          for k, a in model.items()}  # fmt: skip
                answer.content["arrays"] = ArrayRecord(arrays)
                replies.append(answer)
            else:
                replies.append(answer)
        return replies


def raising_on_partition_0(message, context):
    if message.metadata.message_type == "train" and int(context.node_config["partition-id"]) == 0:
        raise RuntimeError("this node's disk is full")
    return stamen_client_app(message, context)


def test_failures_are_the_messages_sent_less_the_usable_replies(tmp_path):
    config = config_of("fedavg", tmp_path, "hostile", **{"num-server-rounds": 1, "fraction-fit": 1.0})
    grid = HostileGrid(run_config=config, num_clients=8, client_app=raising_on_partition_0)
    strategy = message_run(config, grid=grid)
    (record,) = records(tmp_path, "hostile")
    assert record["clients-sampled"] == 8 and record["clients-succeeded"] == 3
    assert record["clients-failed"] == 5 and record["clients-rejected"] == 1  # the 1e30 reply: screened out
    failures = " | ".join(record["fit-failures"])
    assert "this node's disk is full" in failures and "sent no reply within 3600 s" in failures
    assert failures.count("sent no reply") == 1 and "Node Unavailable" in failures  # the lost node: its own cause
    assert "unreadable reply" in failures and "xlayers.1.weight" in failures  # renamed arrays are named, not averaged
    labels = " ".join(c for group in record["fit-failure-groups"] for c in group["clients"])
    assert all(f"partition {p}" in labels for p in (0, 1, 3, 6))  # each failure names its node
    model = strategy.global_arrays
    assert all(np.all(np.isfinite(a.numpy())) and np.abs(a.numpy()).max() < 1e3 for a in model.values())


class PerClientSteps(message_strategy("fedavg")):
    """Flower's tutorial move: override configure_train to set a per-client config value."""

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for message in messages:
            partition = message.content["config"]["partition-id"]
            message.content["config"]["local-steps"] = 1 + partition % 2
        return messages


def test_a_subclass_overriding_configure_train_changes_what_each_client_does(tmp_path):
    config = config_of("fedavg", tmp_path, "steps", **{"num-server-rounds": 2, "fraction-fit": 1.0})
    message_run(config, strategy_class=PerClientSteps)
    for record in records(tmp_path, "steps"):
        assert record["clients-succeeded"] == CLIENTS
        assert record["client-steps"] == 1 + 2 + 1 + 2  # the clients ran the steps they were sent, not 2 each
        assert record["hp-local-steps"] == 2  # the record keeps stamen's value in force


def test_flowers_differential_privacy_wrapper_clips_what_a_stamen_strategy_aggregates(tmp_path):
    def moved(run_name: str, noise: float | None) -> float:
        config = config_of("fedavg", tmp_path, run_name, **{"num-server-rounds": 2, "fraction-fit": 1.0})
        strategy = message_strategy("fedavg")(run_config=config)
        start = [a.numpy() for a in strategy.global_arrays.values()]
        grid = InProcessGrid(run_config=config, num_clients=CLIENTS)
        if noise is None:
            strategy.start(grid=grid)
        else:  # Flower's own start, as every wrapper runs it
            wrapper = DifferentialPrivacyServerSideFixedClipping(strategy, noise_multiplier=noise, clipping_norm=1e-3,
                                                                 num_sampled_clients=CLIENTS)  # fmt: skip
            wrapper.start(grid=grid, initial_arrays=strategy.global_arrays, num_rounds=2)
        assert [r["round"] for r in records(tmp_path, run_name)] == [1, 2]  # the rounds are closed and recorded
        end = [a.numpy() for a in strategy.global_arrays.values()]
        return float(np.sqrt(sum(np.sum((e - s) ** 2) for e, s in zip(end, start, strict=True))))

    free, clipped = moved("free", None), moved("clipped", 0.0)
    assert clipped <= 2 * 1e-3 * (1 + 1e-4) < free  # two rounds of updates clipped to norm 1e-3
    assert moved("noised", 5.0) != pytest.approx(clipped, rel=1e-6)  # round 1's noise reached the model of round 2


def test_a_strategy_refuses_a_run_config_naming_another_method(tmp_path):
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="'strategy': 'scaffold' given to FedAvg"):
        message_strategy("fedavg")(run_config={"strategy": "scaffold", "results-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="is not a method"):
        message_strategy("fedavgg")


def test_start_refuses_initial_arrays_of_another_model(tmp_path):
    config = config_of("fedavg", tmp_path, "other", **{"num-server-rounds": 1})
    strategy = message_strategy("fedavg")(run_config=config)
    with pytest.raises(ValueError, match="initial_arrays are not the run's model"):
        strategy.start(grid=InProcessGrid(run_config=config, num_clients=CLIENTS),
                       initial_arrays=ArrayRecord({"w": Array(np.ones(3, np.float32))}))  # fmt: skip
    summary = json.loads((tmp_path / "other" / "summary.json").read_text())
    assert summary["status"] == "failed" and "initial_arrays" in summary["reason"]


def test_metrics_in_flowers_result_are_numbers(tmp_path):
    config = config_of("fedavg", tmp_path, "result", **{"num-server-rounds": 2, "eval-every": 1})
    strategy = message_strategy("fedavg")(run_config=config)
    result = strategy.start(grid=InProcessGrid(run_config=config, num_clients=CLIENTS),
                            evaluate_fn=lambda rnd, arrays: MetricRecord({"n": len(arrays)}),
                            train_config=ConfigRecord({"note": "mine"}))  # fmt: skip
    assert sorted(result.train_metrics_clientapp) == [1, 2] and sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert result.evaluate_metrics_serverapp[2]["n"] == len(strategy.global_arrays)
    assert list(result.arrays.keys()) == list(strategy.global_arrays.keys())


def test_every_method_is_a_flower_message_api_strategy_in_the_public_surface():
    from flwr.serverapp.strategy import Strategy

    import app.api

    for name, method in METHODS.items():
        strategy_class = message_strategy(name)
        assert strategy_class.__name__ == method.class_name and strategy_class.method == name
        assert issubclass(strategy_class, Strategy) and strategy_class.__name__ in app.api.__all__
        assert getattr(app.api, strategy_class.__name__) is strategy_class


class LostNodeGrid(InProcessGrid):
    """Every reply to partition 1 is the SuperLink's own: the node is lost (Flower's ``Node Unavailable``)."""

    def pull_messages(self, message_ids):
        replies = []
        for answer in super().pull_messages(message_ids):
            if answer.metadata.src_node_id - min(self.contexts) == 1:
                lost = Message(Error(code=0, reason="Node Unavailable"), reply_to=answer)
                lost.metadata.__dict__.update(_src_node_id=SUPERLINK_NODE_ID,
                                              _reply_to_message_id=answer.metadata.reply_to_message_id)
                answer = lost
            replies.append(answer)
        return replies


def test_the_preflight_reads_the_superlinks_reply_for_a_lost_node_as_that_nodes_failure(tmp_path):
    from strategies.flower.fleet import GridFleet

    grid = LostNodeGrid(run_config=config_of("fedavg", tmp_path, "lost"), num_clients=3)
    first, lost, third = GridFleet(grid=grid).ask([str(node) for node in grid.get_node_ids()], {}, 30)
    assert first["partition-id"] == 0 and third["partition-id"] == 2
    assert isinstance(lost, ValueError) and "Node Unavailable" in str(lost)  # not "sent no reply": it did not wait


def test_the_server_app_runs_the_run_config_on_the_grid(monkeypatch):
    from flwr.app import Context, RecordDict

    import app.server_app
    from app.own_parts import OwnParts

    ran = []
    monkeypatch.setattr(app.server_app, "run_on_grid", lambda grid, run_config, parts: ran.append(dict(run_config)))
    main = app.server_app.server_main(OwnParts())
    main(None, Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={"strategy": "fedavg"}))
    assert ran == [{"strategy": "fedavg"}]


def test_a_train_config_may_not_set_what_stamen_sets_per_message(tmp_path):
    config = config_of("fedavg", tmp_path, "reserved", **{"num-server-rounds": 1})
    strategy = message_strategy("fedavg")(run_config=config)
    with pytest.raises(ValueError, match=r"train_config may not set \['partition-id'\]"):
        strategy.start(grid=InProcessGrid(run_config=config, num_clients=CLIENTS),
                       train_config=ConfigRecord({"partition-id": 3}))  # fmt: skip
    summary = json.loads((tmp_path / "reserved" / "summary.json").read_text())
    assert summary["status"] == "failed" and "partition-id" in summary["reason"]
