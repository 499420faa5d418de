"""``python -m app.config``: check a ``--run-config`` string, as a run would, before submitting it."""

from __future__ import annotations

from pathlib import Path

from app.config.keys import app_keys, ignored_keys, ignored_keys_line
from app.config.parse import parse_settings
from app.config.run_config_text import app_run_config, check_overrides, run_config_from_text
from app.config.server_rules import check_on_server
from strategies.contracts.keys import ConfigError


def main(argv: list[str] | None = None) -> int:
    """``python -m app.config "lr=0.1 strategy='fedavg'"``: check a ``--run-config`` string before submitting it.

    ``flwr run`` refuses a key it does not know with ``[code: 15] Invalid run
    configuration`` and names the key only in the SuperLink's log; this prints
    stamen's own message (with a suggestion for a misspelt key), the warnings a run
    would log, and exits 1 when the run would be refused. With ``--app DIR`` it checks
    the string against that Flower app's ``pyproject.toml`` as Flower does, then reads it
    as an outside app's run config (its own keys pass).
    """
    import argparse

    module = __spec__.parent if __spec__ is not None else "app.config"  # stamen.app.config when installed
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=main.__doc__.splitlines()[0])
    parser.add_argument("run_config", nargs="*", help="the --run-config string(s), in flwr run's syntax")
    parser.add_argument("--app", type=Path, default=None,
                        help="an outside Flower app's folder: check the keys against its pyproject.toml")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        overrides = run_config_from_text(" ".join(args.run_config))
        run_config = overrides
        if args.app is not None:
            app_config = app_run_config(args.app)
            check_overrides(overrides, app_config, args.app)
            run_config = {**app_config, **overrides}
        settings = parse_settings(run_config, allow_app_keys=args.app is not None)
        if args.app is None:
            check_on_server(settings)
    except ConfigError as err:
        print(f"error: {err}")
        return 1
    ignored = ignored_keys(run_config, settings)
    if ignored:
        print(f"warning: {ignored_keys_line(ignored)}")
    if args.app is not None:
        print(f"ok: {args.app} accepts this run config: strategy {settings.run.strategy!r}, the app's own keys "
              f"{sorted(app_keys(run_config))}")  # fmt: skip
    else:
        print(f"ok: strategy {settings.run.strategy!r} on {settings.data.dataset!r} accepts this run config")
    return 0
