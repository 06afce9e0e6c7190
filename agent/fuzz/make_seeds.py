#!/usr/bin/env python3
"""Writes the seed corpora in seeds/<target>/ (committed; rerun only to change them).

Seeds are valid inputs each target's parser accepts, so the fuzzer starts from inside the
format rather than from noise: the repository's fixtures (testdata/openstack-metadata,
examples/install-config*.yaml, agent/src/dns/testdata/cluster.json) as they are, config
drives packed from those fixtures with the same tools the unit tests use (xorriso,
mkfs.vfat + mcopy), and packets and requests built here byte by byte after the formats the
agent speaks. Deterministic: the same run writes the same bytes (xorriso and mkfs.vfat get
SOURCE_DATE_EPOCH and a fixed volume id).

    python3 agent/fuzz/make_seeds.py
"""

import gzip
import hashlib
import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SEEDS = os.path.join(HERE, "seeds")
FIXTURES = os.path.join(REPO, "testdata", "openstack-metadata")


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def frames(*packets):
    """The length-prefixed packet sequence the stateful targets read (src/lib.rs frames)."""
    return b"".join(struct.pack(">H", len(p)) + p for p in packets)


# --- DNS wire format -------------------------------------------------------------------

def dns_name(n):
    labels = [l for l in n.rstrip(".").split(".") if l]
    return b"".join(bytes([len(l)]) + l.encode() for l in labels) + b"\0"


def dns_query(qid, qname, qtype, qclass=1, edns=None, rd=True, questions=None, opcode=0):
    qs = questions if questions is not None else [(qname, qtype, qclass)]
    flags = (opcode << 11) | (0x0100 if rd else 0)
    out = struct.pack(">HHHHHH", qid, flags, len(qs), 0, 0, 1 if edns else 0)
    for n, t, c in qs:
        out += dns_name(n) + struct.pack(">HH", t, c)
    if edns:
        size, version = edns
        out += b"\0" + struct.pack(">HHBBHH", 41, size, 0, version, 0x8000, 0)
    return out


def rr(name, rtype, rclass, ttl, rdata):
    return dns_name(name) + struct.pack(">HHIH", rtype, rclass, ttl, len(rdata)) + rdata


A, NS, SOA, PTR, TXT, AAAA, SRV, ANY = 1, 2, 6, 12, 16, 28, 33, 255


def dns_seeds():
    t = "dns_handler"
    zone = "ocp4.example.com"
    write(t, "api-a", dns_query(0x1234, f"api.{zone}", A))
    write(t, "api-int-aaaa-edns", dns_query(0x1235, f"api-int.{zone}", AAAA, edns=(1232, 0)))
    write(t, "apps-wildcard", dns_query(7, f"console-openshift-console.apps.{zone}", A))
    write(t, "node-name", dns_query(8, f"master-0.{zone}", A, edns=(4096, 0)))
    write(t, "short-node-name", dns_query(9, "worker-0", AAAA))
    write(t, "soa-ns-any", dns_query(10, zone, SOA) )
    write(t, "any", dns_query(11, f"api.{zone}", ANY, edns=(512, 0)))
    write(t, "nxdomain", dns_query(12, f"nope.{zone}", A))
    write(t, "foreign-forward", dns_query(13, "www.example.org", A, edns=(1232, 0)))
    write(t, "class-chaos", dns_query(14, f"api.{zone}", A, qclass=3))
    write(t, "edns-version-1", dns_query(15, f"api.{zone}", A, edns=(1232, 1)))
    write(t, "two-questions", dns_query(16, None, None, questions=[(f"api.{zone}", A, 1), ("b", A, 1)]))
    write(t, "opcode-status", dns_query(17, f"api.{zone}", A, opcode=2))
    # A question whose name ends in a compression pointer to the zone name of an earlier one.
    p = dns_query(18, f"api.{zone}", A)
    write(t, "compressed-pointer", p[:-5] + b"\xc0\x10" + p[-4:])
    write(t, "pointer-loop", bytes.fromhex("abcd01000001000000000000") + b"\xc0\x0c\x00\x01\x00\x01")
    # The etcd names (the target serves them for its two masters): the SRV set with its
    # additional addresses, an etcd-<i> name, and a query with an EDNS cookie option (read
    # in place) and one with client subnet (left to hickory).
    write(t, "etcd-server-srv", dns_query(19, f"_etcd-server-ssl._tcp.{zone}", SRV))
    write(t, "etcd-client-srv-edns", dns_query(20, f"_etcd-client-ssl._tcp.{zone}", SRV, edns=(1232, 0)))
    write(t, "etcd-name", dns_query(21, f"etcd-1.{zone}", AAAA))
    cookie = dns_query(22, f"etcd-0.{zone}", A, edns=(1232, 0))
    write(t, "edns-cookie", cookie[:-2] + struct.pack(">HHH", 12, 10, 8) + b"\x01" * 8)
    write(t, "edns-client-subnet", cookie[:-2] + struct.pack(">HHHHBB", 11, 8, 7, 1, 24, 0) + b"\x0a\x00\x00")


