"""The in-process engine builds each client as the ClientApp does, from a Flower Context kept for the run."""

from __future__ import annotations

import numpy as np

from app.local.inprocess import InProcessRun, build_clients
from clients.base import PERSONAL_LAYERS

RUN = {"strategy": "fedrep", "fraction-fit": 1.0, "min-available-clients": 4, "local-steps": 2, "fedrep-head-steps": 2}


def test_each_client_keeps_its_node_context_and_its_state_across_rounds():
    run = InProcessRun(run_config=RUN, num_clients=4)
    contexts = list(run.grid.contexts.values())  # each node's Context, in partition order
    for partition, (context, client) in enumerate(zip(contexts, run.clients, strict=True)):
        assert context.node_config == {"partition-id": partition, "num-partitions": 4}
        assert client.partition_id == partition and client.state.records is context.state
    run.step()
    heads = [[a.copy() for a in client.state.arrays(PERSONAL_LAYERS)] for client in run.clients]
    run.step()
    for context, client, head in zip(contexts, run.clients, heads, strict=True):
        assert f"fedrep/{PERSONAL_LAYERS}" in context.state.array_records  # the state is the node's Context.state
        assert not np.array_equal(client.state.arrays(PERSONAL_LAYERS)[0], head[0])  # round 2 trained on round 1's


def test_clients_built_from_settings_match_the_run_s_own():
    run = InProcessRun(run_config=RUN, num_clients=4)
    rebuilt = build_clients(run.settings, 4)
    for ours, theirs in zip(run.clients, rebuilt, strict=True):
        for a, b in zip(ours.model.state_dict().values(), theirs.model.state_dict().values(), strict=True):
            assert np.array_equal(a.numpy(), b.numpy())
        assert np.array_equal(ours.data.train_y, theirs.data.train_y)
