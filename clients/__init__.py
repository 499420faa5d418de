"""Flower clients (NumPyClient subclasses), models, the local training loop and the torch maths they run.

A client imports its method's contract from ``strategies.contracts`` and nothing
else from ``strategies``.
"""
