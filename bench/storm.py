#!/usr/bin/env python3
"""The two ends of bench/reconnect_storm.sh: long-lived API clients and the backends they reach.

  storm.py serve PORT NAME          a backend: greets every connection with "NAME\\n" at once
                                    (so the first byte through the VIP proves which live
                                    backend a client reached) and holds it open until the
                                    client goes; one asyncio loop, no limit on connections
  storm.py clients HOST PORT N OUT  N long-lived clients. Each connects, waits for the
                                    greeting (connect + first byte within 10 s, else the
                                    attempt failed), then idles as a watch does. TCP
                                    keepalive (idle 1 s, interval 1 s, 3 probes) notices a
                                    dead path: a probe that reaches the new VIP holder is
                                    answered with a reset. A broken client reconnects at once,
                                    then after a jittered back-off of 100 ms doubling to 2 s
                                    (client-go's reflector backs off too). Writes OUT.ready
                                    once all N are up; until SIGTERM appends events to OUT:
                                    `ms up|broken|fail ID [reason]`.
  storm.py report KILL_MS N OUT     the figures after KILL_MS (one line of JSON)
"""

import asyncio
import json
import random
import resource
import signal
import socket
import sys
import time

# A dial timeout as a Go client has one (client-go's is 30 s); shorter ones would make a
# slow but working path look like failures and pile retries onto it.
ATTEMPT_TIMEOUT = 10.0
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 2.0
# Clients connecting at once while the first N are opened (the storm itself is unlimited).
OPENING = 200


def now_ms():
    return time.time() * 1000.0


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(port, name):
    greeting = (name + "\n").encode()

    async def one(reader, writer):
        try:
            writer.write(greeting)
            await writer.drain()
            while await reader.read(4096):
                pass
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(one, "0.0.0.0", port, backlog=4096)
    async with server:
        await server.serve_forever()


class Clients:
    def __init__(self, host, port, n, out):
        self.host, self.port, self.n = host, port, n
        self.out = open(out, "a", buffering=1)
        self.ready_path = out + ".ready"
        self.up = 0
        self.opening = asyncio.Semaphore(OPENING)

    def event(self, kind, cid, reason=""):
        self.out.write(f"{now_ms():.1f} {kind} {cid} {reason}\n")

    async def attempt(self):
        """One connect + greeting on a raw socket (asyncio streams cost several times more
        per connection, and the client must not be what the storm measures); returns
        (socket, backend) or raises."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            await loop.sock_connect(sock, (self.host, self.port))
            line = await loop.sock_recv(sock, 64)
            if not line.endswith(b"\n"):
                raise ConnectionError("closed before the greeting")
            return sock, line.decode().strip()
        except BaseException:
            sock.close()
            raise

    async def connect(self, cid, first):
        backoff = 0.0
        while True:
            if backoff:
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            try:
                if first:
                    async with self.opening:
                        r = await asyncio.wait_for(self.attempt(), ATTEMPT_TIMEOUT)
                else:
                    r = await asyncio.wait_for(self.attempt(), ATTEMPT_TIMEOUT)
                self.event("up", cid, r[1])
                return r[0]
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                self.event("fail", cid, type(e).__name__)
                backoff = min(MAX_BACKOFF, max(FIRST_BACKOFF, backoff * 2))

    async def client(self, cid):
        loop = asyncio.get_running_loop()
        sock = await self.connect(cid, True)
        self.up += 1
        if self.up == self.n:
            open(self.ready_path, "w").close()
        while True:
            try:
                while await loop.sock_recv(sock, 4096):
                    pass
                reason = "eof"
            except OSError as e:
                reason = type(e).__name__
            sock.close()
            self.event("broken", cid, reason)
            sock = await self.connect(cid, False)


async def clients(host, port, n, out):
    c = Clients(host, port, n, out)
    await asyncio.gather(*(c.client(i) for i in range(n)))


def report(kill_ms, n, out):
    broken, up_after, fails = {}, {}, 0
    reasons = {}
    with open(out) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or float(parts[0]) < kill_ms:
                continue
            ms, kind, cid = float(parts[0]) - kill_ms, parts[1], parts[2]
            if kind == "broken":
                broken.setdefault(cid, ms)
            elif kind == "up" and cid in broken:
                up_after[cid] = ms
            elif kind == "fail":
                fails += 1
                reason = parts[3] if len(parts) > 3 else "?"
                reasons[reason] = reasons.get(reason, 0) + 1
    back = sorted(up_after.values())
    first_back = back[0] if back else None
    all_back = back[-1] if len(back) == len(broken) and back else None
    print(json.dumps({
        "clients": n,
        "broken": len(broken),
        "reestablished": len(up_after),
        "failed_attempts": fails,
        "fail_reasons": reasons,
        "first_back_ms": round(first_back) if first_back is not None else None,
        "all_back_ms": round(all_back) if all_back is not None else None,
        "storm_ms": round(all_back - first_back) if all_back is not None else None,
    }))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "serve" and len(sys.argv) == 4:
        raise_nofile()
        asyncio.run(serve(int(sys.argv[2]), sys.argv[3]))
    elif mode == "clients" and len(sys.argv) == 6:
        raise_nofile()
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(clients(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
    elif mode == "report" and len(sys.argv) == 5:
        report(float(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
