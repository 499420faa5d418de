"""``bench/unseen_classes.py``: the seen/unseen split of each client's test examples, and the captured predictions.

The benchmark's figures come from its runs; here: the split counts by hand, and in a real
in-process run the captured predictions give exactly the accuracy the clients reported
(the script refuses to write a figure otherwise), with every test example counted once.
"""

from __future__ import annotations

import pytest
import torch

from app.local.inprocess import InProcessRun
from bench.personalised_setup import tuned_run_config
from bench.unseen_classes import Predictions, gap_from_unseen, pooled, seen_and_unseen, split_accuracy


def test_the_split_counts_by_hand():
    correct = torch.tensor([True, False, True, True, False])
    test_y = torch.tensor([0, 0, 3, 5, 5])
    train_y = torch.tensor([0, 1, 1, 3])  # 5 never occurs in training
    assert seen_and_unseen(correct, test_y, train_y) == (2, 3, 1, 2)


def test_the_pooled_gap_splits_into_its_seen_and_unseen_parts_by_hand():
    reference = {"seen-accuracy": 0.9, "seen-examples": 6, "unseen-accuracy": 0.5, "unseen-examples": 4}
    row = {"seen-accuracy": 0.8, "seen-examples": 6, "unseen-accuracy": 0.0, "unseen-examples": 4}
    assert pooled(reference) == pytest.approx(0.74) and pooled(row) == pytest.approx(0.48)
    unseen, total = gap_from_unseen(row, reference)
    assert unseen == pytest.approx(20.0)  # 4 of 10 examples, 50 points each
    assert total == pytest.approx(26.0)  # and 6 of 10 examples, 10 points each


@pytest.mark.parametrize("method", ["fedper", "pfedme"])  # a personal head; a personal model tested after the global
def test_the_captured_predictions_give_the_accuracy_the_clients_reported(method):
    config = tuned_run_config("mnist-paper", method, {"lr": 0.05}, seed=0, rounds=1, validation=0.0, folder=None)
    run = InProcessRun(run_config={**config, "fraction-fit": 0.1}, num_clients=50)
    run.step()
    split = split_accuracy(run)  # raises if the captured predictions disagree with the reported accuracy
    examples = sum(len(client.test_y) for client in run.clients)
    assert split["seen-examples"] + split["unseen-examples"] == examples
    assert 0.0 < split["accuracy"] < 1.0


def test_the_wrapper_is_removed_and_keeps_the_last_call_per_test_split():
    import clients.evaluation

    original = clients.evaluation.accuracy_and_loss
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
        model.bias.zero_()
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]), torch.tensor([0, 0, 0])
    with Predictions() as predictions:
        accuracy, _ = clients.evaluation.accuracy_and_loss(model, x, y)
    assert clients.evaluation.accuracy_and_loss is original
    assert predictions.last[id(y)].tolist() == [True, False, True] and accuracy == 2 / 3
