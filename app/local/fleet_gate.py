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
path are one of Flower's Fleet routes (``flwr/superlink/routers/fleet/router.py``) but node
registration to the SuperLink, its body and the SuperNode's signature headers unchanged (so
node authentication still decides which device may join), and answers every other request
403 without contacting the SuperLink. What it passes is held to what a device ever sends
(body size and pace, requests per address, forwarding headers: ``app/local/gate_policy.py``).
``python -m stamen.app.local.fleet_gate`` where stamen is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from logging import INFO, getLogger
from pathlib import Path
from typing import Any

import httpx

from app.local.gate_policy import (
    REGISTRATION_PATHS,
    BodyRefusedError,
    ClientSlots,
    GateLimits,
    forwarded_headers,
    nginx_config,
    printable,
    read_body,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

REFUSAL = ("stamen fleet gate: {method} {path} is not part of Flower's Fleet API for devices; run submission "
           "and node registration are served on the SuperLink host only "
           "(docs/deployment.md#on-a-lan-with-edge-devices)")  # fmt: skip
# a reply's hop-by-hop headers belong to the gate's connection to the SuperLink
NOT_RETURNED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
                          b"proxy-connection"})  # fmt: skip
ACCESS = getLogger("stamen.fleet_gate")  # one line per request: peer, method, path, status; never a header or body