def mdns_announce(node, zone, addrs, ttl=35, role="master"):
    inst = f"{node}._keelson._tcp.local"
    host = f"{node}.local"
    answers = [
        rr("_keelson._tcp.local", PTR, 1, ttl, dns_name(inst)),
        rr(inst, SRV, 0x8001, ttl, struct.pack(">HHH", 0, 0, 22623) + dns_name(host)),
        rr(inst, TXT, 0x8001, ttl, b"".join(
            bytes([len(s)]) + s for s in
            [f"role={role}".encode(), f"cluster={zone}".encode(), b"version=0.1.0"])),
    ]
    for a in addrs:
        if ":" in a:
            import ipaddress
            answers.append(rr(host, AAAA, 0x8001, ttl, ipaddress.IPv6Address(a).packed))
        else:
            answers.append(rr(host, A, 0x8001, ttl, bytes(int(x) for x in a.split("."))))
    return answers


def mdns_response(records):
    return struct.pack(">HHHHHH", 0, 0x8400, 0, len(records), 0, 0) + b"".join(records)


def mdns_seeds():
    t = "mdns_packet"
    zone = "ocp4.example.com"
    recs = mdns_announce("master-1", zone, ["10.0.0.11", "fd00::11"])
    write(t, "announce", frames(mdns_response(recs)))
    write(t, "announce-then-goodbye", frames(
        mdns_response(recs), mdns_response(mdns_announce("master-1", zone, ["10.0.0.11"], ttl=0))))
    # avahi sends service and host records in separate packets.
    write(t, "split-packets", frames(mdns_response(recs[:3]), mdns_response(recs[3:])))
    write(t, "other-cluster", frames(mdns_response(mdns_announce("w-9", "other.example", ["10.0.0.99"], role="worker"))))
    write(t, "link-local-only", frames(mdns_response(mdns_announce("w-1", zone, ["169.254.3.4", "fe80::1"]))))
    browse = struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + dns_name("_keelson._tcp.local") + struct.pack(">HH", PTR, 1)
    resolve = struct.pack(">HHHHHH", 0, 0, 2, 0, 0, 0) + b"".join(
        dns_name(n) + struct.pack(">HH", q, 0x8001)
        for n, q in [("master-0._keelson._tcp.local", SRV), ("master-0.local", A)])
    write(t, "queries", frames(browse, resolve))


# --- DHCP ----------------------------------------------------------------------------

def ip(a):
    return bytes(int(x) for x in a.split("."))


def dhcp(kind, xid=0x01020304, yiaddr="10.1.0.9", options=()):
    mac = bytes.fromhex("525400000001")
    out = struct.pack(">BBBBIHH", 2, 1, 6, 0, xid, 0, 0x8000)
    out += ip("0.0.0.0") + ip(yiaddr) + ip("10.1.0.1") + ip("0.0.0.0")
    out += mac + bytes(10) + bytes(64) + bytes(128) + bytes([99, 130, 83, 99])
    opts = [(53, bytes([kind])), (54, ip("10.1.0.1"))] + list(options)
    for code, value in opts:
        out += bytes([code, len(value)]) + value
    return out + b"\xff"


