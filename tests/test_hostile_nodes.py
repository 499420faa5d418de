"""A bad node leaves only itself out: answers that do not parse, claims of another's partition, forged log text.

A node's preflight answer is its word (DESIGN.md, trust boundaries). Each test drives the
preflight in process with stand-in nodes that answer as a stamen client does, one of them
answering badly, and checks that the server names that node in one line, leaves it out
and admits the others (issue 51).
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from conftest import FakeFleet, FakeNode, settings
from helpers import start_run

import strategies.nodes.directory as nodes_module
from strategies.base import FederatedStrategy
from strategies.nodes.data import data_lines
from strategies.nodes.directory import NodeDirectory
from strategies.nodes.preflight import PreflightError, connected, preflight

GOOD = {"num-train": 40, "num-test": 10, "train-classes": "0:25 3:15", "test-classes": "0:4 3:6", "data-dir": "",
        "ray-node": ""}  # fmt: skip
DROP = object()  # an override that takes the key out of the answer
FORGED = "\n2031-01-01 INFO preflight: all is well\x1b[2K\x1b[31m\u202e"  # a forged log line, ANSI, a bidi override


class AnsweringNode(FakeNode):
    """A node answering the preflight as a stamen client does, with ``answer``'s keys replacing its own."""

    def __init__(self, cid: str, partition: int | None = None, **answer: object) -> None:
        super().__init__(cid, partition)
        self.answer = {key.replace("_", "-"): value for key, value in answer.items()}

    def get_properties(self, config):
        properties = {**super().get_properties(config), **GOOD, **self.answer}
        return {k: v for k, v in properties.items() if v is not DROP}


def good_nodes(count: int = 5) -> list[AnsweringNode]:
    return [AnsweringNode(str(cid)) for cid in range(count)]


def strategy() -> FederatedStrategy:
    return FederatedStrategy(settings=settings(strategy="fedavg"), initial_model=[])


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


BAD = [
    ("partition-id", "abc"),
    ("partition-id", -7),
    ("partition-id", True),  # a bool is not a number here (True would claim partition 1)
    ("partition-id", 2.0),
    ("num-partitions", "4"),
    ("num-partitions", -3),
    ("num-train", "x"),
    ("num-train", -5),
    ("num-train", 40.0),
    ("num-train", False),
    ("num-test", -1),
    ("num-test", "10"),
    ("train-classes", "0:25 3:x"),
    ("train-classes", "0:25 3"),
    ("train-classes", "0:25 3:-15"),
    ("train-classes", "0:20 0:20"),  # one class counted twice
    ("train-classes", "0:25 3:16"),  # 41 examples, more than its num-train 40
    ("train-classes", 40),
    ("test-classes", "\u0663:1"),  # an Arabic-Indic digit three, which int() would take
    ("test-classes", "0:9 3:9"),  # 18, more than its num-test 10
    ("data-dir", b"/data/device"),
    ("ray-node", 7),
]