def fleet_routes() -> frozenset[tuple[str, str]]:
    """``(method, path)`` of every route of Flower's Fleet API a device with a key uses, from Flower's own router.

    Reading them from Flower keeps the gate in step with the installed version; an import
    error (a Flower that moved its router) stops the gate instead of opening it. The
    registration routes are left out (``REGISTRATION_PATHS``): keys are registered on the
    SuperLink host (``flwr supernode register``), never by a device through the gate.
    """
    from flwr.superlink.routers.fleet.router import router

    return frozenset((method, route.path) for route in router.routes for method in route.methods
                     if route.path not in REGISTRATION_PATHS)  # fmt: skip


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
    limits
        Body cap and pace, requests per address, the upstream pool and timeout (:class:`GateLimits`).

    """

    def __init__(self, *, upstream: str, ca_cert: Path, routes: frozenset[tuple[str, str]] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 limits: GateLimits | None = None) -> None:  # fmt: skip
        self.routes = fleet_routes() if routes is None else routes
        self.limits = limits or GateLimits()
        self.slots = ClientSlots(self.limits.per_client)
        self.client = httpx.AsyncClient(
            base_url=f"https://{upstream}", transport=transport, verify=ssl.create_default_context(cafile=ca_cert),
            timeout=httpx.Timeout(self.limits.upstream_s, connect=10.0),
            limits=httpx.Limits(max_connections=self.limits.upstream_connections,
                                max_keepalive_connections=self.limits.upstream_connections // 4),
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            peer = (scope.get("client") or ("unknown", 0))[0]
            status = await self._serve(scope, receive, send, peer)
            ACCESS.log(INFO, "%s %s %s %d", peer, scope["method"], printable(scope["path"]), status)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, peer: str) -> int:
        if (scope["method"], scope["path"]) not in self.routes:
            return await _answer(send, 403, REFUSAL.format(method=scope["method"], path=printable(scope["path"])))
        if not self.slots.take(peer):
            return await _answer(send, 429, f"stamen fleet gate: {peer} has {self.limits.per_client} requests in "
                                            "the gate already")  # fmt: skip
        try:
            body = await read_body(receive, scope["headers"], self.limits)
            return await self._forward(scope, body, send, peer)
        except BodyRefusedError as refused:
            return await _answer(send, refused.status, refused.detail)
        finally:
            self.slots.give_back(peer)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, body: bytes, send: Send, peer: str) -> int:
        # The path sent on is the allowed route itself (no query string, no raw form), so nothing
        # the client encoded differently can reach another route behind the gate; the body was read
        # whole first, so a slow device holds none of the SuperLink's connections while it uploads.
        request = self.client.build_request(scope["method"], scope["path"], content=body,
                                            headers=forwarded_headers(scope["headers"], peer))  # fmt: skip
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as err:
            return await _answer(send, 502, f"stamen fleet gate: the SuperLink did not answer ({type(err).__name__})")
        headers = [(name, value) for name, value in response.headers.raw if name.lower() not in NOT_RETURNED]
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()
        return response.status_code


async def _answer(send: Send, status: int, detail: str) -> int:
    # JSON with a "detail" string: the shape `flwr` prints as the error (flwr/cli/utils.py, flwr_cli_exc_handler);
    # the connection closes after a refusal, so a body left unread cannot hold it
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status != 200:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


def split_address(text: str) -> tuple[str, int]:
    """``"192.168.1.10:9100"`` -> ``("192.168.1.10", 9100)``; ``"[::1]:9100"`` -> ``("::1", 9100)``."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def timed_protocol(header_s: float) -> type:
    """Uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a whole request head within ``header_s``.

    uvicorn waits for a first request (and for the next one's head, after a keep-alive
    reply's timer was cancelled by a single byte) for ever: a host trickling request heads
    would keep every connection the gate may hold. The deadline is armed whenever the
    connection waits for a request and disarmed when one has arrived.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimedH11(H11Protocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # noqa: ANN001 - an asyncio transport
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(header_s, self._too_slow)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _too_slow(self) -> None:
            if self.cycle is None or self.cycle.response_complete:  # still no request head: drop it
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimedH11


def main(argv: list[str] | None = None) -> int:
    """Serve the gate until Ctrl-C or SIGTERM (or print its nginx equivalent)."""
    import logging

    import uvicorn

    defaults = GateLimits()
    parser = argparse.ArgumentParser(prog="python -m app.local.fleet_gate", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=split_address, required=True, metavar="HOST:PORT",
                        help="the LAN address the devices dial (the firewall opens this port only)")  # fmt: skip
    parser.add_argument("--superlink", required=True, metavar="HOST:PORT",
                        help="the SuperLink's --host:--port, on 127.0.0.1")  # fmt: skip
    parser.add_argument("--ssl-certfile", type=Path, help="the SuperLink's server certificate")
    parser.add_argument("--ssl-keyfile", type=Path, help="its private key")
    parser.add_argument("--ssl-ca-certfile", type=Path, help="the CA that signed it")
    parser.add_argument("--body-cap", type=int, default=defaults.body_cap, metavar="BYTES",
                        help=f"largest request body passed on (default {defaults.body_cap}: two of Flower's object "
                             "chunks and 1 MiB)")  # fmt: skip
    parser.add_argument("--per-client", type=int, default=defaults.per_client, metavar="N",
                        help=f"requests one address may have in the gate at once (default {defaults.per_client})")
    parser.add_argument("--idle-seconds", type=float, default=defaults.body_idle_s, metavar="S",
                        help=f"longest wait for a request's head or the next part of its body (default "
                             f"{defaults.body_idle_s:g}, a SuperNode's own request timeout)")  # fmt: skip
    parser.add_argument("--connections", type=int, default=defaults.connections, metavar="N",
                        help=f"connections held at most (default {defaults.connections})")
    parser.add_argument("--print-nginx", action="store_true",
                        help="print an nginx server block with the same routes and limits, and exit")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("body_cap", "per_client", "connections", "idle_seconds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    limits = GateLimits(body_cap=args.body_cap, per_client=args.per_client, connections=args.connections,
                        body_idle_s=args.idle_seconds)  # fmt: skip
    host, port = args.listen
    if args.print_nginx:
        print(nginx_config(fleet_routes(), listen=f"{host}:{port}", upstream=args.superlink, limits=limits), end="")
        return 0
    missing = [f"--{n.replace('_', '-')}" for n in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certfile")
               if getattr(args, n) is None]  # fmt: skip
    if missing:
        parser.error(f"serving needs {', '.join(missing)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    gate = FleetGate(upstream=args.superlink, ca_cert=args.ssl_ca_certfile, limits=limits)
    uvicorn.run(gate, host=host, port=port, ssl_certfile=str(args.ssl_certfile), ssl_keyfile=str(args.ssl_keyfile),
                http=timed_protocol(limits.body_idle_s), limit_concurrency=limits.connections, timeout_keep_alive=5,
                access_log=False, server_header=False, timeout_graceful_shutdown=5, log_level="info",
                proxy_headers=False)  # the gate is the edge: a client's forwarding headers name no one  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
