"""The Fleet gate under hostile clients: what a LAN host may send it, and that devices are served meanwhile.

The first half drives the gate's ASGI app in this process against a stand-in SuperLink that
records what reaches it; the second starts the gate as the guide does (``python -m
app.local.fleet_gate``, TLS, uvicorn) in front of a stand-in SuperLink served over TLS here,
and attacks it over real sockets: a hundred trickling uploads, trickling request heads, an
oversize body, a raw ``..`` path (httpx would clean it before sending).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import REPO
from helpers import can_bind, through_gate

from app.local.credentials import make_certificates
from app.local.fleet_gate import fleet_routes
from app.local.gate_policy import REGISTRATION_PATHS, BodyRefusedError, ClientSlots, GateLimits, nginx_config
from app.local.gate_policy import read_body as gate_read_body

ROUTE = "/v1/fleet/get-run"


@pytest.fixture(scope="module")
def ca_cert(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("gate")).ca_cert


# ------------------------------------------------------------------ in this process


@pytest.mark.parametrize("path", sorted(REGISTRATION_PATHS))
def test_a_device_cannot_register_or_unregister_itself_through_the_gate(ca_cert, path):
    response, reached = through_gate(ca_cert, "POST", path, content=b"\x00key")
    assert response.status_code == 403 and not reached
    assert ("POST", path) not in fleet_routes()


def test_an_oversize_body_is_refused_413_before_the_superlink_sees_it(ca_cert):
    cap = GateLimits().body_cap
    assert cap == 11 * (1 << 20)  # two 5 MiB chunks of Flower's and 1 MiB
    response, reached = through_gate(ca_cert, "POST", "/v1/fleet/push-object", content=b"x" * (cap + 1))
    assert response.status_code == 413 and not reached and response.headers["connection"] == "close"

    async def chunked():  # no content-length: counted as it comes
        for _ in range(cap // (1 << 20) + 2):
            yield b"y" * (1 << 20)

    response, reached = through_gate(ca_cert, "POST", "/v1/fleet/push-object", content=chunked())
    assert response.status_code == 413 and not reached
    response, reached = through_gate(ca_cert, "POST", "/v1/fleet/push-object", content=b"z" * cap)
    assert response.status_code == 200 and len(reached[0].content) == cap  # the largest a device sends passes


def test_forwarding_headers_are_set_from_the_peer_and_connection_named_headers_dropped(ca_cert):
    forged = {"x-forwarded-for": "203.0.113.66", "forwarded": "for=203.0.113.66", "x-real-ip": "203.0.113.66",
              "x-forwarded-host": "evil", "connection": "keep-alive, x-secret", "x-secret": "hop",
              "flwr-signature": "c2ln"}  # fmt: skip
    response, (request,) = through_gate(ca_cert, "POST", ROUTE, content=b"\x00", headers=forged)
    assert response.status_code == 200
    assert request.headers.get_list("x-forwarded-for") == ["127.0.0.1"]  # the ASGI transport's client address
    for name in ("forwarded", "x-real-ip", "x-forwarded-host", "x-secret"):
        assert name not in request.headers, name
    assert request.headers["flwr-signature"] == "c2ln"  # the device's own headers pass unchanged


def test_one_address_may_hold_only_so_many_requests():
    slots = ClientSlots(2)
    assert slots.take("10.0.0.5") and slots.take("10.0.0.5") and not slots.take("10.0.0.5")
    assert slots.take("10.0.0.6")  # another device is not held back
    slots.give_back("10.0.0.5")
    assert slots.take("10.0.0.5")


@pytest.mark.parametrize("pace", ["stalls", "trickles"])
def test_a_body_that_stalls_or_trickles_is_refused_408(pace):
    limits = GateLimits(body_idle_s=0.3, min_rate=100)

    async def receive():
        await asyncio.sleep(1.0 if pace == "stalls" else 0.1)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def read():
        started = time.monotonic()
        with pytest.raises(BodyRefusedError) as refused:
            await gate_read_body(receive, [(b"content-length", b"20")], limits)  # 0.3 s + 20 bytes at 100/s
        return refused.value.status, time.monotonic() - started

    status, took = asyncio.run(read())
    assert status == 408 and took < 1.0


def test_the_nginx_configuration_has_the_gate_s_routes_and_limits():
    limits = GateLimits()
    text = nginx_config(fleet_routes(), listen="192.168.1.10:9100", upstream="127.0.0.1:9101", limits=limits)
    locations = [line.split()[2] for line in text.splitlines() if line.strip().startswith("location = ")]
    assert sorted(locations) == sorted(path for _, path in fleet_routes())
    assert not set(locations) & REGISTRATION_PATHS
    assert "location / { return 403; }" in text and "client_max_body_size 11264k;" in text
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in text and "limit_conn stamen_fleet 8;" in text


# ------------------------------------------------------------------ the gate as the guide starts it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served_gate(tmp_path_factory):
    """The gate in its own process (1 s idle limit) before a TLS stand-in SuperLink that counts what reaches it."""
    import uvicorn

    if not can_bind("127.0.0.2"):
        pytest.skip("127.0.0.2 is not a local address here (Linux has it): the device needs a second host")

    certs = make_certificates(tmp_path_factory.mktemp("served-gate"))
    reached: list[tuple[str, str, int]] = []
    forwarded: list[bytes | None] = []  # the x-forwarded-for each request reached the SuperLink with

    async def superlink(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reached.append((scope["method"], scope["path"], len(body)))
        forwarded.append(dict(scope["headers"]).get(b"x-forwarded-for"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    upstream_port, gate_port = _free_port(), _free_port()
    server = uvicorn.Server(uvicorn.Config(superlink, host="127.0.0.1", port=upstream_port, log_level="error",
                                           ssl_certfile=str(certs.server_cert), ssl_keyfile=str(certs.server_key)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    gate = subprocess.Popen([sys.executable, "-m", "app.local.fleet_gate", "--listen", f"127.0.0.1:{gate_port}",
                             "--superlink", f"127.0.0.1:{upstream_port}", "--ssl-certfile", str(certs.server_cert),
                             "--ssl-keyfile", str(certs.server_key), "--ssl-ca-certfile", str(certs.ca_cert),
                             "--idle-seconds", "1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # the device dials from 127.0.0.2, the attackers from 127.0.0.1: two hosts, as on a LAN
    transport = httpx.HTTPTransport(verify=str(certs.ca_cert), local_address="127.0.0.2")
    client = httpx.Client(base_url=f"https://127.0.0.1:{gate_port}", transport=transport, timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            client.post(ROUTE, content=b"warm")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline and gate.poll() is None, "the gate did not start"
            time.sleep(0.2)
    context = ssl.create_default_context(cafile=str(certs.ca_cert))
    yield client, gate_port, context, reached, forwarded
    client.close()
    gate.terminate()
    try:
        gate.wait(timeout=30)
    except subprocess.TimeoutExpired:
        gate.kill()
        raise
    server.should_exit = True
    thread.join(timeout=30)


def _tls_socket(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_a_device_is_served_while_a_hundred_uploads_trickle_in(served_gate):
    client, port, context, reached, _ = served_gate
    head = b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
    tricklers = []
    for _ in range(100):
        sock = _tls_socket(port, context)
        sock.sendall(head + b"x")
        tricklers.append(sock)
    before = len(reached)
    started = time.monotonic()
    response = client.post(ROUTE, content=b"\x00device")
    took = time.monotonic() - started
    assert response.status_code == 200 and took < 5.0, took  # a SuperNode waits 30 s
    assert reached[before:] == [("POST", ROUTE, 7)]  # no trickled upload reached the SuperLink
    for sock in tricklers:
        sock.close()


def test_a_request_head_that_trickles_is_dropped(served_gate):
    _, port, context, _, _ = served_gate
    sock = _tls_socket(port, context)
    sock.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nHo")
    started = time.monotonic()
    assert sock.recv(1024) == b""  # the gate closed it: no whole head within the idle limit
    assert time.monotonic() - started < 5.0
    sock.close()


@pytest.mark.parametrize("target", ["/v1/fleet/../control/list-runs", "/v1/fleet/%2e%2e/control/list-runs",
                                    "//v1/fleet/get-run", "/v1/fleet/get-run;x"])  # fmt: skip
def test_a_raw_path_with_dot_segments_is_refused_as_sent(served_gate, target):
    _, port, context, reached, _ = served_gate
    before = len(reached)
    sock = _tls_socket(port, context)
    sock.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403"), answer[:80]
    assert len(reached) == before


def test_a_forged_forwarding_header_from_a_trusted_address_names_no_one(served_gate):
    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told not to: the gate must not, being the edge
    _, port, context, _, forwarded = served_gate
    sock = _tls_socket(port, context)
    sock.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.66\r\n"
                 b"Content-Length: 1\r\n\r\nx")  # fmt: skip
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200") and forwarded[-1] == b"127.0.0.1"
