#!/usr/bin/env bash
# Writes the configuration of the all-in-one OpenStack (docs/openstack.md) into Debian's own
# files, idempotently: every run sets the same values again. Only settings that differ from
# Debian's defaults are set, each with its reason; the files are otherwise the packages'.
#
# Everything listens on 127.0.0.1; each API runs one uwsgi process, each service one worker
# (the host has two cores). Databases and service users come later (bootstrap.sh): they need
# the database and Keystone running.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "configure.sh must run as root (it writes /etc)"

PW=$(os_password)
KEYSTONE="http://$OS_HOST:5000"
RABBIT="rabbit://openstack:$PW@$OS_HOST:5672/"
MEMCACHE="$OS_HOST:11211"

# Infrastructure ------------------------------------------------------------------------
# MariaDB: loopback only (Debian's default too, said again here), and connections enough
# for a dozen services' pools.
cat > /etc/mysql/mariadb.conf.d/99-keelson-openstack.cnf <<CNF
[mysqld]
bind-address = $OS_HOST
max_connections = 500
log_error = /var/log/mysql/error.log
CNF
# RabbitMQ and its port mapper: loopback only (Debian's defaults listen on every address).
cat > /etc/rabbitmq/rabbitmq-env.conf <<CNF
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=$OS_HOST
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CNF
cat > /etc/rabbitmq/rabbitmq.conf <<CNF
listeners.tcp.default = $OS_HOST:5672
CNF
# memcached: Debian's /etc/memcached.conf already says -l 127.0.0.1; checked, not changed.
grep -q "^-l 127.0.0.1" /etc/memcached.conf || die "/etc/memcached.conf does not bind 127.0.0.1"
# libvirt: its default NAT network would put a bridge with an address and a dnsmasq on the
# host; the cloud's networks are Neutron's.
rm -f /etc/libvirt/qemu/networks/autostart/default.xml
# Logs in files (there is no journal or syslog here); libvirtd's only on its UNIX sockets
# (its TCP listeners are off by default and stay off).
ini_set_plain() { grep -q "^$2 *=" "$1" && sed -i "s|^$2 *=.*|$2 = $3|" "$1" || echo "$2 = $3" >> "$1"; }
ini_set_plain /etc/libvirt/libvirtd.conf log_outputs '"3:file:/var/log/libvirt/libvirtd.log"'
ini_set_plain /etc/libvirt/virtlogd.conf log_outputs '"3:file:/var/log/libvirt/virtlogd.log"'

# authtoken FILE: the keystonemiddleware settings of a service's own user.
authtoken() {
  local f=$1 user=$2 s=${3:-keystone_authtoken}
  ini_set "$f" "$s" www_authenticate_uri "$KEYSTONE"
  ini_set "$f" "$s" auth_url "$KEYSTONE"
  ini_set "$f" "$s" memcached_servers "$MEMCACHE"
  ini_set "$f" "$s" auth_type password
  ini_set "$f" "$s" project_domain_name Default
  ini_set "$f" "$s" user_domain_name Default
  ini_set "$f" "$s" project_name service
  ini_set "$f" "$s" username "$user"
  ini_set "$f" "$s" password "$PW"
  ini_set "$f" "$s" region_name "$OS_REGION"
}
# messaging FILE: RabbitMQ on loopback. heartbeat_in_pthread: the APIs run under uwsgi,
# not eventlet, and without a heartbeat thread of their own they lose an idle connection
# (500 MessagingTimeout on the next request, port updates that hang).
messaging() {
  ini_set "$1" DEFAULT transport_url "$RABBIT"
  ini_set "$1" oslo_messaging_rabbit heartbeat_in_pthread true
}
# db FILE SECTION DATABASE [USER]: the service's database connection.
db() { ini_set "$1" "$2" connection "mysql+pymysql://${4:-$3}:$PW@$OS_HOST/$3"; }

# uwsgi NAME PORT INI: the API's init script starts uwsgi with our arguments
# (/etc/default/NAME is read after the script builds its own): bound to loopback rather
# than every address, one process with a few threads rather than Debian's 8-16 processes,
# and `Connection: close` on every answer, which Debian's glance, neutron and placement
# configurations carry and nova's, keystone's and heat's lack: uwsgi's HTTP socket closes
# a connection the client would reuse, and the next request fails with "Connection reset
# by peer" (error 104).
uwsgi() {
  printf 'DAEMON_ARGS="--http-socket %s:%s --ini %s --processes 1 --threads 4 --add-header Connection:close"\n' \
    "$OS_HOST" "$2" "$3" > "/etc/default/$1"
}

# Keystone --------------------------------------------------------------------------------
f=/etc/keystone/keystone.conf
db "$f" database keystone
ini_set "$f" token provider fernet
uwsgi keystone 5000 /etc/keystone/keystone-uwsgi.ini

