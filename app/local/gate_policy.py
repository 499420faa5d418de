"""What the Fleet gate lets through, and how much of it: routes, headers, body size and pace, connections.

:class:`GateLimits` holds every number, sized from Flower's own (a SuperNode's request times
out after 30 s, ``flwr/supercore/protobuf/client.py``; objects travel in chunks of at most
``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MiB, ``flwr/common/constant.py``), so a device is
always served within its own timeout while a host that trickles or floods is cut off. The
gate (``app/local/fleet_gate.py``) and the nginx configuration it prints
(:func:`nginx_config`) apply the same rules; docs/deployment.md#the-fleet-gate says why each.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

MIB = 1 << 20
# a SuperNode never registers or unregisters itself when it holds a key (node authentication), and without
# authentication anyone who can reach the gate could enrol: the gate keeps both routes on the SuperLink host
REGISTRATION_PATHS = frozenset({"/v1/fleet/register-node", "/v1/fleet/unregister-node"})
# hop-by-hop headers belong to one connection; host names the gate, not the SuperLink
HOP_BY_HOP = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
                        b"proxy-authorization", b"proxy-connection", b"content-length"})  # fmt: skip
# the SuperLink believes these from 127.0.0.1, where the gate dials it from: a device may not choose what it logs
FORWARDING = frozenset({b"forwarded", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto",
                        b"x-forwarded-port", b"x-real-ip"})  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class GateLimits:
    """The gate's numbers (see the module's docstring).

    Parameters
    ----------
    body_cap
        The largest request body passed on, in bytes: two of Flower's object chunks and 1 MiB
        of message around them (a push-object carries one chunk; others are a few kB). Larger
        is answered 413 before the SuperLink sees a byte.
    body_idle_s
        Longest wait for the next piece of a body (the SuperNode's own request timeout), and
        for a request's head: a request that stalls is answered 408 and dropped.
    min_rate
        The slowest upload a device may make, bytes per second, once ``body_idle_s`` has
        passed: a body that trickles without ever pausing is dropped too (408).
    per_client
        Requests one address may have in the gate at once (a SuperNode has one or two:
        its work and its heartbeat); more are answered 429.
    connections
        Connections the gate holds in all (uvicorn's ``limit_concurrency``; beyond, 503).
    upstream_connections
        Connections to the SuperLink at most (an explicit pool: bodies are read whole
        before one is taken, so a trickling host never holds one).
    upstream_s
        Longest wait on the SuperLink for one request (the SuperNode's own timeout).

    """

    body_cap: int = 2 * FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + MIB
    body_idle_s: float = 30.0
    min_rate: int = 16 * 1024
    per_client: int = 8
    connections: int = 512
    upstream_connections: int = 64
    upstream_s: float = 30.0


class BodyRefusedError(Exception):
    """A request body the gate does not pass on: ``status`` and the line that says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


async def read_body(receive: Receive, headers: Iterable[tuple[bytes, bytes]], limits: GateLimits) -> bytes:
    """The whole request body, or :class:`BodyRefusedError`: too large (413), too slow (408), cut off (400).

    A declared ``content-length`` above the cap is refused before a byte is read. A body
    must keep coming (a part every ``body_idle_s``) and arrive whole within ``body_idle_s``
    plus its declared size at ``min_rate``: a trickle is cut off even when it never pauses.
    """
    declared = dict((name.lower(), value) for name, value in headers).get(b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limits.body_cap):
        raise BodyRefusedError(413, f"stamen fleet gate: a body of {declared.decode(errors='replace')[:20]} bytes "
                                    f"is over the {limits.body_cap} bytes a device ever sends")  # fmt: skip
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limits.body_idle_s + (int(declared) if declared else 0) / limits.min_rate
    parts, size = [], 0
    while True:
        wait = min(limits.body_idle_s, give_up - loop.time())
        try:
            message = await asyncio.wait_for(receive(), timeout=max(wait, 0.0))
        except asyncio.TimeoutError:
            raise BodyRefusedError(408, f"stamen fleet gate: the body came too slowly ({size} bytes; a device's "
                                        f"keeps {limits.min_rate} bytes/s)") from None  # fmt: skip
        if message["type"] == "http.disconnect":
            raise BodyRefusedError(400, "stamen fleet gate: the client went away mid-body")
        part = message.get("body", b"")
        size += len(part)
        if size > limits.body_cap:
            raise BodyRefusedError(413, f"stamen fleet gate: a body over the {limits.body_cap} bytes a device sends")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def forwarded_headers(headers: Iterable[tuple[bytes, bytes]], peer: str | None) -> list[tuple[bytes, bytes]]:
    """The request's headers as the SuperLink gets them.

    Hop-by-hop headers and those the request's own ``Connection`` names go; forwarding
    headers go, and ``X-Forwarded-For`` is set to the device's address as the gate saw it.
    """
    headers = list(headers)
    named = {token.strip().lower() for name, value in headers if name.lower() == b"connection"
             for token in value.split(b",")}  # fmt: skip
    kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP | FORWARDING and n.lower() not in named]
    return kept + ([(b"x-forwarded-for", peer.encode())] if peer else [])


class ClientSlots:
    """How many requests each address has in the gate now; :meth:`take` refuses one over ``per_client``."""

    def __init__(self, per_client: int) -> None:
        self.per_client, self.active = per_client, {}

    def take(self, peer: str) -> bool:
        if self.active.get(peer, 0) >= self.per_client:
            return False
        self.active[peer] = self.active.get(peer, 0) + 1
        return True

    def give_back(self, peer: str) -> None:
        self.active[peer] -= 1
        if not self.active[peer]:
            del self.active[peer]


def printable(text: str, limit: int = 200) -> str:
    """``text`` for one log line: non-printable characters escaped, at most ``limit`` characters."""
    return text.encode("unicode_escape").decode("ascii")[:limit]


def nginx_config(routes: Iterable[tuple[str, str]], *, listen: str, upstream: str, limits: GateLimits) -> str:
    """An nginx ``server`` block doing what the gate does, for an operator who runs nginx already.

    One exact ``location`` per route (its method only), 403 for anything else, the same body
    cap and timeouts, forwarding headers set from the peer, and per-address connection limits.
    """
    lines = ["# generated by: python -m app.local.fleet_gate --print-nginx (the same routes and limits as the gate)",
             "# in the http block: limit_conn_zone $binary_remote_addr zone=stamen_fleet:10m;",
             "server {", f"    listen {listen} ssl;", "    ssl_certificate     /path/to/certs/server.pem;",
             "    ssl_certificate_key /path/to/certs/server.key;", "    server_tokens off;",
             f"    client_max_body_size {math.ceil(limits.body_cap / 1024)}k;",
             f"    client_body_timeout {limits.body_idle_s:g}s;", f"    client_header_timeout {limits.body_idle_s:g}s;",
             f"    limit_conn stamen_fleet {limits.per_client};", "    proxy_request_buffering on;",
             "    proxy_ssl_trusted_certificate /path/to/certs/ca.crt;", "    proxy_ssl_verify on;",
             f"    proxy_read_timeout {limits.upstream_s:g}s;", "    proxy_set_header Forwarded \"\";",
             "    proxy_set_header X-Forwarded-Host \"\";", "    proxy_set_header X-Forwarded-Proto \"\";",
             "    proxy_set_header X-Real-IP \"\";", "    proxy_set_header X-Forwarded-For $remote_addr;",
             "    location / { return 403; }"]  # fmt: skip
    for method, path in sorted(routes):
        only = f"limit_except {method} {{ deny all; }}"
        lines.append(f"    location = {path} {{ {only} proxy_pass https://{upstream}; }}")
    return "\n".join([*lines, "}"]) + "\n"
