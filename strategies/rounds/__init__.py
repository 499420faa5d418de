"""A round's phases, Flower-free: what goes to each node, and what the replies make of the model and the record."""