@pytest.mark.parametrize(("key", "value"), BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_an_answer_that_does_not_parse_leaves_that_node_out_in_one_line_and_admits_the_others(key, value):
    nodes = NodeDirectory()
    left_out = preflight(nodes, FakeFleet(*good_nodes(), AnsweringNode("9", partition=5, **{key: value})), {})
    assert isinstance(left_out, PreflightError)
    [line] = left_out.lines
    assert line.startswith(f"1 of 6 clients (node 9): property {key!r} is "), line
    assert set(nodes.excluded) == {"9"} and nodes.excluded["9"] in line
    assert sorted(nodes.properties) == ["0", "1", "2", "3", "4"]
    assert [nodes.partition_of(cid) for cid in sorted(nodes.properties)] == [0, 1, 2, 3, 4]


def test_a_partition_outside_the_declared_partitions_is_refused():
    nodes = NodeDirectory()
    good = [AnsweringNode(str(cid), num_partitions=4) for cid in range(4)]
    left_out = preflight(nodes, FakeFleet(*good, AnsweringNode("9", partition=7, num_partitions=4)), {})
    assert left_out.lines == ["1 of 5 clients (node 9): property 'partition-id' is 7: outside the 4 partitions the "
                              "node declares (num-partitions)"]  # fmt: skip
    assert sorted(nodes.properties) == ["0", "1", "2", "3"]


def test_the_run_goes_on_with_one_warning_line_naming_the_node_and_the_property(caplog):
    run = strategy()
    fleet = FakeFleet(*good_nodes(), AnsweringNode("9", partition=5, num_train="x"))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start_run(run, fleet)
    naming = [line for line in warnings_of(caplog) if "node 9" in line]
    assert naming == ["preflight: left out: 1 of 6 clients (node 9): property 'num-train' is 'x': not a count (an "
                      "integer of at least 0)"]  # fmt: skip
    assert sorted(connected(run.nodes, fleet)) == [0, 1, 2, 3, 4]
    summary = run.summary("completed")
    assert list(summary["nodes-left-out"]) == ["9"] and len(summary["nodes"]) == 5


def test_when_every_node_answers_badly_no_node_is_left_and_the_run_stops():
    with pytest.raises(PreflightError, match="no node is left to train"):
        preflight(NodeDirectory(), FakeFleet(AnsweringNode("1", num_train="x"), AnsweringNode("2", num_test=-2)), {})


def test_a_sampled_preflight_meeting_a_bad_answer_asks_every_node_and_leaves_the_bad_ones_out():
    # simulated slices (num-partitions = the nodes connected): two bad nodes of four, so a sample of three meets one
    fleet_nodes = [AnsweringNode(str(cid), num_partitions=4, **({"num_train": "x"} if cid >= 2 else {}))
                   for cid in range(4)]  # fmt: skip
    nodes = NodeDirectory()
    left_out = preflight(nodes, FakeFleet(*fleet_nodes), {}, sample=3)
    assert left_out.lines == ["2 of 4 clients (node 2, node 3): property 'num-train' is 'x': not a count (an "
                              "integer of at least 0)"]  # fmt: skip
    assert not nodes.sampled and sorted(nodes.properties) == ["0", "1"]


# ------------------------------------------------------------------------------------ two claims of one partition


def test_two_claims_of_one_partition_refuse_both_in_one_line_naming_both(caplog):
    run = strategy()
    fleet = FakeFleet(*good_nodes(3), AnsweringNode("7", partition=3), AnsweringNode("8", partition=3))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start_run(run, fleet)
    naming = [line for line in warnings_of(caplog) if "node 7" in line or "node 8" in line]
    assert naming == ["preflight: left out: 2 of 5 clients (node 7, node 8): partition 3 is claimed by 2 nodes; the "
                      "server cannot tell which holds it, so none of them takes part (give each node its own "
                      "partition-id)"]  # fmt: skip
    assert set(run.nodes.excluded) == {"7", "8"}
    assert sorted(connected(run.nodes, fleet)) == [0, 1, 2]


def test_without_a_preflight_two_new_claims_of_one_partition_are_refused_in_one_line(caplog):
    nodes = NodeDirectory()
    fleet = FakeFleet(*good_nodes(2), AnsweringNode("15", partition=1), AnsweringNode("16", partition=4),
                      AnsweringNode("17", partition=4))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="flwr"):
        served = connected(nodes, fleet)
    assert warnings_of(caplog) == [
        f"left out of the run: 2 of 5 clients (node {a}, node {b}): partition {p} is claimed by 2 nodes; the server "
        "cannot tell which holds it, so none of them takes part (give each node its own partition-id)"
        for p, a, b in ((1, 1, 15), (4, 16, 17))
    ]
    assert served == {0: "0"}
    assert set(nodes.excluded) == {"1", "15", "16", "17"}


def test_a_late_claim_of_a_served_partition_waits_until_the_node_serving_it_has_gone(caplog):
    nodes = NodeDirectory()
    first = good_nodes(3)
    preflight(nodes, FakeFleet(*first), {})
    late = AnsweringNode("44", partition=1)  # e.g. node 1's device restarted under a new node id
    with caplog.at_level(logging.WARNING, logger="flwr"):
        served = connected(nodes, FakeFleet(*first, late))
    assert served == {0: "0", 1: "1", 2: "2"}  # the node checked alone keeps it
    assert warnings_of(caplog) == ["node 44 is not admitted this round: partition 1 is served by node 1; this node is "
                                   "asked again later"]  # fmt: skip
    assert "44" not in nodes.properties and "44" not in nodes.excluded
    served = connected(nodes, FakeFleet(first[0], first[2], late))  # node 1 has gone
    assert served == {0: "0", 1: "44", 2: "2"}


# ------------------------------------------------------------------------------------ devices the server numbers


def devices(*pairs: tuple[str, str]) -> list[AnsweringNode]:
    return [AnsweringNode(cid, partition=-1, data_dir=folder) for cid, folder in pairs]


def test_devices_without_a_partition_are_numbered_by_node_id_not_by_the_folders_they_name():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(*devices(("30", "/data/a"), ("20", "/data/z"), ("100", "/data/m"))), {})
    assert {cid: nodes.partition_of(cid) for cid in ("20", "30", "100")} == {"20": 0, "30": 1, "100": 2}
    renamed = NodeDirectory()  # a device renaming its folder to sort first gains nothing
    preflight(renamed, FakeFleet(*devices(("30", "/data/z"), ("20", "/data/zz"), ("100", "/data/0"))), {})
    assert {cid: renamed.partition_of(cid) for cid in ("20", "30", "100")} == {"20": 0, "30": 1, "100": 2}