LEASE = [
    (1, ip("255.255.255.0")), (3, ip("10.1.0.1")), (6, ip("10.1.0.53") + ip("10.1.0.54")),
    (51, struct.pack(">I", 120)), (58, struct.pack(">I", 60)), (59, struct.pack(">I", 105)),
    (26, struct.pack(">H", 1450)), (15, b"example.internal"),
]
OFFER, ACK, NAK = 2, 5, 6


def dhcp_seeds():
    t = "dhcp_reply"
    write(t, "offer-ack", frames(dhcp(OFFER, options=LEASE), dhcp(ACK, options=LEASE)))
    write(t, "offer-ack-renew", frames(dhcp(OFFER, options=LEASE), dhcp(ACK, options=LEASE),
                                       dhcp(ACK, xid=0x01020305, options=LEASE)))
    write(t, "offer-nak", frames(dhcp(OFFER, options=LEASE), dhcp(NAK, yiaddr="0.0.0.0")))
    write(t, "bare-ack", frames(dhcp(OFFER), dhcp(ACK)))


# --- members and the Ignition server ------------------------------------------------

def registration(name="master-0", zone="ocp4.example.com", addrs=("10.0.0.11",)):
    return json.dumps({"cluster": zone, "member": {
        "name": name, "role": "master", "addresses": list(addrs), "version": "0.1.0"}},
        separators=(",", ":")).encode()


