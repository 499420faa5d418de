"""message-app: ServerApp. The template's main, with stamen's Per-FedAvg where the template builds FedAvg."""

import stamen
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from message_app.task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    # Read run config
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the stamen strategy (the template: FedAvg(fraction_train=...)); it reads its keys from the run
    # config, the template's fraction-train as stamen's fraction-fit
    config = {**context.run_config, "fraction-fit": context.run_config["fraction-train"]}
    strategy = stamen.PerFedAvg(run_config=config, model=lambda run_config: Net(), data_name="imagefolder-iid")

    # Start strategy, run for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate(context),
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, "final_model.pt")


def global_evaluate(context: Context):
    """The template's server-side evaluation of the global model, on this app's test images."""
    testloader = load_centralized_dataset(str(context.run_config["data-dir"]), int(context.run_config["max-per-class"]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, testloader, torch.device("cpu"))
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    return evaluate