# Glance: images in files -----------------------------------------------------------------
f=/etc/glance/glance-api.conf
db "$f" database glance
authtoken "$f" glance
ini_set "$f" paste_deploy flavor keystone
ini_set "$f" DEFAULT enabled_backends "file:file"
ini_set "$f" glance_store default_backend file
ini_set "$f" file filesystem_store_datadir /var/lib/glance/images/
# The image import workers (a staging store Zed's glance-api asks for at start).
ini_set "$f" os_glance_staging_store filesystem_store_datadir /var/lib/glance/staging/
ini_set "$f" os_glance_tasks_store filesystem_store_datadir /var/lib/glance/tasks/
mkdir -p /var/lib/glance/images /var/lib/glance/staging /var/lib/glance/tasks
chown -R glance:glance /var/lib/glance
# Debian runs glance-api as its own (eventlet) server, not under uwsgi.
rm -f /etc/default/glance-api
ini_set "$f" DEFAULT bind_host "$OS_HOST"
ini_set "$f" DEFAULT workers 1

# Placement -------------------------------------------------------------------------------
f=/etc/placement/placement.conf
db "$f" placement_database placement
authtoken "$f" placement
ini_set "$f" api auth_strategy keystone
uwsgi placement-api 8778 /etc/placement/placement-api-uwsgi.ini

# Nova: libvirt with TCG ------------------------------------------------------------------
f=/etc/nova/nova.conf
ini_set "$f" DEFAULT my_ip "$OS_HOST"
ini_set "$f" DEFAULT enabled_apis osapi_compute,metadata
messaging "$f"
db "$f" database nova
db "$f" api_database nova_api nova
authtoken "$f" nova
ini_set "$f" api auth_strategy keystone
# Instance host names without Nova's default "novalocal" domain: the name a node is given
# is its name in the cluster.
ini_set "$f" api dhcp_domain ""
authtoken "$f" placement placement
authtoken "$f" neutron neutron
ini_set "$f" neutron service_metadata_proxy true
ini_set "$f" neutron metadata_proxy_shared_secret "$PW"
# One worker each; hosts are mapped to cells when bootstrap.sh discovers them.
ini_set "$f" conductor workers 1
ini_set "$f" scheduler workers 1
ini_set "$f" DEFAULT metadata_workers 1
ini_set "$f" DEFAULT osapi_compute_workers 1
# No graphical consoles: nothing else listens; `openstack console log show` reads the serial
# log libvirt's virtlogd keeps.
ini_set "$f" vnc enabled false
ini_set "$f" spice enabled false
# Six small guests on two cores: vCPUs are overcommitted (TCG guests idle most of the time).
ini_set "$f" DEFAULT cpu_allocation_ratio 16.0
ini_set "$f" oslo_concurrency lock_path /var/lock/nova
# `server stop` powers the guest off at once, as a failing host would (the failover
# scenario: the holder dies without a goodbye, as QEMU's `quit` does in qemu-cluster). Nova's
# default gives the guest 60 s to shut down, and the agent then says goodbye (priority 0).
ini_set "$f" DEFAULT shutdown_timeout 0
f=/etc/nova/nova-compute.conf
ini_set "$f" DEFAULT compute_driver libvirt.LibvirtDriver
# TCG: this host's /dev/kvm crashes ordinary guests. Under TCG no CPU model is asked for.
ini_set "$f" libvirt virt_type qemu
ini_set "$f" libvirt cpu_mode none
uwsgi nova-api 8774 /etc/nova/nova-api-uwsgi.ini
uwsgi nova-api-metadata 8775 /etc/nova/nova-api-metadata-uwsgi.ini

