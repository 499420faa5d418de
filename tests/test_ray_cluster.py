"""A simulation on an existing two-node Ray cluster on this machine: the clients run on both nodes, and the run says so.

Flower's simulation engine joins the Ray cluster named by ``RAY_ADDRESS`` in the
SuperLink's environment (docs/running.md). The cluster is Ray's own test helper,
``ray.cluster_utils.Cluster``: a head and a second node, one CPU each, both bound to
127.0.0.1, started by this process and shut down by it, so no other Ray on the machine is
touched and nothing listens beyond loopback. Ray turns a 127.0.0.1 address into the
machine's network address before connecting, which left Flower's driver waiting for a
GCS that listens on loopback only; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the
SuperLink's environment tells Ray that this is a one-machine cluster, and the driver
then connects on 127.0.0.1. While the cluster runs, any other simulation started on
this machine joins it (``ray.init()`` finds a running local cluster): do not run
benchmarks beside it.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from app.local.simulation import LocalSimulation, free_port

pytestmark = pytest.mark.e2e
CLIENTS = 20
LOOPBACK = "127.0.0.1"
# Ray rewrites a 127.0.0.1 cluster address to the machine's network address (``resolve_ip_for_localhost``)
# unless told that this is no multi-machine cluster: then Flower's driver connects to the nodes on 127.0.0.1.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def test_a_simulation_on_a_two_node_ray_cluster_runs_clients_on_both_nodes_and_reports_them(tmp_path, capsys):
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="Ray comes with flwr[simulation]")
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "gcs_server_port": free_port(), "include_dashboard": False,
                        "node_ip_address": LOOPBACK},
    )
    try:
        cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        node_ids = {cluster.head_node.node_id, *(node.node_id for node in cluster.worker_nodes)}
        assert len(node_ids) == 2
        assert cluster.address.startswith(f"{LOOPBACK}:"), cluster.address
        with capsys.disabled():  # in the test run's output, passed or not
            print(f"\nRay cluster at {cluster.address}: nodes {sorted(node_ids)}")
        config = {"num-server-rounds": 2, "fraction-fit": 0.5, "results-dir": str(tmp_path), "run-name": "on-ray"}
        with LocalSimulation(app_dir=REPO, env={"RAY_ADDRESS": cluster.address, **LOOPBACK_ONLY}) as sim:
            outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=600,
                              extra_federation="client-resources-num-cpus=1")  # fmt: skip
        assert outcome.ok, f"status {outcome.status}\n{outcome.log_tail}"
        summary = json.loads((tmp_path / "on-ray" / "summary.json").read_text())
        with capsys.disabled():
            print(f"clients per Ray node (preflight): {summary['ray-nodes']}")
        assert set(summary["ray-nodes"]) == node_ids
        assert sum(summary["ray-nodes"].values()) == CLIENTS
        assert all(entry["ray-node"] in node_ids for entry in summary["nodes"])
        assert "the clients ran on 2 Ray node(s)" in outcome.log
    finally:
        cluster.shutdown()
