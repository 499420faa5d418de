"""The result writer's plot: what it draws for a run whose clients test no global model."""

from __future__ import annotations

from app.results.writer import plot_accuracy


def test_the_accuracy_plot_draws_the_global_model_only_where_the_records_have_it(tmp_path):
    personal = [{"round": r, "accuracy": 0.5 + r / 10, "accuracy-min": 0.4, "accuracy-max": 0.9} for r in (1, 2)]
    plot_accuracy(personal, tmp_path / "personal.png", title="a method with personal layers")
    both = [{**r, "global-accuracy": 0.3} for r in personal]
    plot_accuracy(both, tmp_path / "both.png", title="a method with a global model")
    assert (tmp_path / "personal.png").stat().st_size > 1000 and (tmp_path / "both.png").stat().st_size > 1000
