#!/usr/bin/env python3
"""netem's `delay D J loss L%` in user space, for kernels built without sch_netem.

  jitter.py PORT TAP DELAY_MS JITTER_MS LOSS_PCT

Run in the namespace of a bridge, PORT being a node's veth end that was on the bridge:
PORT leaves the bridge, a TAP device named TAP takes its place, and this process carries
the frames between the two. What the node sends (frames PORT receives) goes out on TAP
after a delay drawn uniformly from [DELAY_MS - JITTER_MS, DELAY_MS + JITTER_MS] — netem's
default distribution, reordering included — and LOSS_PCT percent of it is dropped, as
`tc qdisc add dev eth0 root netem delay 50ms 50ms loss 10%` does on the node's eth0; what
the bridge sends the node passes at once. Until SIGTERM; then PORT goes back on the bridge.

Frames travel with their virtio-net header (PACKET_VNET_HDR on PORT's packet socket,
IFF_VNET_HDR on TAP), so the checksums a veth leaves to offload and its segmentation
offload pass through intact (no ethtool needed).
"""

import fcntl
import heapq
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
BUF = 70000


def ip(*args):
    subprocess.run(["ip", *args], check=True)


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    return fd


def main():
    port, tap, delay, jitter, loss = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
    bridge = subprocess.run(
        ["ip", "-o", "link", "show", port], check=True, capture_output=True, text=True
    ).stdout.split(" master ")[1].split()[0]
    tfd = open_tap(tap)
    ip("link", "set", tap, "master", bridge, "up")
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.bind((port, 0))
    sock.setblocking(False)
    ip("link", "set", port, "nomaster")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    queue, seq = [], 0  # (due, seq, frame): the node's frames on their way to the bridge
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            try:
                os.write(tfd, heapq.heappop(queue)[2])
            except OSError:
                pass
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            ready, _, _ = select.select([sock, tfd], [], [], timeout)
        except InterruptedError:
            continue
        if sock in ready:
            while True:
                try:
                    frame, addr = sock.recvfrom(BUF)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:  # what we sent the node ourselves
                    continue
                if random.random() * 100 < loss:
                    continue
                d = max(0.0, delay + random.uniform(-jitter, jitter)) / 1000
                seq += 1
                heapq.heappush(queue, (time.monotonic() + d, seq, frame))
        if tfd in ready:
            while True:
                try:
                    frame = os.read(tfd, BUF)
                except BlockingIOError:
                    break
                try:
                    sock.send(frame)
                except OSError:
                    pass
    ip("link", "set", port, "master", bridge)
    os.close(tfd)


if __name__ == "__main__":
    main()
