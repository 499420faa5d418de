"""The nodes a run reaches: what each declared, the preflight, how a node's failure reads, failures by cause."""
