"""Failures grouped by cause: a hundred nodes failing alike make one line, whatever their ids."""

from __future__ import annotations

import logging

import pytest
from conftest import FakeFleet, FakeNode, settings
from helpers import aggregate_fit, configure_fit, start_run

from strategies.base import FederatedStrategy
from strategies.nodes.failure_groups import cause_of, group_by_cause
from strategies.nodes.failures import REPLY_S, no_reply, reply_seconds
from strategies.nodes.preflight import PreflightError

FLOWER = ("Message contains an Error (reason: <class 'flwr.common.ConfigError'>:<'run config key 'device': cuda is not "
          "available on node {node}'>). It originated during client-side execution of a message.")


def test_a_cause_is_the_text_without_node_ids_and_without_flowers_wrapping():
    first, second = cause_of(FLOWER.format(node=4471907135514394871)), cause_of(FLOWER.format(node=17))
    assert first == ("ConfigError: run config key 'device': cuda is not available on node <id> (raised in the "
                     "ClientApp)")  # fmt: skip
    assert second.endswith("on node 17 (raised in the ClientApp)")  # a short number is not a Flower node id
    assert cause_of("node 9123456789012345678 sent no reply") == "node <id> sent no reply"


def test_a_hundred_identical_failures_make_one_group_with_their_count():
    failures = [(f"node {i}", FLOWER.format(node=10**17 + i)) for i in range(100)]
    failures += [("node x", "ValueError: data-dir /d has no train/")]
    groups = group_by_cause(failures)
    assert [g["count"] for g in groups] == [100, 1]
    assert groups[0]["clients"] == [f"node {i}" for i in range(6)] + ["..."]


class SilentFleet(FakeFleet):
    """Nodes that never answer: each fails as a silent node behind the grid does, after the wait it was given."""

    def ask(self, cids, config, reply_s):
        self.asked.append(list(cids))
        self.waited = reply_s
        return [no_reply(reply_s, cid) for cid in cids]


class CudaNode(FakeNode):
    def get_properties(self, config):
        raise ValueError(FLOWER.format(node=10**17 + int(self.cid)))


def strategy_of(**config):
    return FederatedStrategy(settings=settings(strategy="fedavg", **config), initial_model=[])


@pytest.mark.parametrize("fleet_of", [FakeFleet, SilentFleet])
def test_a_preflight_of_a_hundred_nodes_failing_alike_says_so_in_one_line_and_keeps_the_group(fleet_of, caplog):
    strategy = strategy_of(preflight_timeout=7.0)
    fleet = fleet_of(*(CudaNode(str(i)) for i in range(100)))  # a SilentFleet's nodes never get to answer
    with caplog.at_level(logging.INFO), pytest.raises(PreflightError) as raised:
        start_run(strategy, fleet)
    assert len(raised.value.lines) == 1 and raised.value.lines[0].startswith("100 of 100 clients (node 0, node 1")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("preflight: 100 of 100")]
    assert len(lines) == 1, caplog.text
    groups = strategy.summary("failed")["failure-groups"]
    assert [(g["count"], g["asked"]) for g in groups] == [(100, 100)]
    if isinstance(fleet, SilentFleet):
        assert fleet.waited == 7.0  # the run's preflight-timeout
        assert groups[0]["cause"].startswith("sent no reply within 7 s (0 of 100 answered; run config key "
                                              "'preflight-timeout' sets the wait")  # fmt: skip
    else:
        assert "cuda is not available on node <id>" in groups[0]["cause"]


def test_the_default_wait_grows_with_the_nodes_asked():
    assert reply_seconds(0.0, 10) == reply_seconds(0.0, 100) == REPLY_S
    assert reply_seconds(0.0, 600) == REPLY_S + 2 * 500
    assert reply_seconds(45.0, 600) == 45.0


def test_fit_failures_of_many_clients_log_one_line_per_cause(caplog):
    strategy = strategy_of()
    configure_fit(strategy, 1, FakeFleet(*(FakeNode(str(i)) for i in range(3))))
    failures = [RuntimeError("CUDA error: out of memory")] * 40 + [TimeoutError("timed out")] * 2
    with caplog.at_level(logging.WARNING):
        aggregate_fit(strategy, 1, [], failures)
    lines = [r.getMessage() for r in caplog.records if "fit failed" in r.getMessage()]
    assert lines == ["round 1: fit failed on 40 client(s) (?, ?, ?, ?, ?, ?, ...): RuntimeError: CUDA error: out of "
                     "memory", "round 1: fit failed on 2 client(s) (?, ?): TimeoutError: timed out"]  # fmt: skip
    assert [g["count"] for g in strategy.record["fit-failure-groups"]] == [40, 2]
    assert len(strategy.record["fit-failures"]) == 42


class FailingGrid:
    """A grid whose every node replies with the error a ClientApp raising ``RuntimeError('no GPU')`` makes."""

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Error, Message

        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{message.metadata.dst_node_id}"  # what a push would set
            reply = Message(Error(code=0, reason="<class 'RuntimeError'>:<'no GPU'>"), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = message.metadata.dst_node_id
            replies.append(reply)
        return replies


def test_the_grid_transport_writes_a_clientapps_error_as_flower_does_and_the_groups_read_it_back(monkeypatch):
    from flwr.common import GetPropertiesIns
    from flwr.server.compat.grid_client_proxy import GridClientProxy  # Flower's own text, the reference
    from flwr.supercore.task_identity import TaskIdentity

    from strategies.flower.fleet import GridFleet

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # what a ServerApp process has
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    proxy = GridClientProxy(node_id=100, grid=FailingGrid(), run_id=1)
    with pytest.raises(ValueError) as flowers:
        proxy.get_properties(GetPropertiesIns(config={}), timeout=5, group_id=0)
    [ours] = GridFleet(grid=FailingGrid()).ask(["100"], {}, reply_s=5)
    assert isinstance(ours, ValueError) and str(ours) == str(flowers.value)  # a Flower upgrade that changes it fails
    assert cause_of(str(ours)) == "RuntimeError: no GPU (raised in the ClientApp)"