def test_devices_are_numbered_after_the_partitions_claimed():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(AnsweringNode("5", partition=1), *devices(("9", "/data/a"), ("8", "/data/b"))), {})
    assert {cid: nodes.partition_of(cid) for cid in ("5", "8", "9")} == {"5": 1, "8": 2, "9": 3}


# ------------------------------------------------------------------------------------ a node's strings in log lines


def no_control_characters(text: str) -> bool:
    return text.isprintable()


def test_a_labels_device_strings_are_escaped_and_cut():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(*devices(("3", "/data/x" + FORGED), ("4", "/data/" + "y" * 500))), {})
    forged, long = nodes.label("3"), nodes.label("4")
    assert no_control_characters(forged) and no_control_characters(long)
    assert forged.startswith("partition 0 (node 3, data-dir /data/x\\n2031-01-01 INFO preflight: all is well\\x1b")
    assert "\\u202e" in forged
    assert len(long) < 160 and long.endswith("...)")
    assert all(no_control_characters(line) for line in data_lines(nodes.data_report()))
    assert nodes.data_report()[0]["data-dir"] == "/data/x" + FORGED  # summary.json keeps the string (JSON escapes it)


def test_a_refused_nodes_strings_are_escaped_in_the_preflight_lines():
    faulty = AnsweringNode("6", partition=-1, data_dir="/data/d" + FORGED, preflight_error="bad" + FORGED,
                           preflight_scope="node")  # fmt: skip
    bad_value = AnsweringNode("7", partition="abc" + FORGED)
    left_out = preflight(NodeDirectory(), FakeFleet(*good_nodes(2), faulty, bad_value), {})
    assert len(left_out.lines) == 2 and all(no_control_characters(line) for line in left_out.lines)
    assert any(line.startswith("1 of 4 clients (data-dir /data/d\\n2031") for line in left_out.lines)
    assert any("(node 7): property 'partition-id' is 'abc\\n2031" in line for line in left_out.lines)


def test_a_ray_node_id_is_escaped_for_the_log_line():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(AnsweringNode("1", ray_node="abc" + FORGED)), {})
    [ray_node] = nodes.ray_nodes()
    assert no_control_characters(ray_node) and ray_node.startswith("abc\\n2031")


# ------------------------------------------------------------------------------------ declared(): typed counts


def test_declared_gives_the_checked_counts_with_class_indices_as_ints():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(*good_nodes(2), AnsweringNode("5", num_test=DROP, test_classes=DROP)), {})
    declared = nodes.declared("1")
    assert dataclasses.is_dataclass(declared) and type(declared) is nodes_module.Declared
    assert (declared.num_train, declared.num_test, declared.train_classes) == (40, 10, {0: 25, 3: 15})
    assert all(type(index) is int for index in declared.train_classes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        declared.num_train = 10**9
    undeclared = nodes.declared("5")
    assert (undeclared.num_train, undeclared.num_test, undeclared.train_classes) == (40, None, {0: 25, 3: 15})
    assert undeclared.test_classes is None
    with pytest.raises(KeyError):
        nodes.declared("99")  # never admitted


def test_a_node_without_class_counts_declares_none_and_a_device_keeps_its_counts_when_numbered():
    nodes = NodeDirectory()
    preflight(nodes, FakeFleet(AnsweringNode("2", train_classes=DROP), *devices(("8", "/data/a"))), {})
    assert nodes.declared("2").train_classes is None and nodes.declared("2").num_train == 40
    assert nodes.partition_of("8") == 3 and nodes.declared("8").train_classes == {0: 25, 3: 15}


def test_after_a_sampled_preflight_no_node_declares_anything():
    # each node serves the partition the server numbers it with, not the one it answered about
    fleet_nodes = [AnsweringNode(str(cid), num_partitions=4) for cid in range(4)]
    nodes = NodeDirectory()
    assert preflight(nodes, FakeFleet(*fleet_nodes), {}, sample=2) is None and len(nodes.sampled) == 2
    assert {cid: nodes.declared(cid) for cid in "0123"} == {cid: nodes_module.Declared() for cid in "0123"}


def test_a_node_known_from_a_checkpoint_declares_what_its_stored_answer_says():
    nodes = NodeDirectory()
    nodes.properties = {"3": {"partition-id": 3, "num-partitions": 0, "num-train": 12, "train-classes": "1:12"}}
    assert nodes.declared("3") == nodes_module.Declared(num_train=12, train_classes={1: 12})
