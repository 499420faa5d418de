"""Flower entry points (ServerApp, ClientApp), the run config's parser and the local launchers."""

import time as _time

# When a ClientApp process started loading stamen (wall, CPU): app.message_cost splits a message's cost there.
IMPORT_STARTED = (_time.time(), _time.process_time())
