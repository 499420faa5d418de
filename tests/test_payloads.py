"""Array sets beside the model: declared in a contract, packed by name, screened set by set, handed to combine.

A toy method stands in for SCAFFOLD: its server sends ``anchor`` with every fit and
``probe`` with every evaluation, and its clients return ``echo`` (the anchor plus one).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

import numpy as np
import pytest
from conftest import FakeFleet, FakeNode, settings
from helpers import aggregate_fit, configure_evaluate, configure_fit, received, sent_arrays, start_run

from clients.base import TorchClient
from clients.models import build_model
from clients.training import TrainReport
from datasets import ClientData
from strategies.base import FederatedStrategy
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.payload import ArraySet, PayloadError, from_bytes, layout_of, pack, unpack


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToySettings(MethodSettings):
    prefix: ClassVar[str] = "toy"


TOY = Contract(
    name="toy", summary="sends and returns array sets", settings=ToySettings, uses=("lr", "local-steps", "batch-size"),
    sends=(ArraySet("anchor", "sent with every fit"),
           ArraySet("probe", "sent with evaluations", purposes=("evaluate",))),
    returns=(ArraySet("echo", "the anchor plus one"),),
)  # fmt: skip


class ToyStrategy(FederatedStrategy):
    contract = TOY
    seen: dict

    def payload_for(self, partition, purpose):
        if purpose == "fit":
            return {"anchor": [np.full(shape, float(partition), np.float32) for shape in self.sent_shapes]}
        return {"probe": [np.arange(3, dtype=np.float32)]}

    def combine(self, server_round, replies):
        self.seen = {reply.partition: reply.extras for reply in replies}
        return super().combine(server_round, replies)


class ToyClient(TorchClient):
    contract = TOY

    def local_train(self, training, method, rng):
        report = self.local_sgd(training, rng)
        echo = [array + 1 for array in self.received["anchor"]]
        return dataclasses.replace(report, arrays={"echo": echo})


def toy_settings(**config):
    base = settings(strategy="fedavg", model="logreg", lr=0.1, local_steps=2, batch_size=8, fraction_fit=1.0,
                    min_fit_clients=1, min_available_clients=1, preflight=False, device="cpu", **config)  # fmt: skip
    return dataclasses.replace(base, method=ToySettings())


def toy_model():
    return build_model("logreg", input_shape=(2,), num_classes=2, seed=0)


def toy_strategy(clients=3, **config):
    model = toy_model()
    start = [v.detach().numpy() for v in model.state_dict().values()]
    strategy = ToyStrategy(settings=toy_settings(**config), initial_model=start)
    nodes = [FakeNode(str(i)) for i in range(clients)]
    fleet = FakeFleet(*nodes)
    start_run(strategy, fleet)
    return strategy, fleet, nodes


def toy_client(partition=0):
    rng = np.random.default_rng(partition)
    x = rng.normal(size=(40, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    data = ClientData(x, y, x[:10], y[:10], num_classes=2)
    return ToyClient(model=toy_model(), data=data, settings=toy_settings(), partition_id=partition)


def replies_to(instructions, fleet):
    out = []
    for ins in instructions:
        arrays, n, metrics = toy_client(fleet.nodes[ins.node].partition).fit(sent_arrays(ins), dict(ins.config))
        out.append(received(ins.node, arrays, n, metrics))
    return out


def arrays_of(reply):
    """The arrays a fit reply carries, decoded."""
    return [from_bytes(t) for t in reply.tensors]


def test_pack_and_unpack_by_layout():
    model, control = [np.zeros(2), np.ones(3)], [np.full(2, 5.0)]
    arrays, layout = pack({"model": model, "control": control})
    assert layout == "model:2 control:1" == layout_of({"model": model, "control": control}) and len(arrays) == 3
    sets = unpack(arrays, layout)
    assert list(sets) == ["model", "control"] and sets["control"][0][0] == 5.0
    assert unpack(arrays, None) == {"model": arrays}  # no layout: every array is the model
    with pytest.raises(PayloadError, match="names 4 arrays, the message holds 3"):
        unpack(arrays, "model:2 control:2")
    with pytest.raises(PayloadError, match="names a set twice"):
        unpack(arrays, "model:2 model:1")
    with pytest.raises(PayloadError, match="is not 'name:count"):
        unpack(arrays, "model=3")
    with pytest.raises(ValueError, match="kebab-case and not 'model'"):
        ArraySet("model", "the model is not an extra set")
    with pytest.raises(ValueError, match="purposes"):
        ArraySet("c", "", purposes=("train",))
    with pytest.raises(ValueError, match="two array sets of one name"):
        dataclasses.replace(TOY, returns=(ArraySet("echo", ""), ArraySet("echo", "")))


def test_each_instruction_carries_the_sets_its_purpose_declares_named_in_its_config():
    strategy, fleet, _ = toy_strategy()
    fits = configure_fit(strategy, 1, fleet)
    for ins in fits:
        assert ins.config["payload"] == "model:2 anchor:2"
        sets = unpack(sent_arrays(ins), ins.config["payload"])
        for got, want in zip(sets["model"], strategy.global_model, strict=True):
            np.testing.assert_array_equal(got, want)
        assert all(np.all(a == fleet.nodes[ins.node].partition) for a in sets["anchor"])
    evaluations = configure_evaluate(strategy, 10, fleet)
    for ins in evaluations:
        assert ins.config["payload"] == "model:2 probe:1"  # the fit-only anchor does not go out with evaluations
    fit_record = strategy.phases.open[1].record  # round 10's evaluation began a record of its own
    assert fit_record["fit-bytes-sent"] == sum(len(t) for ins in fits for t in ins.tensors)


def test_clients_get_the_sets_by_name_and_combine_gets_their_replies_by_name():
    strategy, fleet, _ = toy_strategy()
    fits = configure_fit(strategy, 1, fleet)
    results = replies_to(fits, fleet)
    assert all(res.metrics["payload"] == "model:2 echo:2" for res in results)
    models = {fleet.nodes[res.node].partition: unpack(arrays_of(res), "model:2 echo:2")["model"]
              for res in results}  # fmt: skip
    model, metrics = aggregate_fit(strategy, 1, results)
    assert strategy.record["clients-succeeded"] == 3 and "payload" not in metrics
    for partition, extras in strategy.seen.items():
        assert list(extras) == ["echo"] and all(np.all(a == partition + 1) for a in extras["echo"])
    for i, got in enumerate(model):  # the model alone is averaged (uniformly)
        np.testing.assert_allclose(got, np.mean([models[p][i] for p in range(3)], axis=0), rtol=1e-6)
    assert strategy.record["fit-bytes-received"] == sum(len(t) for res in results for t in res.tensors)


def test_the_client_refuses_sets_its_contract_does_not_declare_and_keeps_the_evaluation_probe():
    strategy, fleet, _ = toy_strategy()
    ins, *_ = configure_evaluate(strategy, 10, fleet)
    client = toy_client()
    client.evaluate(sent_arrays(ins), dict(ins.config))
    np.testing.assert_array_equal(client.received["probe"][0], np.arange(3))
    with pytest.raises(ValueError, match="a fit message carried array sets \\['probe'\\]; the contract sends"):
        client.fit(sent_arrays(ins), dict(ins.config))


def test_a_reply_that_lacks_a_set_or_has_a_bad_one_is_rejected_naming_method_set_and_partition(caplog):
    strategy, fleet, _ = toy_strategy(clients=4)
    results = replies_to(configure_fit(strategy, 1, fleet), fleet)
    model = unpack(arrays_of(results[0]), "model:2 echo:2")["model"]
    bad_shape = [np.zeros((5,), np.float32), np.zeros(2, np.float32)]
    with_nan = [np.full((2, 2), np.nan, np.float32), np.zeros(2, np.float32)]
    broken = {1: ({"model": model}, "is missing"), 2: ({"model": model, "echo": bad_shape}, "array 0 has shape (5,)"),
              3: ({"model": model, "echo": with_nan}, "holds non-finite")}  # fmt: skip
    for partition, (sets, _) in broken.items():
        arrays, layout = pack(sets)
        res = results[partition]
        results[partition] = received(res.node, arrays, res.num_examples, {**res.metrics, "payload": layout})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        combined, _ = aggregate_fit(strategy, 1, results)
    assert combined is not None and list(strategy.seen) == [0]  # the good reply was combined: the run goes on
    assert strategy.record["clients-rejected"] == 3 and strategy.record["clients-nonfinite"] == 1
    lines = [r.getMessage() for r in caplog.records if "rejected fit reply" in r.getMessage()]
    for partition, (_, problem) in broken.items():
        line = next(line for line in lines if f"partition {partition} " in line)
        assert "toy array set 'echo'" in line and problem in line, line


def test_the_update_norm_screen_measures_the_model_and_each_returned_set_on_its_own_scale():
    strategy, fleet, _ = toy_strategy(clients=4, max_update_ratio=3.0)
    results = replies_to(configure_fit(strategy, 1, fleet), fleet)
    sets = unpack(arrays_of(results[0]), "model:2 echo:2")
    sets["echo"] = [a * 1e6 for a in sets["echo"]]  # a huge set beside an ordinary model update
    arrays, layout = pack(sets)
    res = results[0]
    results[0] = received(res.node, arrays, res.num_examples, {**res.metrics, "payload": layout})
    aggregate_fit(strategy, 1, results)
    # the model's update is ordinary (its norm is recorded alone); the echo set, 1e6 times its round's median, is not
    assert strategy.record["clients-outsized"] == 1 and strategy.record["clients-succeeded"] == 3
    assert strategy.record["update-norm-max"] < 10


def test_a_strategy_or_client_that_builds_other_sets_than_declared_fails_loudly():
    strategy, fleet, _ = toy_strategy()
    strategy.payload_for = lambda partition, purpose: {}
    with pytest.raises(RuntimeError, match=r"payload_for\(0, 'fit'\): a fit message carried array sets \[\]; the "
                                           r"contract sends \['anchor'\]"):  # fmt: skip
        configure_fit(strategy, 1, fleet)
    strategy, fleet, _ = toy_strategy()
    ins, *_ = configure_fit(strategy, 1, fleet)
    client = toy_client()
    client.local_train = lambda training, method, rng: TrainReport(0.1, 1, 1, 1)
    with pytest.raises(RuntimeError, match=r"returned array sets \[\]; toy's contract returns \['echo'\]"):
        client.fit(sent_arrays(ins), dict(ins.config))


def test_an_optional_set_goes_with_the_messages_the_strategy_chooses_and_a_required_one_with_all():
    hint = ArraySet("hint", "when the strategy has one", purposes=("fit", "evaluate"), optional=True)
    optional = dataclasses.replace(TOY, sends=(ArraySet("anchor", "sent with every fit"), hint))

    class Chooser(ToyStrategy):
        contract = optional

        def payload_for(self, partition, purpose):
            hint = {"hint": [np.ones(2, np.float32)]} if partition % 2 else {}
            anchor = super().payload_for(partition, "fit") if purpose == "fit" else {}
            return {**anchor, **hint}

    class ChooserClient(ToyClient):
        contract = optional

    strategy, fleet, _ = toy_strategy()
    strategy.__class__ = Chooser
    fits = configure_fit(strategy, 1, fleet)
    assert [ins.config["payload"] for ins in fits] == ["model:2 anchor:2", "model:2 anchor:2 hint:1",
                                                          "model:2 anchor:2"]  # fmt: skip
    client = ChooserClient(model=toy_model(), data=toy_client().data, settings=toy_settings(), partition_id=1)
    client.fit(sent_arrays(fits[1]), dict(fits[1].config))
    assert list(client.received) == ["anchor", "hint"]
    client.fit(sent_arrays(fits[0]), dict(fits[0].config))
    assert list(client.received) == ["anchor"]
    evaluations = configure_evaluate(strategy, 10, fleet)
    assert [ins.config["payload"] for ins in evaluations] == ["model:2", "model:2 hint:1", "model:2"]
    strategy.payload_for = lambda partition, purpose: {"hint": [np.ones(2, np.float32)]}  # the anchor is required
    with pytest.raises(RuntimeError, match=r"carried array sets \['hint'\]; the contract sends \['anchor'\] and may "
                                           r"send \['hint'\]"):  # fmt: skip
        configure_fit(strategy, 2, fleet)
