#!/usr/bin/env python3
"""Scenario 6 of the VM test, from the host: the guest's kubelet API (forwarded to
127.0.0.1:PORT by qemu) with a client certificate the test made. Reads the container's
log, /stats/summary (v2 figures: memory working set, CPU usage) and execs into the
container over WebSocket; the last exec writes /shared/api-done, which lets the guest go
on. Prints one `VMTEST PASS|FAIL 6 kubelet-api...` line.

    kubelet_api.py PORT CERT KEY POD CONTAINER
"""
import json
import ssl
import sys
import time
import urllib.parse
import urllib.request

import websocket

port, cert, key, pod, container = sys.argv[1:6]
base = f"https://127.0.0.1:{port}"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE  # the agent's serving certificate is its own self-signed one
ctx.load_cert_chain(cert, key)


def get(path):
    with urllib.request.urlopen(base + path, context=ctx, timeout=60) as r:
        return r.status, r.read().decode()


def exec_(command):
    """Runs COMMAND in the container: (stdout, stderr, status object)."""
    q = "&".join("command=" + urllib.parse.quote(c) for c in command)
    url = f"wss://127.0.0.1:{port}/exec/default/{pod}/{container}?{q}&stdout=true&stderr=true"
    ws = websocket.create_connection(
        url,
        sslopt={"cert_reqs": ssl.CERT_NONE, "certfile": cert, "keyfile": key},
        subprotocols=["v4.channel.k8s.io"],
        timeout=60,
    )
    out = {1: b"", 2: b"", 3: b""}
    while True:
        op, data = ws.recv_data(control_frame=False)
        if op == websocket.ABNF.OPCODE_CLOSE or not data:
            break
        out[data[0]] = out.get(data[0], b"") + data[1:]
    ws.close()
    status = json.loads(out[3] or b"{}")
    return out[1].decode(), out[2].decode(), status


bad = []
info = []
try:
    status, body = get(f"/containerLogs/default/{pod}/{container}?tailLines=1000")
    if status != 200 or "hello from" not in body:
        bad.append(f"containerLogs: {status} without 'hello from': {body[:200]!r}")
except Exception as e:  # noqa: BLE001 - any failure is the scenario's failure
    bad.append(f"containerLogs: {e}")

try:
    # The first figures may need a housekeeping round: poll with a deadline.
    deadline = time.monotonic() + 60
    while True:
        status, body = get("/stats/summary")
        summary = json.loads(body)
        node = summary.get("node", {})
        ws_node = node.get("memory", {}).get("workingSetBytes") or 0
        cpu_node = node.get("cpu", {}).get("usageCoreNanoSeconds") or 0
        mine = [p for p in summary.get("pods", []) if p.get("podRef", {}).get("name") == pod]
        ws_pod = mine[0].get("memory", {}).get("workingSetBytes", 0) if mine else 0
        cpu_pod = mine[0].get("cpu", {}).get("usageCoreNanoSeconds", 0) if mine else 0
        if ws_node > 0 and cpu_node > 0 and ws_pod > 0 and cpu_pod > 0:
            info.append(f"stats node workingSet {ws_node} B cpu {cpu_node} ns; "
                        f"{pod} workingSet {ws_pod} B cpu {cpu_pod} ns")
            break
        if time.monotonic() > deadline:
            bad.append(f"/stats/summary without v2 figures: node ws {ws_node} cpu {cpu_node}, "
                       f"pod ws {ws_pod} cpu {cpu_pod}")
            break
        time.sleep(1)
except Exception as e:  # noqa: BLE001
    bad.append(f"/stats/summary: {e}")

try:
    out, err, st = exec_(["sh", "-c", "uname -m; echo oops >&2; exit 3"])
    if not out.strip() or "oops" not in err or st.get("status") != "Failure" \
            or "3" not in json.dumps(st.get("details", {})):
        bad.append(f"exec: stdout {out!r} stderr {err!r} status {st}")
    else:
        info.append(f"exec answered uname -m = {out.strip()}")
except Exception as e:  # noqa: BLE001
    bad.append(f"exec: {e}")

try:
    out, err, st = exec_(["sh", "-c", "echo done > /shared/api-done"])
    if st.get("status") != "Success":
        bad.append(f"the last exec: {st} {err!r}")
except Exception as e:  # noqa: BLE001
    bad.append(f"the last exec: {e}")

for line in info:
    print(f"VMTEST INFO {line}")
if bad:
    print("VMTEST FAIL 6 kubelet-api: " + "; ".join(bad))
    sys.exit(1)
print("VMTEST PASS 6 kubelet-api")
