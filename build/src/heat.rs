//! `openstack.yaml`: the cluster as one OpenStack Heat (HOT) template, written by
//! `keelson build` beside the Ignition configs from the same plan as `openstack.json`
//! (docs/openstack.md, "With Heat"). One `openstack stack create -t out/openstack.yaml` makes
//! what the README's script makes: the machine network and subnet (the VIPs outside its
//! allocation pool), a router to the external network, the security group (least privilege:
//! [`crate::openstack::rules`]), a port per VIP carrying its floating IP, one port per node
//! with both VIPs as allowed address pairs, and the servers with their Ignition configs as
//! user_data (`get_file`, so the template stays next to them in `--out`). A bootstrap config
//! too large for user_data is hosted (`examples/openstack/host-bootstrap.sh`) and the
//! bootstrap boots from the pointer given as the `bootstrap_user_data` parameter.
//!
//! Pure text from the plan, so the same inputs give the same bytes.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::openstack::{Plan, Source};

/// The template's file name in `--out`.
pub const FILE: &str = "openstack.yaml";

/// The template; `bootstrap_fits`: `bootstrap.ign` fits in user_data, so the bootstrap may
/// boot from it (else only from the hosted pointer).
pub fn template(plan: &Plan, bootstrap_fits: bool) -> anyhow::Result<String> {
    let mut t = String::new();
    let w = &mut t;
    writeln!(w, "heat_template_version: 2021-04-16")?;
    writeln!(
        w,
        "description: keelson cluster {} (written by keelson build; docs/openstack.md)",
        plan.zone
    )?;
    write_parameters(w, plan, bootstrap_fits)?;
    write_conditions(w)?;
    writeln!(w, "resources:")?;
    write_network(w, plan)?;
    write_rules(w, plan)?;
    write_vip_ports(w, plan)?;
    write_servers(w, plan, bootstrap_fits)?;
    writeln!(w, "outputs:")?;
    writeln!(w, "  network:\n    value: {{get_resource: network}}")?;
    writeln!(
        w,
        "  bootstrap_address:\n    value: {{get_attr: [bootstrap_port, fixed_ips, 0, ip_address]}}"
    )?;
    Ok(t)
}

/// The parameters: images, flavors, config drive, the sources, the external network and
/// floating IPs, the hosted bootstrap's pointer.
fn write_parameters(w: &mut String, plan: &Plan, bootstrap_fits: bool) -> std::fmt::Result {
    writeln!(w, "parameters:")?;
    let external = plan.external_network.clone().unwrap_or_default();
    for (param, default, what) in [
        (
            "keelson_image",
            "keelson".to_owned(),
            "the image of keelson.qcow2 (the bootstrap)",
        ),
        ("rhcos_image", "rhcos".into(), "the masters' image"),
        ("worker_image", "rhcos".into(), "the workers' image"),
        (
            "bootstrap_flavor",
            "m1.small".into(),
            "the bootstrap's flavor",
        ),
        ("master_flavor", "m1.xlarge".into(), "the masters' flavor"),
        ("worker_flavor", "m1.large".into(), "the workers' flavor"),
        (
            "api_source",
            "0.0.0.0/0".into(),
            "who may reach the API (6443), as a CIDR",
        ),
        (
            "ingress_source",
            "0.0.0.0/0".into(),
            "who may reach ingress (80, 443), as a CIDR",
        ),
        (
            "status_source",
            "0.0.0.0/0".into(),
            "who may reach the operator status port (a client certificate is required too)",
        ),
        (
            "ssh_source",
            String::new(),
            "who may reach SSH (22), as a CIDR; empty: nobody",
        ),
        (
            "external_network",
            external,
            "the external network the router's gateway is on (install-config externalNetwork); empty: no router",
        ),
        (
            "api_floating_ip_id",
            String::new(),
            "the ID of the floating IP for the API VIP (install-config apiFloatingIP): `openstack floating ip show ADDRESS -c id`",
        ),
        (
            "ingress_floating_ip_id",
            String::new(),
            "the ID of the floating IP for the ingress VIP (install-config ingressFloatingIP)",
        ),
    ] {
        writeln!(
            w,
            "  {param}:\n    type: string\n    default: '{default}'\n    description: \"{what}\""
        )?;
    }
    writeln!(
        w,
        "  config_drive:\n    type: boolean\n    default: false\n    description: boot with a config drive (else the metadata service serves user_data)"
    )?;
    if bootstrap_fits {
        writeln!(
            w,
            "  bootstrap_user_data:\n    type: string\n    default: ''\n    description: \"the pointer to a hosted bootstrap.ign (examples/openstack/host-bootstrap.sh); empty: bootstrap.ign itself\""
        )?;
    } else {
        writeln!(
            w,
            "  bootstrap_user_data:\n    type: string\n    description: \"the pointer to the hosted bootstrap.ign, which is too large for user_data (examples/openstack/host-bootstrap.sh writes it)\""
        )?;
    }
    Ok(())
}

