# Sourced by bench/api_outage.sh and bench/vip_soak.sh: three masters in namespaces on one
# bridge (10.85.0.10-12), each with a stand-in kube-apiserver (`kube-standin`, TLS,
# `/readyz`) on *:6443, a client namespace (10.85.0.100), the API VIP 10.85.0.5, and the
# two load-balancer stacks that hold it:
#
#  keelson    `keelson-agent run --only members,vrrp,proxy,ignition` on the files
#             `keelson build --no-image` writes for a 3-master install-config of this
#             network: unicast VRRP, unicast members with the membership key, the API
#             instance's checks and the proxy's settings exactly as built.
#  ocp-*      OpenShift's on-prem stack as the machine-config-operator ships it today
#             (templates/master/00-master/on-prem/files/, commit 7ff337a4, 2026-08-20):
#             keepalived (VRRPv2, auth PASS, priority 40, advert 1 s, unicast peers,
#             `chk_ocp_lb` interval 2 weight 20 rise 3 fall 3 under `timeout 1.9`, and
#             `chk_ocp_both` weight 5) + haproxy (testdata/openshift-haproxy-defaults.cfg,
#             `option httpchk GET /readyz HTTP/1.0`, `verify none check check-ssl`), with the
#             haproxy server settings of one era:
#               ocp-4.2   `inter 3s fall 2 rise 3` (4.2, the walkthrough keelson grew from)
#               ocp-2020  `inter 1s fall 2 rise 3` (2020 to October 2024)
#               ocp-2024  `inter 5s fall 3 rise 1` + `timeout check 10s` (OCPBUGS-43428, today)
#             haproxy-monitor's part is played statically: the VIP:6443 → :9445 redirect
#             (nftables here, iptables there) and its `iptables-rule-exists` flag are present
#             on every master throughout (the monitor drops them only after 11 failed polls
#             6 s apart of "haproxy has no backend", which no case here reaches).
#
# Needs: ROOT (the repository), P (namespace prefix, unique per run), WORK (scratch
# directory). The binaries: KEELSON_AGENT, KEELSON, KUBE_STANDIN (default: the static
# release ones of `make agent` / `make build`).

AGENT=${KEELSON_AGENT:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
KEELSON=${KEELSON:-$ROOT/target/release/keelson}
STANDIN=${KUBE_STANDIN:-$ROOT/target/x86_64-unknown-linux-gnu/release/kube-standin}
CLIENT="python3 $ROOT/bench/api_client.py"

# Exits unless root, the binaries and the commands "$@" are there.
require_bench() {
    [ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
    local b c
    for b in "$AGENT" "$KEELSON" "$STANDIN"; do [ -x "$b" ] || { echo "build first: make agent build ($b)" >&2; exit 1; }; done
    for c in keepalived haproxy nft curl python3 jq "$@"; do command -v "$c" >/dev/null || { echo "$c not installed (scripts/setup.sh)" >&2; exit 1; }; done
}

VIP=10.85.0.5
MASTERS=(0 1 2)
BR=$P-br
C=$P-c

ocp_settings() { # stack -> the haproxy server settings
    case $1 in
        ocp-4.2) echo "inter 3s fall 2 rise 3" ;;
        ocp-2020) echo "inter 1s fall 2 rise 3" ;;
        ocp-2024) echo "inter 5s fall 3 rise 1" ;;
        *) echo "unknown stack $1" >&2; return 1 ;;
    esac
}

# OpenShift sets maxconn 40000; haproxy needs ~2 descriptors per connection and will not
# start when it cannot raise RLIMIT_NOFILE that far (containers often cap it): then a lower
# maxconn (a handful of connections are open here either way).
HARD_NOFILE=$(ulimit -Hn)
if [[ $HARD_NOFILE == unlimited ]] || ((HARD_NOFILE >= 80100)); then MAXCONN=40000; else MAXCONN=$(((HARD_NOFILE - 100) / 2)); fi

ns() { echo "$P-m$1"; }
ip_of() { echo "10.85.0.$((10 + $1))"; }

kill_ns() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}
teardown() {
    for m in "${MASTERS[@]}"; do kill_ns "$(ns $m)"; done
    kill_ns $C
    for n in $(for m in "${MASTERS[@]}"; do ns $m; done) $C $BR; do ip netns del "$n" 2>/dev/null || true; done
}

