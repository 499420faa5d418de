"""Methods' contracts: the run-config keys, settings and metric names a strategy and its client share.

Nothing here imports Flower or torch: a client imports its method's contract and
nothing else from ``strategies``.
"""
