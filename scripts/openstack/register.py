#!/usr/bin/python3
"""Registers the all-in-one OpenStack's services in Keystone, idempotently: the `service`
project, one user per service with the admin role there, each service with one endpoint
per interface on 127.0.0.1 (the image service's public one on the external network, where
guests reach it), and Heat's stack domain. One process (openstacksdk) instead of forty
`openstack` commands. Credentials come from the OS_* environment (admin); the arguments are
the services' password, the region and the host's address on the external network.
"""

import sys

import openstack

HOST = "127.0.0.1"
SERVICES = [
    # (type, name, url, user)
    ("image", "glance", f"http://{HOST}:9292", "glance"),
    ("placement", "placement", f"http://{HOST}:8778", "placement"),
    ("compute", "nova", f"http://{HOST}:8774/v2.1", "nova"),
    ("network", "neutron", f"http://{HOST}:9696", "neutron"),
    ("orchestration", "heat", f"http://{HOST}:8004/v1/%(tenant_id)s", "heat"),
]


def main():
    password = sys.argv[1]
    region = sys.argv[2]
    public_api = sys.argv[3]
    conn = openstack.connect()
    idn = conn.identity
    default = idn.find_domain("default")
    admin_role = idn.find_role("admin")
    service = idn.find_project("service", domain_id=default.id) or idn.create_project(
        name="service", domain_id=default.id, description="OpenStack services")
    for kind, name, url, user_name in SERVICES:
        user = idn.find_user(user_name, domain_id=default.id) or idn.create_user(
            name=user_name, domain_id=default.id, password=password)
        idn.update_user(user, password=password)
        idn.assign_project_role_to_user(service, user, admin_role)
        svc = idn.find_service(name) or idn.create_service(name=name, type=kind)
        have = {e.interface: e for e in idn.endpoints(service_id=svc.id)}
        for interface in ("public", "internal", "admin"):
            want = url
            if kind == "image" and interface == "public":
                want = url.replace(HOST, public_api)
            if interface not in have:
                idn.create_endpoint(service_id=svc.id, interface=interface, url=want,
                                    region_id=region)
            elif have[interface].url != want:
                idn.update_endpoint(have[interface], url=want)
    # Heat: a domain for the users it makes for stacks, and its admin.
    heat_domain = idn.find_domain("heat") or idn.create_domain(
        name="heat", description="Stack projects and users")
    domain_admin = idn.find_user("heat_domain_admin", domain_id=heat_domain.id) or \
        idn.create_user(name="heat_domain_admin", domain_id=heat_domain.id, password=password)
    idn.assign_domain_role_to_user(heat_domain, domain_admin, admin_role)
    for role in ("heat_stack_owner", "heat_stack_user"):
        idn.find_role(role) or idn.create_role(name=role)
    print("registered: " + ", ".join(s[1] for s in SERVICES))


if __name__ == "__main__":
    main()
