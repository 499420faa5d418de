"""What a run writes: the results folder, its writer, plots and provenance."""
