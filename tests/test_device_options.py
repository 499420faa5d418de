"""stamen-device's own options: the SuperExec's task poll it sets, and what it refuses."""

from __future__ import annotations

import pytest

from app.device.console import TASK_POLL, TASK_POLL_ENV, device_environment, main


def test_the_device_sets_flowers_task_poll_unless_the_environment_does():
    assert device_environment({"PATH": "/bin"}, TASK_POLL) == {"PATH": "/bin", TASK_POLL_ENV: f"{TASK_POLL:g}"}
    assert device_environment({}, 0.5)[TASK_POLL_ENV] == "0.5"
    assert device_environment({TASK_POLL_ENV: "2"}, 0.5)[TASK_POLL_ENV] == "2"  # the operator's own value wins
    assert TASK_POLL < 1.0  # Flower's default is 1 s


@pytest.mark.parametrize("value", ["0.001", "61"])
def test_a_task_poll_outside_flowers_range_is_refused_before_anything_starts(value, capsys):
    with pytest.raises(SystemExit):
        main(["--task-poll", value, "--superlink", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert f"--task-poll: {float(value):g} s is outside Flower's 0.01-60 s" in err