/// The conditions the optional resources and rules hang on.
fn write_conditions(w: &mut String) -> std::fmt::Result {
    writeln!(w, "conditions:")?;
    for (name, param) in [
        ("has_external", "external_network"),
        ("has_api_fip", "api_floating_ip_id"),
        ("has_ingress_fip", "ingress_floating_ip_id"),
        ("has_ssh", "ssh_source"),
        ("hosted", "bootstrap_user_data"),
    ] {
        writeln!(
            w,
            "  {name}: {{not: {{equals: [{{get_param: {param}}}, '']}}}}"
        )?;
    }
    for source in [Source::Api, Source::Ingress, Source::Status] {
        let s = source.as_str();
        writeln!(
            w,
            "  {s}_anywhere: {{equals: [{{get_param: {s}_source}}, 0.0.0.0/0]}}"
        )?;
    }
    Ok(())
}

/// The network, its subnet (its pool kept clear of the VIPs), the router and the group.
fn write_network(w: &mut String, plan: &Plan) -> std::fmt::Result {
    let name = &plan.cluster;
    let tags = format!("      tags: ['{}']", plan.tag);
    writeln!(
        w,
        "  network:\n    type: OS::Neutron::Net\n    properties:\n      name: {name}\n{tags}"
    )?;
    writeln!(
        w,
        "  subnet:\n    type: OS::Neutron::Subnet\n    properties:\n      name: {name}\n      network: {{get_resource: network}}\n      cidr: {}\n{tags}",
        plan.machine_network
    )?;
    if let Some(pool) = plan.allocation_pool {
        writeln!(
            w,
            "      allocation_pools:\n      - {{start: {}, end: {}}}",
            pool.start, pool.end
        )?;
    }
    writeln!(
        w,
        "  router:\n    type: OS::Neutron::Router\n    condition: has_external\n    properties:\n      name: {name}\n      external_gateway_info: {{network: {{get_param: external_network}}}}\n{tags}"
    )?;
    writeln!(
        w,
        "  router_interface:\n    type: OS::Neutron::RouterInterface\n    condition: has_external\n    properties:\n      router: {{get_resource: router}}\n      subnet: {{get_resource: subnet}}"
    )?;
    writeln!(
        w,
        "  security_group:\n    type: OS::Neutron::SecurityGroup\n    properties:\n      name: {name}\n      description: keelson cluster {name}, least privilege (docs/openstack.md)\n      rules: []"
    )?;
    Ok(())
}

/// One `OS::Neutron::SecurityGroupRule` per rule and source: the machine network's unless
/// another source of the rule is anywhere, the operator's sources from the parameters, SSH
/// only when named.
fn write_rules(w: &mut String, plan: &Plan) -> std::fmt::Result {
    for (i, rule) in plan.rules.iter().enumerate() {
        for source in &rule.from {
            let (prefix, condition) = match source {
                Source::Machine => {
                    let other = rule.from.iter().find(|s| **s != Source::Machine);
                    (
                        plan.machine_network.to_string(),
                        other.map(|o| format!("{{not: {}_anywhere}}", o.as_str())),
                    )
                }
                Source::Ssh => ("{get_param: ssh_source}".into(), Some("has_ssh".into())),
                other => (format!("{{get_param: {}_source}}", other.as_str()), None),
            };
            writeln!(
                w,
                "  rule_{i}_{}:\n    type: OS::Neutron::SecurityGroupRule",
                source.as_str()
            )?;
            if let Some(c) = condition {
                writeln!(w, "    condition: {c}")?;
            }
            writeln!(
                w,
                "    properties:\n      security_group: {{get_resource: security_group}}\n      direction: ingress\n      remote_ip_prefix: {prefix}"
            )?;
            if rule.protocol.parse::<u8>().is_ok() {
                writeln!(w, "      protocol: '{}'", rule.protocol)?;
            } else {
                writeln!(w, "      protocol: {}", rule.protocol)?;
            }
            if let (Some(min), Some(max)) = (rule.port_min, rule.port_max) {
                writeln!(
                    w,
                    "      port_range_min: {min}\n      port_range_max: {max}"
                )?;
            }
        }
    }
    Ok(())
}

/// A port holding each VIP of the machine network (so Neutron hands the address to nobody
/// else, and the floating IP has a port to point at), with its floating IP when given.
fn write_vip_ports(w: &mut String, plan: &Plan) -> std::fmt::Result {
    for (kind, vips) in [("api", &plan.api_vips), ("ingress", &plan.ingress_vips)] {
        let Some(vip) = vips
            .iter()
            .find(|v| plan.machine_network.contains(*v))
            .filter(|v| v.is_ipv4())
        else {
            continue;
        };
        writeln!(
            w,
            "  {kind}_vip_port:\n    type: OS::Neutron::Port\n    properties:\n      name: {}-{kind}-vip\n      network: {{get_resource: network}}\n      fixed_ips:\n      - {{subnet: {{get_resource: subnet}}, ip_address: {vip}}}\n      tags: ['{}']",
            plan.cluster, plan.tag
        )?;
        writeln!(
            w,
            "  {kind}_floating_ip:\n    type: OS::Neutron::FloatingIPAssociation\n    condition: has_{kind}_fip\n    depends_on: router_interface\n    properties:\n      floatingip_id: {{get_param: {kind}_floating_ip_id}}\n      port_id: {{get_resource: {kind}_vip_port}}\n      fixed_ip_address: {vip}"
        )?;
    }
    Ok(())
}

