//! `keelson build` beside `openshift-install`'s ignition configs, for both eras of
//! OpenShift.

use super::*;

#[test]
fn beside_openshift_install_both_eras() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let ic = platform_none(work.path());
    // platform none has no VIPs: the build says where to give them.
    let out = work.path().join("out");
    let o = keelson(&[
        "build",
        "--config",
        &ic,
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--openshift-install-dir",
        OPENSHIFT_414,
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--api-vip"));
    for (dir, spec, key) in [
        (OPENSHIFT_414, "3.2.0", "merge"),
        (OPENSHIFT_42, "2.2.0", "append"),
    ] {
        let out = work.path().join(format!("out-{spec}"));
        let o = keelson(&[
            "build",
            "--config",
            &ic,
            "--out",
            out.to_str().unwrap(),
            "--agent",
            &agent,
            "--no-image",
            "--openshift-install-dir",
            dir,
            "--api-vip",
            "10.0.0.5",
            "--ingress-vip",
            "10.0.0.7",
        ]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("api-int.ocp4.osd2019.local"),
            "the DNS note: {err}"
        );
        for role in ["master", "worker"] {
            let p = json(&out.join(format!("{role}.ign")));
            assert_eq!(p["ignition"]["version"], spec);
            let sources: Vec<&str> = p["ignition"]["config"][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["source"].as_str().unwrap())
                .collect();
            assert_eq!(
                sources,
                [
                    format!("https://api-int.ocp4.osd2019.local:22623/config/{role}"),
                    format!("https://10.0.0.5:22626/config/{role}")
                ]
            );
            assert_eq!(
                p["ignition"]["security"]["tls"]["certificateAuthorities"]
                    .as_array()
                    .unwrap()
                    .len(),
                2
            );
        }
        let cluster = json(&out.join("cluster.json"));
        assert_eq!(cluster["ignition"]["tlsPort"], 22626);
        assert_eq!(cluster["ignition"]["plainPort"], 22627);
        assert!(cluster.get("sshAuthorizedKeys").is_none(), "{cluster}");
        let checks = &cluster["vrrp"]["instances"][0]["checks"];
        assert!(
            checks
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["check"]["url"] == "https://127.0.0.1:22623/healthz"),
            "{checks}"
        );
        // OpenShift's bootstrap with keelson's: bootkube and the agent, the agent inline.
        let b = json(&out.join("bootstrap.ign"));
        assert_eq!(b["ignition"]["version"], spec);
        let units: Vec<&str> = b["systemd"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["name"].as_str().unwrap())
            .collect();
        assert!(
            units.contains(&"bootkube.service") && units.contains(&"keelson-agent.service"),
            "{units:?}"
        );
        let agent_file = b["storage"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/usr/local/bin/keelson-agent")
            .unwrap();
        assert!(
            agent_file["contents"]["source"]
                .as_str()
                .unwrap()
                .starts_with("data:")
        );
    }
    // The install-config of another cluster than openshift-install's.
    let other = work.path().join("other.yaml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&ic)
            .unwrap()
            .replace("name: ocp4", "name: lab"),
    )
    .unwrap();
    let o = keelson(&[
        "build",
        "--config",
        other.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--openshift-install-dir",
        OPENSHIFT_414,
        "--api-vip",
        "10.0.0.5",
        "--ingress-vip",
        "10.0.0.7",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("metadata.json clusterName is \"ocp4\""));
}
