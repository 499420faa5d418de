"""``python -m app.local.deployment``: start a local deployment, run the app once (or serve), stop everything.

The module docstring of :mod:`app.local.deployment` shows the commands; this is their parser.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from app.config import ConfigError, parse_settings, run_config_from_text
from app.local import deployment as deployment_module
from app.local.credentials import CERT_DAYS, certificate_notes
from app.local.deployment import CONNECTION, LocalDeployment
from app.local.deployment_commands import deployment_problem
from app.local.flwr_cli import FINISHED_OK

CHECK_S = 24 * 3600  # a served deployment looks at its certificate's expiry once a day


def deployment_run_config(text: str, *, results_dir: Path) -> dict[str, object]:
    """The run config the helper submits: ``results-dir`` by default, the user's ``--run-config`` keys over it.

    Flower refuses a key given twice in one ``--run-config`` string ("The provided
    configuration string is in an invalid format"), so the helper's default cannot simply
    be prepended; it is merged, and the result is checked by stamen's own parser before
    any process starts.

    Raises
    ------
    ConfigError
        For text that is not ``key=value ...`` or a key or value stamen refuses.

    """
    user = run_config_from_text(text)
    # a relative results-dir would land in the SuperLink's working directory, not where the user ran this
    config = {"results-dir": str(results_dir), **user}
    parse_settings(config)
    return config


def say_certificates(deployment: LocalDeployment, *, warnings_only: bool = False) -> None:
    """Print the server certificate's and the CA's expiry, and the warning once the server's is near."""
    if deployment.certificates is None:
        return
    for warning, line in certificate_notes(deployment.certificates):
        if warning or not warnings_only:
            print(("warning: " if warning else "") + line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start a local deployment, run the app once (or serve until Ctrl-C), stop everything."""
    description = deployment_module.__doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m app.local.deployment", description=description)
    parser.add_argument("--nodes", type=int, default=2, help="SuperNodes to start (default 2)")
    parser.add_argument("--node-data", type=Path, nargs="+", metavar="FOLDER",
                        help="each SuperNode's own data folder (one node per folder; overrides --nodes)")  # fmt: skip
    parser.add_argument("--tls", action="store_true", help="serve over TLS with a generated CA")
    parser.add_argument("--cert-days", type=int, default=CERT_DAYS, metavar="DAYS",
                        help=f"with --tls: how long the server certificate is valid (default {CERT_DAYS}); a restart "
                             "with the same --workdir renews it under the same CA")  # fmt: skip
    parser.add_argument("--auth", action="store_true",
                        help="enable SuperNode authentication (registers each key); needs --tls")  # fmt: skip
    parser.add_argument("--lan-host", metavar="ADDRESS",
                        help="the LAN recipe: SuperNodes dial the Fleet gate on ADDRESS (e.g. 127.0.0.2), the "
                             "SuperLink and its Control API stay on 127.0.0.1; needs --tls")  # fmt: skip
    parser.add_argument("--run-config", default="", help='overrides, as for flwr run: "num-server-rounds=3 ..."')
    parser.add_argument("--workdir", type=Path, help="keep certificates, keys, logs and results here")
    parser.add_argument("--warm", action="store_true",
                        help="start each SuperNode as a warm device (stamen-device): torch imported once")
    parser.add_argument("--serve", action="store_true", help="keep the deployment up until Ctrl-C instead of running")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the run (default 3600)")
    args = parser.parse_args(argv)
    if problem := deployment_problem(tls=args.tls, node_auth=args.auth, lan_host=args.lan_host,
                                     cert_days=args.cert_days):  # fmt: skip
        parser.error(problem)  # exits 2 before any file or process exists
    try:
        config = deployment_run_config(args.run_config, results_dir=Path.cwd() / "results")
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    app_dir = Path(__file__).resolve().parents[2]
    num_nodes = len(args.node_data) if args.node_data else args.nodes
    with LocalDeployment(app_dir=app_dir, num_nodes=num_nodes, tls=args.tls, node_auth=args.auth,
                         workdir=args.workdir, node_data=args.node_data, warm=args.warm,
                         lan_host=args.lan_host, cert_days=args.cert_days) as deployment:  # fmt: skip
        print("started:\n  " + "\n  ".join(deployment.commands()))
        say_certificates(deployment)
        print(f"FLWR_HOME={deployment.home} (connection {CONNECTION!r}); logs in {deployment.logs}")
        if args.serve:
            print(f"submit with:  FLWR_HOME={deployment.home} flwr run {app_dir} {CONNECTION} --stream\nCtrl-C stops.")
            try:
                while True:  # a served deployment outlives certificates: it says so from WARN_DAYS before
                    time.sleep(CHECK_S)
                    say_certificates(deployment, warnings_only=True)
            except KeyboardInterrupt:
                return 0
        outcome = deployment.run(config, timeout_s=args.timeout)
        print(outcome.log[-3000:])
        print(f"run {outcome.run_id}: {outcome.status} in {outcome.wall_seconds:.0f} s")
        return 0 if outcome.status == FINISHED_OK else 1