# The segment and the apiservers; `slow` files under $WORK/run make /readyz slow.
setup() {
    teardown
    rm -rf "${WORK:?}"/run && mkdir -p "$WORK/run"
    ip netns add $BR
    ip -n $BR link add br0 type bridge
    ip -n $BR link set br0 up
    for m in "${MASTERS[@]}" c; do
        local n addr
        if [ "$m" = c ]; then n=$C; addr=10.85.0.100; else n=$(ns "$m"); addr=$(ip_of "$m"); fi
        ip netns add "$n"
        ip -n $BR link add "${P}v$m" type veth peer name eth0 netns "$n"
        ip -n $BR link set "${P}v$m" master br0 up
        ip -n "$n" addr add "$addr/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
    done
    for m in "${MASTERS[@]}"; do
        ip netns exec "$(ns "$m")" "$STANDIN" --listen 0.0.0.0:6443 --name "m$m" \
            --slow-readyz-if "$WORK/run/slow-$m" >/dev/null 2>"$WORK/run/standin-$m.log" &
    done
}

# `keelson build` for this network, once: cluster.json and tls/ (CA, membership key).
keelson_build() {
    mkdir -p "$WORK/build"
    cat >"$WORK/build/install-config.yaml" <<'EOF'
apiVersion: v1
baseDomain: example.com
metadata:
  name: kao
controlPlane:
  name: master
  replicas: 3
compute:
- name: worker
  replicas: 2
networking:
  networkType: OVNKubernetes
  clusterNetwork:
  - cidr: 10.128.0.0/14
    hostPrefix: 23
  serviceNetwork:
  - 172.30.0.0/16
  machineNetwork:
  - cidr: 10.85.0.0/24
platform:
  PLATFORM_KEY:
    apiVIPs:
    - 10.85.0.5
    ingressVIPs:
    - 10.85.0.7
pullSecret: '{"auths":{"example.invalid":{"auth":"a2VlbHNvbjpleGFtcGxl"}}}'
sshKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKeelsonExampleKeyOnlyForTheDocs0000000000 core@example
EOF
    # The namespaces are a bridge, as bare metal (the default): `keelson build` turns the
    # hand-back of connections across a clean hand-over on there (docs/vrrp.md);
    # PLATFORM=openstack builds as for OpenStack, where it is off (port security).
    sed -i "s/PLATFORM_KEY:/${PLATFORM:-baremetal}:/" "$WORK/build/install-config.yaml"
    # `keelson build` packs a static agent for the nodes to fetch; nothing here fetches it
    # (the namespaces run $AGENT, which may be a debug build), so a static stub stands in
    # when $AGENT is not static.
    local packed=$AGENT
    if ! file -L "$AGENT" | grep -q 'statically linked'; then
        packed=$WORK/build/static-stub
        printf 'int main(void) { return 0; }\n' | cc -static -x c - -o "$packed"
    fi
    "$KEELSON" build --config "$WORK/build/install-config.yaml" --out "$WORK/build/out" \
        --no-image --agent "$packed" >"$WORK/build/build.log" 2>&1 ||
        { cat "$WORK/build/build.log" >&2; return 1; }
}

start_keelson() {
    local m
    for m in "${MASTERS[@]}"; do start_keelson_node "$m" "$AGENT"; done
}

start_keelson_node() { # master binary
    local out=$WORK/build/out n d
    n=$(ns "$1")
    d="$WORK/run/$n"
    mkdir -p "$d"
    echo "{\"name\":\"master-$1\",\"role\":\"master\",\"interface\":\"eth0\",\"addresses\":[\"$(ip_of "$1")/24\"]}" >"$d/node.json"
    ip netns exec "$n" "$2" run --cluster "$out/cluster.json" --node "$d/node.json" \
        --tls-dir "$out/tls" --state-dir "$d/state" --only members,vrrp,proxy,ignition \
        --status-socket "$d/agent.sock" >/dev/null 2>>"$d/agent.log" &
    echo $! >"$d/lb.pids"
}

start_openshift_node() { # master
    local n d
    n=$(ns "$1")
    d="$WORK/run/$n"
    ip netns exec "$n" haproxy -db -f "$d/haproxy.cfg" >/dev/null 2>>"$d/haproxy.log" &
    echo $! >"$d/lb.pids"
    ip netns exec "$n" keepalived -n -l -P -f "$d/keepalived.conf" -p "$d/ka.pid" \
        -r "$d/vrrp.pid" -c "$d/chk.pid" >/dev/null 2>>"$d/keepalived.log" &
    echo $! >>"$d/lb.pids"
}