def members_seeds():
    t = "members_registry"
    write(t, "post", b"\x01\n" + registration())
    write(t, "post-two-addresses", b"\x01\n" + registration("worker-1", addrs=("10.0.0.21", "fd00::21")))
    write(t, "post-other-cluster", b"\x01\n" + registration(zone="other.example"))
    write(t, "get", b"\x00\n")
    write(t, "delete", b"\x02/keelson/v1/members/master-0\n")
    entries = json.dumps([{"member": json.loads(registration())["member"], "ageMs": 1500}]).encode()
    write(t, "get-with-entry-list-body", b"\x00\n" + entries)

    t = "ignition_http"
    ign3 = "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1"
    ign2 = ("application/vnd.coreos.ignition+json; version=2.2.0, "
            "application/vnd.coreos.ignition+json; version=1; q=0.5, */*; q=0.1")
    get = lambda path, accept=None: (f"GET {path} HTTP/1.1\r\nHost: 10.0.0.5:22623\r\n"
                                     + (f"Accept: {accept}\r\n" if accept else "") + "\r\n").encode()
    write(t, "config-master-v3", b"\x00" + get("/config/master", ign3))
    write(t, "config-worker-v2", b"\x00" + get("/config/worker", ign2))
    write(t, "config-outside-network", b"\x01" + get("/config/master", ign3))
    write(t, "healthz-and-asset-pipelined", b"\x00" + get("/healthz") + get("/assets/keelson-agent"))
    body = registration()
    post = (f"POST /keelson/v1/members HTTP/1.1\r\nHost: 10.0.0.5:22623\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    write(t, "member-post", b"\x00" + post)
    chunked = (b"POST /keelson/v1/members HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    write(t, "member-post-chunked", b"\x00" + chunked)
    write(t, "member-delete-and-get", b"\x00" + (
        b"DELETE /keelson/v1/members/master-0 HTTP/1.1\r\nHost: x\r\n\r\n" + get("/keelson/v1/members")))
    write(t, "head-two-accept-lines", b"\x00" + (
        b"HEAD /config/master HTTP/1.1\r\nHost: x\r\nAccept: */*;q=0.1\r\n"
        b"Accept: application/vnd.coreos.ignition+json;version=3.4.0\r\n\r\n"))

    t = "accept_header"
    for i, h in enumerate([
        ign3, ign2, "*/*", "", "application/vnd.coreos.ignition+json;version=3.2.7",
        "application/vnd.coreos.ignition+json;version=3.1.0-experimental",
        "application/vnd.coreos.ignition+json; version=2.1.0, application/vnd.coreos.ignition+json; "
        "version=1; q=0.5, */*; q=0.1",
        "application/vnd.coreos.ignition+json;version=3.9.0;q=0.9, "
        "application/vnd.coreos.ignition+json;version=\"2.2.0\";q=1.000",
        "application/vnd.coreos.ignition+json;version=4.0.0, text/html;q=0",
    ]):
        write(t, f"accept-{i}", h)


# --- Ignition user_data and data URLs ----------------------------------------------

def data_url(b):
    return "data:;base64," + base64.b64encode(b).decode()


def apply_seeds():
    t = "ignition_apply"
    cluster = open(os.path.join(REPO, "agent", "src", "dns", "testdata", "cluster.json"), "rb").read()
    big = b"big file contents\n"
    gz = gzip.compress(big, mtime=0)
    files_v3 = {
        "ignition": {"version": "3.2.0"},
        "storage": {
            "directories": [{"path": "/var/lib/keelson", "mode": 448}],
            "files": [
                {"path": "/etc/keelson/cluster.json", "mode": 420,
                 "contents": {"source": data_url(cluster),
                              "verification": {"hash": "sha512-" + hashlib.sha512(cluster).hexdigest()}}},
                {"path": "/etc/keelson/role", "contents": {"source": "data:,master%0A"}},
                {"path": "/etc/big", "mode": 384,
                 "contents": {"source": data_url(gz), "compression": "gzip",
                              "verification": {"hash": "sha256-" + hashlib.sha256(big).hexdigest()}}},
            ],
        },
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA k"]},
                             {"name": "other", "passwordHash": "x"}]},
        "systemd": {"units": [{"name": "keelson-agent.service", "enabled": True},
                              {"name": "operator.service", "enabled": True}]},
    }
    write(t, "files-v3", json.dumps(files_v3))
    child = {"ignition": {"version": "3.2.0"},
             "storage": {"files": [{"path": "/etc/keelson/role", "contents": {"source": "data:,worker"}}]}}
    child_bytes = json.dumps(child).encode()
    merge = {"ignition": {"version": "3.2.0", "config": {"merge": [
        {"source": data_url(child_bytes),
         "verification": {"hash": "sha512-" + hashlib.sha512(child_bytes).hexdigest()}}]},
        "security": {"tls": {"certificateAuthorities": [{"source": "data:,-----BEGIN%20CERTIFICATE-----"}]}}}}
    write(t, "merge-data-pointer", json.dumps(merge))
    replace = {"ignition": {"version": "3.4.0", "config": {"replace": {"source": data_url(child_bytes)}}}}
    write(t, "replace-data-pointer", json.dumps(replace))
    v22 = {"ignition": {"version": "2.2.0", "config": {"append": [{"source": data_url(child_bytes)}]}},
           "storage": {"files": [{"filesystem": "root", "path": "/etc/motd", "append": True,
                                  "contents": {"source": "data:,hello%0A"}, "mode": 420}],
                       "disks": [{"device": "/dev/vda"}]}}
    write(t, "v22-append", json.dumps(v22))
    write(t, "bad-path", json.dumps({"ignition": {"version": "3.0.0"},
                                     "storage": {"files": [{"path": "/etc/../x"}]}}))

    t = "data_url"
    for i, u in enumerate([
        "data:,A%20brief%20note", "data:text/plain;charset=iso-8859-7,%be%fg%be",
        "data:image/gif;base64,R0lGODdhMAAwAPAAAAAAAP///ywAAAAAMAAw", "data:;base64,aGk%3D",
        "data:,master%0A", "data:,%+f", "data:;base64,a G k", "data:application/json,%7B%7D",
        "data:text/plain;base64;charset=utf-8,aGk=", data_url(gz),
    ]):
        write(t, f"url-{i}", u)


# --- metadata, config drives, install-config, cluster.json ------------------------

def metadata_seeds():
    for name in sorted(os.listdir(FIXTURES)):
        src = os.path.join(FIXTURES, name)
        if name.endswith("network_data.json"):
            shutil.copy(src, os.path.join(SEEDS, "network_data", name))
        elif name.endswith(".json"):
            shutil.copy(src, os.path.join(SEEDS, "meta_data_json", name))


