"""message-app: ClientApp. stamen's handlers (train, evaluate, query) on this app's model and data."""

import stamen

from message_app.task import Net, load_data


def client_data(partition_id: int, num_partitions: int, run_config: dict):
    """The template's ``load_data`` for one node: its training and test DataLoaders."""
    return load_data(partition_id, num_partitions, int(run_config["batch-size"]), str(run_config["data-dir"]),
                     int(run_config["max-per-class"]))


# Flower ClientApp
app = stamen.build_client_app(model=lambda run_config: Net(), data=client_data)