# Neutron: ML2 + linuxbridge, one flat provider network -----------------------------------
f=/etc/neutron/neutron.conf
messaging "$f"
db "$f" database neutron
authtoken "$f" neutron
authtoken "$f" nova nova
ini_set "$f" DEFAULT core_plugin ml2
# Routers (the clusters' own, to the external network, with their floating IPs); no
# metering or QoS.
ini_set "$f" DEFAULT service_plugins router
ini_set "$f" DEFAULT interface_driver linuxbridge
# A DNS domain of the cloud's own: with Neutron's default (openstacklocal) the DHCP agent
# names every port host-<address>; with one, a port is named after its instance (the
# RHCOS stand-in takes its host name from DHCP).
ini_set "$f" DEFAULT dns_domain keelson.test.
ini_set "$f" DEFAULT rpc_workers 1
ini_set "$f" DEFAULT rpc_state_report_workers 1
ini_set "$f" DEFAULT api_workers 1
# Linuxbridge is "experimental" in Zed: without this neutron-rpc-server refuses to start.
ini_set "$f" experimental linuxbridge true
ini_set "$f" oslo_concurrency lock_path /var/lock/neutron
f=/etc/neutron/plugins/ml2/ml2_conf.ini
ini_set "$f" ml2 type_drivers flat,vxlan
ini_set "$f" ml2 tenant_network_types vxlan
# l2population: the VXLAN devices of tenant networks get no multicast group (below).
ini_set "$f" ml2 mechanism_drivers linuxbridge,l2population
# dns: a port takes its instance's host name, and the DHCP agent hands it out (option 12),
# which is where the RHCOS stand-in's NetworkManager takes its host name from.
ini_set "$f" ml2 extension_drivers port_security,dns
ini_set "$f" ml2_type_flat flat_networks "$OS_PHYSNET"
ini_set "$f" ml2_type_vxlan vni_ranges 1:1000
f=/etc/neutron/plugins/ml2/linuxbridge_agent.ini
ini_set "$f" linux_bridge physical_interface_mappings "$OS_PHYSNET:$OS_PROVIDER_IF"
# Tenant (VXLAN) networks on loopback: one host, no tunnel to anybody. With l2population
# the VXLAN device has no multicast group; with one, loopback hands every flooded frame back
# to the bridge through the VXLAN port, which then learns the guests' and routers' MACs
# there and sends their frames into the tunnel, to nobody.
ini_set "$f" vxlan enable_vxlan true
ini_set "$f" vxlan local_ip "$OS_HOST"
ini_set "$f" vxlan l2_population true
# Security groups and anti-spoofing by iptables, as on any linuxbridge cloud.
ini_set "$f" securitygroup enable_security_group true
ini_set "$f" securitygroup firewall_driver iptables
f=/etc/neutron/dhcp_agent.ini
ini_set "$f" DEFAULT interface_driver linuxbridge
# A network without a router gets the metadata service through the DHCP namespace
# (169.254.169.254 by DHCP option 121), as Neutron's own docs set it up.
ini_set "$f" DEFAULT enable_isolated_metadata true
ini_set "$f" DEFAULT force_metadata true
# The L3 agent: legacy (not distributed, not HA) routers in namespaces on this host.
f=/etc/neutron/l3_agent.ini
ini_set "$f" DEFAULT interface_driver linuxbridge
ini_set "$f" DEFAULT agent_mode legacy
f=/etc/neutron/metadata_agent.ini
ini_set "$f" DEFAULT nova_metadata_host "$OS_HOST"
ini_set "$f" DEFAULT metadata_proxy_shared_secret "$PW"
ini_set "$f" DEFAULT metadata_workers 1
ini_set "$f" cache memcache_servers "$MEMCACHE"
uwsgi neutron-server 9696 /etc/neutron/neutron-api-uwsgi.ini
# The linuxbridge agent runs through a launcher that fixes one ebtables-nft incompatibility
# (scripts/openstack/neutron-linuxbridge-agent, docs/openstack.md "ARP protection").
install -D -m 0755 scripts/openstack/neutron-linuxbridge-agent /usr/local/lib/keelson-openstack/neutron-linuxbridge-agent
printf 'DAEMON=/usr/local/lib/keelson-openstack/neutron-linuxbridge-agent\n' > /etc/default/neutron-linuxbridge-agent

# Heat ------------------------------------------------------------------------------------
f=/etc/heat/heat.conf
messaging "$f"
db "$f" database heat
authtoken "$f" heat
authtoken "$f" heat trustee
ini_set "$f" clients_keystone auth_uri "$KEYSTONE"
ini_set "$f" DEFAULT heat_metadata_server_url "http://$OS_HOST:8000"
ini_set "$f" DEFAULT heat_waitcondition_server_url "http://$OS_HOST:8000/v1/waitcondition"
ini_set "$f" DEFAULT stack_user_domain_name heat
ini_set "$f" DEFAULT stack_domain_admin heat_domain_admin
ini_set "$f" DEFAULT stack_domain_admin_password "$PW"
ini_set "$f" DEFAULT num_engine_workers 1
uwsgi heat-api 8004 /etc/heat/heat-api-uwsgi.ini

# The public API front ------------------------------------------------------------------
# Guests reach the cloud's public endpoints on the external network, as on any cloud; here
# only the image service's, which a bootstrap fetches its hosted config from. HAProxy
# relays $OS_PUBLIC_API:9292 to Glance on loopback (a real cloud's load balancer in front
# of its APIs); `transparent` binds the address before the linuxbridge agent has moved it
# from the provider veth to the external network's bridge.
mkdir -p /etc/keelson-openstack
cat > /etc/keelson-openstack/api-front.cfg <<CFG
global
  daemon
  pidfile /run/keelson-openstack/api-front.pid
  log stderr local0 warning
defaults
  mode tcp
  timeout connect 5s
  timeout client 10m
  timeout server 10m
frontend image
  bind $OS_PUBLIC_API:9292 transparent
  default_backend glance
backend glance
  server glance $OS_HOST:9292
CFG

log "configured (every listener on $OS_HOST; one worker per service)"
