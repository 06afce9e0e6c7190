#!/usr/bin/env python3
"""The API clients of bench/api_outage.sh, as `oc` and a controller see a failover.

  api_client.py new  HOST PORT OUT   a new TLS connection every 50 ms, GET /readyz, 1 s timeout
  api_client.py long HOST PORT OUT   one keep-alive TLS connection, GET /readyz every 200 ms,
                                     1 s timeout; on a failure reconnect (as a watch does);
                                     a reused connection closed before any answer is
                                     retried at once on a new one (Go's net/http does)
  api_client.py report KILL_MS NEW LONG NODE   the figures of one run (one line of JSON)

Each request is written to OUT as `sent_ms ok done_ms node why` (node: the X-Node header
of the stand-in apiserver that answered, `-` on failure; why: `-`, or on failure the
exception and the step it broke, as `ConnectionResetError@request`). Runs until SIGTERM.
"""

import json
import signal
import socket
import ssl
import sys
import threading
import time

TIMEOUT = 1.0


def now_ms():
    return time.time() * 1000.0


def tls_context():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def read_response(conn, deadline):
    """Reads one HTTP/1.1 response; returns the X-Node header value (status must be 200)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        conn.settimeout(max(0.001, deadline - time.time()))
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 200"):
        raise ConnectionError(lines[0])
    node, length = "-", 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.lower() == "x-node":
            node = v.strip()
        if k.lower() == "content-length":
            length = int(v)
    while len(body) < length:
        conn.settimeout(max(0.001, deadline - time.time()))
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return node or "-"


REQUEST = b"GET /readyz HTTP/1.1\r\nHost: api\r\nUser-Agent: api_outage\r\n\r\n"


def why(e, step):
    """What broke a request, one word: the exception's class and the step."""
    return f"{type(e).__name__}@{step}"


def one_new(host, port, ctx, out, lock):
    sent = now_ms()
    deadline = time.time() + TIMEOUT
    ok, node, err, step = 0, "-", "-", "connect"
    try:
        raw = socket.create_connection((host, port), timeout=TIMEOUT)
        try:
            raw.settimeout(max(0.001, deadline - time.time()))
            step = "tls"
            conn = ctx.wrap_socket(raw)
            step = "request"
            conn.sendall(REQUEST)
            node = read_response(conn, deadline)
            ok = 1
        finally:
            raw.close()
    except Exception as e:
        err = why(e, step)
    with lock:
        out.write(f"{sent:.0f} {ok} {now_ms():.0f} {node} {err}\n")


def run_new(host, port, path, stop):
    ctx = tls_context()
    lock = threading.Lock()
    with open(path, "w", buffering=1) as out:
        nxt = time.time()
        while not stop.is_set():
            threading.Thread(target=one_new, args=(host, port, ctx, out, lock), daemon=True).start()
            nxt += 0.05
            time.sleep(max(0.0, nxt - time.time()))
        time.sleep(TIMEOUT + 0.2)


def connect(host, port, ctx, deadline):
    raw = socket.create_connection((host, port), timeout=max(0.001, deadline - time.time()))
    raw.settimeout(max(0.001, deadline - time.time()))
    return ctx.wrap_socket(raw)


def run_long(host, port, path, stop):
    ctx = tls_context()
    conn = None
    with open(path, "w", buffering=1) as out:
        while not stop.is_set():
            sent = now_ms()
            deadline = time.time() + TIMEOUT
            ok, node, err = 0, "-", "-"
            try:
                try:
                    reused = conn is not None
                    if conn is None:
                        conn = connect(host, port, ctx, deadline)
                    conn.sendall(REQUEST)
                    node = read_response(conn, deadline)
                except ConnectionError as e:
                    # Go's net/http (client-go) retries a request at once on a new
                    # connection when a reused one was closed before any answer.
                    if not (reused and str(e) == "closed"):
                        raise
                    conn.close()
                    conn = connect(host, port, ctx, deadline)
                    conn.sendall(REQUEST)
                    node = read_response(conn, deadline)
                ok = 1
            except Exception as e:
                err = why(e, "reused" if reused else "new")
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
            out.write(f"{sent:.0f} {ok} {now_ms():.0f} {node} {err}\n")
            time.sleep(max(0.0, 0.2 - (now_ms() - sent) / 1000.0))


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 4:
                rows.append((float(p[0]), p[1] == "1", float(p[2]), p[3], p[4] if len(p) > 4 else "-"))
    return sorted(rows)


def report(kill_ms, new_path, long_path, killed_node):
    new = load(new_path)
    after = [r for r in new if r[0] >= kill_ms]
    before_fail = sum(1 for r in new if r[0] < kill_ms - TIMEOUT * 1000 and not r[1])
    fails = [r for r in after if not r[1]]
    # The VIP answers again when the first request sent after the kill succeeds (the
    # earliest answer: a request sent earlier may still succeed later, on a retransmitted
    # SYN). Failures of requests sent after that moment are what the bar forbids.
    # Requests that were still on their way when the link went may succeed: the outage
    # begins at the first failure.
    first_fail = min((r[0] for r in fails), default=None)
    oks = [r[2] for r in after if r[1] and first_fail is not None and r[0] >= first_fail]
    back = min(oks) if oks else None
    # No failure at all: the VIP never stopped answering.
    back_ms = back - kill_ms if back is not None else (0.0 if not fails else None)
    last_fail_ms = (max(r[2] for r in fails) - kill_ms) if fails else 0.0
    after_back = [r for r in fails if back is not None and r[0] > back]
    longs = load(long_path)
    served = next((r for r in longs if r[0] >= kill_ms and r[1] and r[3] != killed_node), None)
    long_fails = sum(1 for r in longs if r[0] >= kill_ms and not r[1])
    print(json.dumps({
        "requests": len(after),
        "failed": len(fails),
        "failed_before_kill": before_fail,
        "vip_back_ms": back_ms,
        "last_failure_ms": last_fail_ms,
        "failed_after_vip_back": len(after_back),
        "long_reconnect_ms": (served[2] - kill_ms) if served else None,
        "long_failed": long_fails,
        # When each failed request was sent (ms after the event) and what broke it.
        "failures": [[round(r[0] - kill_ms), r[4]] for r in fails][:10],
    }))


def main():
    mode = sys.argv[1]
    if mode == "report":
        report(float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
        return
    host, port, path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    (run_new if mode == "new" else run_long)(host, port, path, stop)


if __name__ == "__main__":
    main()