/// A port (the VIPs as allowed address pairs) and a server for each node.
fn write_servers(w: &mut String, plan: &Plan, bootstrap_fits: bool) -> std::fmt::Result {
    let vips: Vec<&IpAddr> = plan.api_vips.iter().chain(&plan.ingress_vips).collect();
    for node in &plan.nodes {
        let res = node.name.replace('-', "_");
        let (image, flavor) = match node.role.as_str() {
            "bootstrap" => ("keelson_image", "bootstrap_flavor"),
            "master" => ("rhcos_image", "master_flavor"),
            _ => ("worker_image", "worker_flavor"),
        };
        writeln!(
            w,
            "  {res}_port:\n    type: OS::Neutron::Port\n    properties:\n      name: {}-{}\n      network: {{get_resource: network}}\n      fixed_ips:\n      - {{subnet: {{get_resource: subnet}}}}\n      security_groups:\n      - {{get_resource: security_group}}\n      tags: ['{}']\n      allowed_address_pairs:",
            plan.cluster, node.name, plan.tag
        )?;
        for vip in &vips {
            writeln!(w, "      - {{ip_address: {vip}}}")?;
        }
        let user_data = match (node.role.as_str(), bootstrap_fits) {
            ("bootstrap", true) => format!(
                "{{if: [hosted, {{get_param: bootstrap_user_data}}, {{get_file: {}}}]}}",
                node.user_data
            ),
            ("bootstrap", false) => "{get_param: bootstrap_user_data}".into(),
            _ => format!("{{get_file: {}}}", node.user_data),
        };
        writeln!(
            w,
            "  {res}:\n    type: OS::Nova::Server\n    properties:\n      name: {}\n      image: {{get_param: {image}}}\n      flavor: {{get_param: {flavor}}}\n      networks:\n      - {{port: {{get_resource: {res}_port}}}}\n      config_drive: {{get_param: config_drive}}\n      tags: ['{}']\n      user_data_format: RAW\n      user_data: {user_data}",
            node.name, plan.tag
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::install_config::InstallConfig;

    fn plan() -> Plan {
        let text = include_str!("../../examples/install-config.yaml").replace(
            "    cloud: openstack\n",
            "    cloud: openstack\n    externalNetwork: public\n    apiFloatingIP: 172.24.4.50\n",
        );
        let ic = InstallConfig::parse(&text).unwrap();
        crate::openstack::plan(&ic, &ic.cluster_config()).unwrap()
    }

    #[test]
    fn the_template_is_yaml_with_every_resource() {
        let t = template(&plan(), true).unwrap();
        let doc: serde_norway::Value = serde_norway::from_str(&t).unwrap();
        let resources = doc["resources"].as_mapping().unwrap();
        for r in [
            "network",
            "subnet",
            "router",
            "router_interface",
            "security_group",
            "api_vip_port",
            "api_floating_ip",
            "ingress_vip_port",
            "bootstrap",
            "master_0",
            "worker_1_port",
        ] {
            assert!(
                resources.contains_key(serde_norway::Value::String(r.into())),
                "{r}"
            );
        }
        assert_eq!(doc["parameters"]["external_network"]["default"], "public");
        // The API from anywhere by default; the machine network's copy of the rule only
        // when the source is narrowed; SSH only when named.
        let rule = |name: &str| &doc["resources"][name];
        assert_eq!(rule("rule_1_api")["properties"]["port_range_min"], 6443);
        assert_eq!(rule("rule_1_machine")["condition"]["not"], "api_anywhere");
        let ssh = plan()
            .rules
            .iter()
            .position(|r| r.from == [Source::Ssh])
            .unwrap();
        assert_eq!(rule(&format!("rule_{ssh}_ssh"))["condition"], "has_ssh");
        assert_eq!(rule("rule_0_machine")["properties"]["protocol"], "112");
        assert_eq!(
            rule("rule_0_machine")["properties"]["remote_ip_prefix"],
            "10.0.0.0/16"
        );
        // The bootstrap boots from bootstrap.ign unless given a pointer.
        let user_data = &doc["resources"]["bootstrap"]["properties"]["user_data"];
        assert_eq!(user_data["if"][0], "hosted");
        assert_eq!(user_data["if"][2]["get_file"], "bootstrap.ign");
    }

    #[test]
    fn a_bootstrap_over_the_limit_boots_from_the_pointer_only() {
        let t = template(&plan(), false).unwrap();
        let doc: serde_norway::Value = serde_norway::from_str(&t).unwrap();
        assert_eq!(
            doc["resources"]["bootstrap"]["properties"]["user_data"]["get_param"],
            "bootstrap_user_data"
        );
        assert!(
            doc["parameters"]["bootstrap_user_data"]
                .get("default")
                .is_none()
        );
        assert!(!t.contains("get_file: bootstrap.ign"));
    }
}
