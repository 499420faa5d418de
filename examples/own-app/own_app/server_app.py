"""own-app: ServerApp. The stamen method named by the ``strategy`` key, on this app's model."""

from stamen import build_server_app

from own_app.task import Net

app = build_server_app(model=lambda run_config: Net(), data_name="imagefolder-dirichlet")
