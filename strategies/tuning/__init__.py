"""FATHOM's tuner: hypergradient maths, the tuner that moves the values in force, the start probe."""