# SIGTERM to master $2's load balancer stack, waits until it is gone, starts it again
# (keelson: with binary $3, an upgrade when it differs).
restart_lb() { # stack master [binary]
    local d
    d="$WORK/run/$(ns "$2")"
    kill -TERM $(cat "$d/lb.pids") 2>/dev/null || true
    for pid in $(cat "$d/lb.pids"); do
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    done
    case $1 in
        keelson) start_keelson_node "$2" "${3:-$AGENT}" ;;
        *) start_openshift_node "$2" ;;
    esac
}

# haproxy.cfg and keepalived.conf of master $2 for stack $1, into directory $3.
openshift_configs() {
    local stack=$1 m=$2 d=$3 settings servers="" peers="" check_timeout="" s
    settings=$(ocp_settings "$stack")
    [ "$stack" = ocp-2024 ] && check_timeout="   timeout check 10s"
    for s in "${MASTERS[@]}"; do
        servers+="   server m$s $(ip_of "$s"):6443 weight 1 verify none check check-ssl $settings"$'\n'
        [ "$s" = "$m" ] || peers+="        $(ip_of "$s")"$'\n'
    done
    {
        echo "global"
        echo "  maxconn $MAXCONN"
        grep -v '^#' "$ROOT/testdata/openshift-haproxy-defaults.cfg" | sed "s/maxconn 40000/maxconn $MAXCONN/"
        cat <<EOF
frontend  main
  bind :::9445 v4v6
  default_backend masters
listen health_check_http_url
  bind :::9444 v4v6
  mode http
  monitor-uri /haproxy_ready
  option dontlognull
listen monitor_check_http_url
  bind :::9454 v4v6
  mode http
  monitor-uri /haproxy_monitor
  monitor fail if { nbsrv(masters) lt 1 }
  option dontlognull
backend masters
$check_timeout
   option  httpchk GET /readyz HTTP/1.0
   balance roundrobin
$servers
EOF
    } >"$d/haproxy.cfg"
    printf '#!/bin/bash\n/usr/bin/curl -o /dev/null -kLfs http://localhost:9444/haproxy_ready && [ -e %s/iptables-rule-exists ]\n' "$d" >"$d/chk_ocp_script.sh"
    printf '#!/bin/bash\n/usr/bin/curl -o /dev/null -kLfs http://localhost:9444/haproxy_ready && [ -e %s/iptables-rule-exists ] || /usr/bin/curl -kLfs https://localhost:6443/readyz\n' "$d" >"$d/chk_ocp_script_both.sh"
    chmod 755 "$d/chk_ocp_script.sh" "$d/chk_ocp_script_both.sh"
    cat >"$d/keepalived.conf" <<EOF
global_defs {
    router_id $(ns "$m")
    enable_script_security
    script_user root
    max_auto_priority -1
    vrrp_garp_master_refresh 60
}
vrrp_script chk_ocp_lb {
    script "/usr/bin/timeout 1.9 $d/chk_ocp_script.sh"
    interval 2
    weight 20
    rise 3
    fall 3
}
vrrp_script chk_ocp_both {
    script "/usr/bin/timeout 1.9 $d/chk_ocp_script_both.sh"
    interval 2
    weight 5
    rise 3
    fall 3
}
vrrp_instance kao_API_0 {
    state BACKUP
    interface eth0
    virtual_router_id 85
    priority 40
    advert_int 1
    unicast_src_ip $(ip_of "$m")
    unicast_peer {
$peers    }
    authentication {
        auth_type PASS
        auth_pass kao_api_vip
    }
    virtual_ipaddress {
        $VIP/24
    }
    track_script {
        chk_ocp_lb
        chk_ocp_both
    }
}
EOF
}

start_openshift() { # stack
    for m in "${MASTERS[@]}"; do
        local n d
        n=$(ns "$m")
        d="$WORK/run/$n"
        mkdir -p "$d"
        chmod 755 "$d"
        openshift_configs "$1" "$m" "$d"
        touch "$d/iptables-rule-exists"
        # haproxy-monitor's redirect, present on every master: only the VIP's holder gets
        # packets for the VIP.
        ip netns exec "$n" nft -f - <<EOF
table ip kao_nat {
    chain prerouting { type nat hook prerouting priority dstnat; ip daddr $VIP tcp dport 6443 redirect to :9445; }
}
EOF
        start_openshift_node "$m"
    done
}

