"""own-app: ServerApp. The stamen method named by the ``strategy`` key, on this app's model."""

from stamen import build_server_app, split_at

from own_app.task import Net

# fc3 named as the head: MOON and FedProto read the representation, the input of fc3
app = build_server_app(model=lambda run_config: split_at(Net(), head="fc3"), data_name="imagefolder-dirichlet")