def drive_tree(tmp):
    latest = os.path.join(tmp, "tree", "openstack", "latest")
    os.makedirs(latest)
    shutil.copy(os.path.join(FIXTURES, "openstack-config-drive_openstack_meta_data.json"),
                os.path.join(latest, "meta_data.json"))
    shutil.copy(os.path.join(FIXTURES, "kubevirt_config_drive_openstack_latest_network_data.json"),
                os.path.join(latest, "network_data.json"))
    with open(os.path.join(latest, "user_data"), "w") as f:
        f.write('{"ignition":{"version":"3.2.0"}}')
    for root, dirs, files in os.walk(os.path.join(tmp, "tree")):
        for n in dirs + files:
            os.utime(os.path.join(root, n), (86400, 86400))
    os.utime(os.path.join(tmp, "tree"), (86400, 86400))
    return os.path.join(tmp, "tree")


def drive_seeds():
    # xorriso takes 0 as "unset": a day in.
    env = dict(os.environ, SOURCE_DATE_EPOCH="86400")
    with tempfile.TemporaryDirectory() as tmp:
        tree = drive_tree(tmp)
        for flags, name in [(["-R", "-J"], "rock-ridge-joliet"), (["-R"], "rock-ridge")]:
            iso = os.path.join(tmp, name + ".iso")
            subprocess.run(["xorriso", "-as", "mkisofs", "-quiet", "-no-pad", "-V", "config-2",
                            "-o", iso] + flags + [tree],
                           check=True, env=env, stderr=subprocess.DEVNULL)
            # The target prepends the 16-sector system area itself.
            write("config_drive_iso", name, open(iso, "rb").read()[16 * 2048:])
        img = os.path.join(tmp, "drive.img")
        subprocess.run(["mkfs.vfat", "-C", "-n", "CONFIG-2", "-i", "12345678", "-f", "1", "-r", "16",
                        "-s", "1", "--invariant", img, "40"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["mcopy", "-m", "-s", "-i", img, os.path.join(tree, "openstack"), "::"],
                       check=True, env=env)
        write("config_drive_fat", "fat12", open(img, "rb").read())


def config_seeds():
    for name in ["install-config.yaml", "install-config-4.2.yaml"]:
        shutil.copy(os.path.join(REPO, "examples", name), os.path.join(SEEDS, "install_config", name))
    shutil.copy(os.path.join(REPO, "agent", "src", "dns", "testdata", "cluster.json"),
                os.path.join(SEEDS, "cluster_json", "cluster.json"))


def inet_checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def vrrp_seeds():
    """Adverts as the target reads them: a family byte (even: IPv4 from 10.0.0.1 to
    224.0.0.18; odd: IPv6 from fe80::1 to ff02::12), then the VRRP packet, checksummed."""
    import ipaddress
    t = "vrrp_codec"

    def with_sum(pkt, pseudo):
        s = inet_checksum(pseudo + pkt)
        return pkt[:6] + struct.pack(">H", s) + pkt[8:]

    v3 = struct.pack(">BBBBHH", 0x31, 51, 100, 1, 100, 0) + ip("10.0.0.5")
    pseudo4 = ip("10.0.0.1") + ip("224.0.0.18") + struct.pack(">BBH", 0, 112, len(v3))
    write(t, "v3-ipv4", b"\x00" + with_sum(v3, pseudo4))
    v2 = struct.pack(">BBBBBBH", 0x21, 51, 100, 1, 1, 1, 0) + ip("10.0.0.5") + b"secret\0\0"
    write(t, "v2-ipv4-password", b"\x00" + with_sum(v2, b""))
    v6 = (struct.pack(">BBBBHH", 0x31, 52, 100, 1, 100, 0)
          + ipaddress.IPv6Address("fd00::5").packed)
    pseudo6 = (ipaddress.IPv6Address("fe80::1").packed + ipaddress.IPv6Address("ff02::12").packed
               + struct.pack(">I", len(v6)) + bytes([0, 0, 0, 112]))
    write(t, "v3-ipv6", b"\x01" + with_sum(v6, pseudo6))


def main():
    shutil.rmtree(SEEDS, ignore_errors=True)
    for t in ["network_data", "meta_data_json", "install_config", "cluster_json"]:
        os.makedirs(os.path.join(SEEDS, t))
    dns_seeds()
    mdns_seeds()
    dhcp_seeds()
    members_seeds()
    apply_seeds()
    metadata_seeds()
    drive_seeds()
    config_seeds()
    vrrp_seeds()


if __name__ == "__main__":
    main()
