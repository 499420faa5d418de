"""stamen on Flower: the one place that imports Flower's message types (records, messages, the grid, its Strategy).

``rounds.py`` is the round engine (:class:`Rounds`, a Message API ``Strategy``); ``codec.py``
reads and writes stamen's array sets and values as Flower records; ``fleet.py`` is the grid's
nodes as the preflight asks them; ``paced_grid.py`` the grid's paced wait for replies.
"""
