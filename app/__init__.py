"""Flower entry points (ServerApp, ClientApp), the run config's parser and the local launchers."""

import time as _time

# When a ClientApp process started loading stamen (wall, CPU): app.message_cost splits a message's cost there.
IMPORT_STARTED = (_time.time(), _time.process_time())
# Set by app.device.warm_exec in each task child it forks (Unix time); app.message_cost reads it. Declared in
# the package's leaf so neither imports the other: warm_exec imports the ClientApp, which imports message_cost.
FORKED_AT_ENV = "STAMEN_FORKED_AT"
