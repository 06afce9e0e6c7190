//! Operator configs: one rides along in bootstrap.ign and the served configs, and a clash
//! with what keelson writes stops the build before anything is written.

use super::*;

#[test]
fn an_operator_config_rides_along_in_bootstrap_ign_and_the_served_configs() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let op = work.path().join("master.ign");
    // A Butane-made 3.0 config: a unit and a file for the masters.
    std::fs::write(
        &op,
        r#"{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"/etc/operator","contents":{"source":"data:,hi"},"mode":420}]},"systemd":{"units":[{"name":"op.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}]}}"#,
    )
    .unwrap();
    let boot = work.path().join("bootstrap.ign");
    std::fs::write(
        &boot,
        r#"{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/boot-op","contents":{"source":"data:,b"}}]}}"#,
    )
    .unwrap();
    let out = work.path().join("out");
    let merge_master = format!("master={}", op.display());
    let merge_boot = format!("bootstrap={}", boot.display());
    let o = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--merge",
        &merge_master,
        "--merge",
        &merge_boot,
    ]);
    ok(&o);
    let b = json(&out.join("bootstrap.ign"));
    let paths: Vec<&str> = b["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/etc/boot-op"), "{paths:?}");
    assert!(
        paths.contains(&"/etc/keelson/merge/master.ign"),
        "{paths:?}"
    );
    assert!(paths.contains(&"/etc/keelson/cluster.json"), "{paths:?}");
    // The served master config: what `keelson serve` answers is keelson's with the
    // operator's merged, in the build's spec (3.2.0, converted from 3.0.0).
    let kept = json(&out.join("merge/master.ign"));
    assert_eq!(kept["ignition"]["version"], "3.2.0");
    let rendered = keelson(&[
        "render",
        "--config",
        EXAMPLE,
        "--role",
        "master",
        "--dir",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--merge",
        &merge_master,
        "--merge",
        &merge_boot,
    ]);
    let master: serde_json::Value = serde_json::from_str(&ok(&rendered)).unwrap();
    assert_eq!(
        master["systemd"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["name"] == "op.service")
            .count(),
        1
    );
    // An appliance bootstrap is told what it will not apply.
    let unit_boot = work.path().join("unit-boot.ign");
    std::fs::write(
        &unit_boot,
        r#"{"ignition":{"version":"3.2.0"},"systemd":{"units":[{"name":"x.service","contents":"[Service]\n"}]}}"#,
    )
    .unwrap();
    let o = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--merge",
        &format!("bootstrap={}", unit_boot.display()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("will not run x.service"), "{err}");
}

#[test]
fn a_clash_stops_the_build_before_anything_is_written() {
    let work = tempfile::tempdir().unwrap();
    let agent = fake_agent(work.path());
    let op = work.path().join("bad.ign");
    std::fs::write(
        &op,
        r#"{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/keelson/cluster.json","contents":{"source":"data:,mine"}}]}}"#,
    )
    .unwrap();
    let out = work.path().join("out");
    let o = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--merge",
        &format!("bootstrap={}", op.display()),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("storage.files path \"/etc/keelson/cluster.json\": defined by keelson's bootstrap config and by --merge bootstrap="),
        "{err}"
    );
    assert!(err.contains("keelson owns that path"), "{err}");
    // Nothing half-written: no config, and no staging directory left behind.
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| n == "tls"), "left in --out: {left:?}");
    for (arg, want) in [
        (
            "infra=x.ign".to_owned(),
            "expected a role of bootstrap, master or worker",
        ),
        (
            format!("master={}", work.path().join("missing.ign").display()),
            "missing.ign",
        ),
    ] {
        let o = keelson(&[
            "build",
            "--config",
            EXAMPLE,
            "--out",
            out.to_str().unwrap(),
            "--agent",
            &agent,
            "--no-image",
            "--merge",
            &arg,
        ]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{arg}");
    }
    let not_ign = work.path().join("butane.bu");
    std::fs::write(&not_ign, "variant: fcos\nversion: 1.5.0\n").unwrap();
    let o = keelson(&[
        "build",
        "--config",
        EXAMPLE,
        "--out",
        out.to_str().unwrap(),
        "--agent",
        &agent,
        "--no-image",
        "--merge",
        &format!("worker={}", not_ign.display()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("butane.bu: expected an Ignition config (JSON)"),
        "{err}"
    );
}