start_stack() { # stack
    case $1 in
        keelson) start_keelson ;;
        ocp-*) start_openshift "$1" ;;
        *) echo "unknown stack $1" >&2; return 1 ;;
    esac
}

# Prints what each stack runs (once per bench run).
print_configs() { # stacks...
    local s
    for s in "$@"; do
        case $s in
            keelson)
                echo "keelson ($AGENT): keelson build's cluster.json, API instance and proxy:"
                jq -c '.vrrp.instances[] | select(.name=="api") | {vrid,version,advertIntervalMs,transport,preempt,handbackSecs,priorities,checks}' "$WORK/build/out/cluster.json" | sed 's/^/  /'
                jq -c '.api | {check,checkIntervalMs,fall,rise,fastCheckIntervalMs,slowstartMs,shutdownSessions}' "$WORK/build/out/cluster.json" | sed 's/^/  /'
                jq -c '.members | {transport,keyId,renewIntervalSecs,expirySecs}' "$WORK/build/out/cluster.json" | sed 's/^/  /'
                ;;
            ocp-*)
                local d=$WORK/cfg-$s
                mkdir -p "$d"
                openshift_configs "$s" 0 "$d"
                echo "$s: haproxy backend (master 0):"
                sed -n '/^backend masters/,$p' "$d/haproxy.cfg" | grep -v '^$' | sed 's/^/  /'
                ;;
        esac
    done
    local last=${*: -1}
    if [[ $last == ocp-* ]]; then
        echo "ocp-*: keepalived (master 0; the same for every era):"
        sed -n '/^vrrp_script chk_ocp_lb/,$p' "$WORK/cfg-$last/keepalived.conf" | tr -s ' ' | paste -sd' ' | sed 's/^/  /'
    fi
}

holder() {
    for m in "${MASTERS[@]}"; do
        # Not `| grep -q`: with pipefail, ip dying of SIGPIPE would read as "not held".
        if [[ $(ip -n "$(ns "$m")" -o addr show dev eth0) == *" $VIP/"* ]]; then echo "$m"; return; fi
    done
    echo none
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Waits for one holder and 5 s of answers in a row through the VIP (at most 90 s).
settle() {
    local t0 ok=0
    t0=$(now_ms)
    while [ $(($(now_ms) - t0)) -lt 90000 ]; do
        if [ "$(holder)" != none ] && ip netns exec $C curl -skf --max-time 1 -o /dev/null "https://$VIP:6443/readyz"; then
            ok=$((ok + 1))
            [ $ok -ge 10 ] && return 0
        else
            ok=0
        fi
        sleep 0.5
    done
    echo "no steady state within 90 s" >&2
    return 1
}

# shellcheck source=bench/lib/stats.sh
. "$(dirname "${BASH_SOURCE[0]}")/stats.sh"
spread() { sort -n | awk 'NR==1{lo=$1} {hi=$1} END{ if (NR==0) print "-"; else print lo "-" hi }'; }

# SIGKILL to master $1's apiserver stand-in, found by name among its namespace's processes
# (not by a pid file: pids wrap quickly on a busy machine).
kill_standin() {
    local pid
    for pid in $(ip netns pids "$(ns "$1")"); do
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = kube-standin ]; then kill -9 "$pid"; return 0; fi
    done
    echo "no kube-standin in $(ns "$1")" >&2
    return 1
}

# Stops master $1's apiserver stand-in the way kube-apiserver stops on SIGTERM in a clean
# shutdown: it stops accepting (new connections refused, as by a closed listener, so a load
# balancer tries another backend), lets the requests in flight finish (1 s, the clients'
# timeout), then exits, closing its idle keep-alive connections. kube-standin has no
# SIGTERM handler of its own (qemu-tests), so nftables refuses the new connections first.
stop_standin() {
    ip netns exec "$(ns "$1")" nft -f - <<EOF
table inet kao_stop {
    chain in { type filter hook input priority 0; tcp dport 6443 tcp flags & (syn | ack) == syn reject with tcp reset; }
}
EOF
    sleep 1
    kill_standin "$1"
}

# The master other than $1 holding the VIP, or none (a killed node keeps the address on
# its interface: it is not a holder anyone reaches).
holder_except() {
    for m in "${MASTERS[@]}"; do
        [ "$m" != "$1" ] || continue
        if [[ $(ip -n "$(ns "$m")" -o addr show dev eth0) == *" $VIP/"* ]]; then echo "$m"; return; fi
    done
    echo none
}
