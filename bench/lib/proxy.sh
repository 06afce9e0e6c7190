# Sourced by bench/proxy_vs_haproxy.sh and bench/proxy_routed.sh (run from the repository):
# the backend both hold the proxies in front of, haproxy's configuration as OpenShift ships
# it, and (from bench/lib/stats.sh) the median.

# Writes $1/nginx.conf: one nginx worker serving $1/www, which holds `small` (100 bytes), on
# listen address $2 (host:port).
write_nginx_conf() { # work-dir listen
  mkdir -p "$1/www"
  head -c 100 /dev/zero | tr '\0' 'k' >"$1/www/small"
  cat >"$1/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log stderr warn;
$([[ $(id -u) -eq 0 ]] && echo "user root;")
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
  access_log off;
  sendfile on;
  tcp_nodelay on;
  keepalive_requests 100000000;
  client_body_temp_path $1/www;
  proxy_temp_path $1/www;
  fastcgi_temp_path $1/www;
  uwsgi_temp_path $1/www;
  scgi_temp_path $1/www;
  server {
    listen $2 backlog=4096;
    root $1/www;
  }
}
NGINX
}

# Writes haproxy.cfg $1: OpenShift's haproxy.cfg as the machine-config-operator ships it
# (templates/master/00-master/on-prem/files/haproxy-haproxy.yaml; its `defaults` are
# testdata/openshift-haproxy-defaults.cfg), TCP part, without its log and stats sockets, with
# global maxconn $2 (where the descriptor limit needs it) and one frontend and backend per
# further argument "name bind-address server-address". It sets no nbthread: haproxy runs a
# thread per CPU it may use (one under taskset), as OpenShift runs it.
write_haproxy_cfg() { # file maxconn "name bind server"...
  local out=$1 spec name bind server
  {
    printf 'global\n  maxconn %s\n' "$2"
    grep -v '^#' testdata/openshift-haproxy-defaults.cfg
    shift 2
    for spec in "$@"; do
      read -r name bind server <<<"$spec"
      printf 'frontend %s\n  bind %s\n  default_backend %s\n' "$name" "$bind" "$name"
      printf 'backend %s\n  balance roundrobin\n  server s0 %s\n' "$name" "$server"
    done
  } >"$out"
  haproxy -c -q -f "$out"
}

# The median (bench/lib/stats.sh).
# shellcheck source=bench/lib/stats.sh
. "$(dirname "${BASH_SOURCE[0]}")/stats.sh"
