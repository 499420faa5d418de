r"""A TLS front that lets devices reach a SuperLink's Fleet API and nothing else.

flwr 1.42's ``flower-superlink`` serves its Fleet API (devices), Control API (``flwr run``,
``flwr supernode register``, ``flwr ls``) and Runtime API (the ServerApp's SuperExec) on one
HTTPS listener, ``--host``/``--port`` (``flwr/superlink/cli/flower_superlink.py``,
``_run_superlink_http_api``), and the Control API asks for no credential unless Flower's OIDC
account authentication is installed (``flwr/superlink/config_loader.py``,
``load_control_authn_plugin``), which the open-source wheel is not. A SuperLink listening on
the LAN therefore takes runs and node keys from anyone holding its CA certificate.

Run the SuperLink on 127.0.0.1 instead and this gate on the LAN address::

    flower-superlink --host 127.0.0.1 --port 9101 ... --enable-supernode-auth
    python -m app.local.fleet_gate --listen 192.168.1.10:9100 --superlink 127.0.0.1:9101 \
        --ssl-certfile certs/server.pem --ssl-keyfile certs/server.key --ssl-ca-certfile certs/ca.crt

It terminates TLS with the SuperLink's own certificate, passes each request whose method and
path are one of Flower's Fleet routes (``flwr/superlink/routers/fleet/router.py``) to the
SuperLink unchanged (the SuperNode's signature headers included, so node authentication
still decides which device may join), and answers every other request 403 without
contacting the SuperLink. ``python -m stamen.app.local.fleet_gate`` where stamen is installed.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

REFUSAL = ("stamen fleet gate: {method} {path} is not part of Flower's Fleet API; run submission and "
           "node registration are served on the SuperLink host only (docs/deployment.md#on-a-lan-with-edge-devices)")
# hop-by-hop headers belong to one connection; host names the gate, not the SuperLink
NOT_FORWARDED = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer",
                           b"upgrade", b"proxy-authorization", b"proxy-connection"})  # fmt: skip


def fleet_routes() -> frozenset[tuple[str, str]]:
    """``(method, path)`` of every route of Flower's Fleet API, read from Flower's own router.

    Reading them from Flower keeps the gate in step with the installed version; an import
    error (a Flower that moved its router) stops the gate instead of opening it.
    """
    from flwr.superlink.routers.fleet.router import router

    return frozenset((method, route.path) for route in router.routes for method in route.methods)


class FleetGate:
    """An ASGI app: Fleet routes go to ``upstream``, anything else is refused with 403.

    Parameters
    ----------
    upstream
        The SuperLink's ``host:port`` (its loopback listener).
    ca_cert
        The CA that signed the SuperLink's certificate (which must name ``upstream``'s host).
    routes
        The ``(method, path)`` pairs let through; Flower's Fleet routes by default.
    transport
        An httpx transport for the upstream connection (tests); a TLS connection by default.

    """

    def __init__(self, *, upstream: str, ca_cert: Path, routes: frozenset[tuple[str, str]] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:  # fmt: skip
        self.routes = fleet_routes() if routes is None else routes
        self.client = httpx.AsyncClient(
            base_url=f"https://{upstream}", transport=transport, verify=ssl.create_default_context(cafile=ca_cert),
            timeout=httpx.Timeout(300.0, connect=10.0),  # a large model upload may take minutes on a slow link
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if (scope["method"], scope["path"]) in self.routes:
                await self._forward(scope, receive, send)
            else:
                await _refuse(scope, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path sent on is the allowed route itself (no query string, no raw form), so nothing
        # the client encoded differently can reach another route behind the gate.
        headers = [(name, value) for name, value in scope["headers"] if name.lower() not in NOT_FORWARDED]
        request = self.client.build_request(scope["method"], scope["path"], headers=headers,
                                            content=_body(receive))  # fmt: skip
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as err:
            await _answer(send, 502, f"stamen fleet gate: the SuperLink did not answer ({type(err).__name__})")
            return
        headers = [(name, value) for name, value in response.headers.raw if name.lower() not in NOT_FORWARDED]
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The request body as it arrives: the gate never holds a whole upload."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _refuse(scope: Scope, send: Send) -> None:
    # JSON with a "detail" string: the shape `flwr` prints as the error (flwr/cli/utils.py, flwr_cli_exc_handler)
    await _answer(send, 403, REFUSAL.format(method=scope["method"], path=scope["path"]))


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def split_address(text: str) -> tuple[str, int]:
    """``"192.168.1.10:9100"`` -> ``("192.168.1.10", 9100)``; ``"[::1]:9100"`` -> ``("::1", 9100)``."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    """Serve the gate until Ctrl-C or SIGTERM."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m app.local.fleet_gate", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=split_address, required=True, metavar="HOST:PORT",
                        help="the LAN address the devices dial (the firewall opens this port only)")  # fmt: skip
    parser.add_argument("--superlink", required=True, metavar="HOST:PORT",
                        help="the SuperLink's --host:--port, on 127.0.0.1")  # fmt: skip
    parser.add_argument("--ssl-certfile", type=Path, required=True, help="the SuperLink's server certificate")
    parser.add_argument("--ssl-keyfile", type=Path, required=True, help="its private key")
    parser.add_argument("--ssl-ca-certfile", type=Path, required=True, help="the CA that signed it")
    args = parser.parse_args(argv)
    host, port = args.listen
    gate = FleetGate(upstream=args.superlink, ca_cert=args.ssl_ca_certfile)
    uvicorn.run(gate, host=host, port=port, ssl_certfile=str(args.ssl_certfile), ssl_keyfile=str(args.ssl_keyfile),
                log_level="info")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
