"""own-app: ClientApp. This app's model and data, served by the stamen method the server runs."""

from stamen import build_client_app, split_at

from own_app.task import Net, load_data

app = build_client_app(model=lambda run_config: split_at(Net(), head="fc3"), data=load_data)
