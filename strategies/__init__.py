"""Flower strategies (server side), the parts they are built from, and the pure maths they rely on.

This package's ``__init__`` imports nothing: a client imports its method's contract
(``strategies.contracts.<method>``) without loading any server code.
"""
