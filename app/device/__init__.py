"""A warm device: ``stamen-device``, the fork server that imports torch once, the executor that forks per task."""
