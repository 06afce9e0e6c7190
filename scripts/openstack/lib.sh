# Shared by scripts/openstack/*.sh (sourced, not run): where the all-in-one OpenStack keeps
# its state, the names and ports every script agrees on, and small helpers.
# shellcheck shell=bash

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
# The OpenStack services and the `openstack` client are Debian's Python programs: keep a
# user's Python environment (pyenv, virtualenv) out of their way.
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

# State of this machine's OpenStack (passwords, markers, the credentials file), outside the
# repository: one OpenStack per machine, whichever checkout runs it.
OS_STATE=${OS_STATE:-/var/lib/keelson-openstack}
# Every API listens here only.
OS_HOST=127.0.0.1
OS_REGION=regionOne
# The flat provider network's physical network name and its "NIC": one end of a veth pair
# whose other end carries the outside view (docs/openstack.md). The bridge Neutron's
# linuxbridge agent makes for the network enslaves the first end.
OS_PHYSNET=keelson
OS_PROVIDER_IF=kos-prov
OS_OUTSIDE_IF=kos-out
# The external network an admin makes on that physical network (bootstrap.sh cloud): the
# clusters' routers and floating IPs live on it. Its gateway is the outside namespace, which
# routes nowhere, so nothing a guest sends leaves this machine's bridges and namespaces; the
# host holds one address on it, where the cloud's public API endpoints answer guests (the
# image service: a bootstrap fetches its hosted config there).
OS_EXTERNAL_NET=public
OS_EXTERNAL_CIDR=172.24.4.0/24
OS_EXTERNAL_GATEWAY=172.24.4.1
OS_PUBLIC_API=172.24.4.2
OS_EXTERNAL_POOL=start=172.24.4.10,end=172.24.4.200

log() { echo "openstack: $*" >&2; }
die() { echo "openstack: $*" >&2; exit 1; }

# The one password of this test cloud (databases, RabbitMQ, service users, admin), made
# once; every listener is on loopback.
os_password() {
  mkdir -p "$OS_STATE"
  chmod 700 "$OS_STATE"
  if [ ! -s "$OS_STATE/password" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$OS_STATE/password")
  fi
  cat "$OS_STATE/password"
}

# The admin credentials every `openstack` command of the run uses.
os_admin_env() {
  export OS_AUTH_URL="http://$OS_HOST:5000/v3" OS_IDENTITY_API_VERSION=3
  export OS_USERNAME=admin OS_PASSWORD="$(os_password)" OS_PROJECT_NAME=admin
  export OS_USER_DOMAIN_NAME=Default OS_PROJECT_DOMAIN_NAME=Default OS_REGION_NAME=$OS_REGION
  export OS_INTERFACE=internal
}

# ini_set FILE SECTION KEY VALUE: sets KEY in [SECTION] of FILE (replacing an uncommented
# setting there, else adding it under the section, which is added when missing).
ini_set() {
  local file=$1 section=$2 key=$3 value=$4 tmp
  tmp=$(mktemp "$file.XXXXXX")
  awk -v s="[$section]" -v k="$key" -v v="$value" '
    function emit() { print k " = " v; done = 1 }
    /^\[/ { if (insec && !done) emit(); insec = ($0 == s); seen = seen || insec }
    insec && !done && $0 ~ "^[ \t]*" k "[ \t]*=" { emit(); next }
    insec && done && $0 ~ "^[ \t]*" k "[ \t]*=" { next }
    { print }
    END { if (insec && !done) emit(); else if (!seen) { print ""; print s; emit() } }
  ' "$file" > "$tmp"
  chmod --reference="$file" "$tmp" 2>/dev/null || true
  chown --reference="$file" "$tmp" 2>/dev/null || true
  mv "$tmp" "$file"
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every second until it succeeds.
wait_for() {
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  return 1
}
# The namespace holding the outside end of the provider veth (the cluster's client view).
OS_OUTSIDE_NS=kos-outside
