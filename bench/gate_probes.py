"""The LAN attacker's probes of issue 72, rerun against the Fleet gate of a real deployment.

Starts the guide's LAN recipe on this machine (``LocalDeployment``: SuperLink over TLS with
node authentication on 127.0.0.1, the Fleet gate on 127.0.0.2, one device) and probes the
gate as a host on the LAN would:

- ``starved``: a hundred connections each trickling an upload (1 MB declared, one byte
  sent), then a device-shaped request (``get-run``, unsigned: the SuperLink answers it at
  once with its refusal): the seconds it took through the gate and straight to the SuperLink;
- ``oversize``: a 256 MiB upload: the gate's answer and the SuperLink's peak memory
  (``VmHWM``) before and after;
- ``registration``: ``register-node`` through the gate;
- ``forwarded``: a forged ``X-Forwarded-For: 203.0.113.66``: whether the SuperLink's log names it;
- ``dot-dot``: ``POST /v1/fleet/../control/list-runs`` on a raw socket (httpx cleans the path);
- ``head``: a request head that stops halfway: the seconds until the gate drops it.

    python -m bench.gate_probes          # bench/results/gate_probes.json
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from pathlib import Path

import httpx

from bench.harness import REPO, arguments, write_report

LAN = "127.0.0.2"
ATTACKER, DEVICE = "127.0.0.3", "127.0.0.4"  # two hosts of the LAN, each its own source address
FORGED = "203.0.113.66"


def peak_kib(pid: int) -> int:
    """A process's peak resident memory (``VmHWM``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for {pid}")


def tls_socket(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection to the gate from the attacker's address."""
    raw = socket.create_connection((LAN, port), timeout=60, source_address=(ATTACKER, 0))
    return context.wrap_socket(raw, server_hostname=LAN)


def status_line(sock: ssl.SSLSocket) -> str:
    answer = b""
    while b"\r\n" not in answer:
        part = sock.recv(4096)
        if not part:
            break
        answer += part
    return answer.split(b"\r\n")[0].decode(errors="replace")


def probe(deployment) -> dict:  # noqa: ANN001 - app.local.deployment.LocalDeployment
    ca = str(deployment.certificates.ca_cert)
    context = ssl.create_default_context(cafile=ca)
    gate, direct = f"https://{LAN}:{deployment.gate_port}", f"https://127.0.0.1:{deployment.port}"
    results: dict[str, dict] = {}
    transport = httpx.HTTPTransport(verify=ca, local_address=DEVICE)
    attacker = httpx.Client(transport=httpx.HTTPTransport(verify=ca, local_address=ATTACKER), timeout=120)
    with httpx.Client(transport=transport, timeout=120) as client, attacker:
        tricklers = []
        for _ in range(100):
            sock = tls_socket(deployment.gate_port, context)
            sock.sendall(b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nx")
            tricklers.append(sock)
        timed = {}
        for name, base in (("through-gate", gate), ("direct", direct)):
            started = time.monotonic()
            response = client.post(f"{base}/v1/fleet/get-run", content=b"\x00",
                                   headers={"content-type": "application/protobuf"})  # fmt: skip
            timed[name] = {"status": response.status_code, "seconds": round(time.monotonic() - started, 3)}
        for sock in tricklers:
            sock.close()
        results["starved"] = timed

        pid = deployment.superlink.process.pid
        before = peak_kib(pid)
        started = time.monotonic()
        response = attacker.post(f"{gate}/v1/fleet/push-object", content=b"\x00" * (256 << 20))
        results["oversize"] = {"status": response.status_code, "seconds": round(time.monotonic() - started, 2),
                               "superlink-peak-mib-before": round(before / 1024, 1),
                               "superlink-peak-mib-after": round(peak_kib(pid) / 1024, 1)}  # fmt: skip

        response = attacker.post(f"{gate}/v1/fleet/register-node", content=b"\x00")
        results["registration"] = {"status": response.status_code, "detail": response.json().get("detail", "")}

        response = attacker.post(f"{gate}/v1/fleet/get-run", content=b"\x00", headers={
            "content-type": "application/protobuf", "x-forwarded-for": FORGED, "forwarded": f"for={FORGED}"})
        time.sleep(1)
        log = (deployment.logs / "superlink.log").read_text(errors="replace").splitlines()
        results["forwarded"] = {"status": response.status_code,
                                "superlink-log-lines-naming-the-forged-address": [x for x in log if FORGED in x],
                                "superlink-log-lines-naming-the-attacker": [x for x in log if ATTACKER in x][-2:]}

    sock = tls_socket(deployment.gate_port, context)
    sock.sendall(b"POST /v1/fleet/../control/list-runs HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
    results["dot-dot"] = {"status-line": status_line(sock)}
    sock.close()

    sock = tls_socket(deployment.gate_port, context)
    sock.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nHo")
    started = time.monotonic()
    closed = sock.recv(1024) == b""
    results["head"] = {"dropped": closed, "seconds": round(time.monotonic() - started, 1)}
    sock.close()
    return results


def main() -> None:
    parser = arguments(__doc__, out="gate_probes.json")
    args = parser.parse_args()
    from app.local.deployment import LocalDeployment

    with LocalDeployment(app_dir=REPO, num_nodes=1, tls=True, node_auth=True, lan_host=LAN) as deployment:
        results = probe(deployment)
    print(json.dumps(results, indent=1))
    write_report(args.out, {"benchmark": "gate probes (issue 72)", "probes": results})


if __name__ == "__main__":
    main()
