//! `keelson-agent run` as an operator starts it: services up, the ready line, `status` over
//! the socket, an operator process from cluster.json, and an orderly stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keelson_testkit::cmd::output_ok;
use keelson_testkit::{Proc, free_port, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_keelson-agent");

#[test]
fn run_prints_ready_serves_status_runs_operator_processes_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let marker = dir.path().join("operator-ran");
    let mut cluster: serde_json::Value =
        serde_json::from_slice(include_bytes!("../src/dns/testdata/cluster.json")).unwrap();
    cluster["machineNetworks"] = serde_json::json!(["127.0.0.0/8"]);
    cluster["apiVips"] = serde_json::json!(["127.0.0.5"]);
    cluster["ingressVips"] = serde_json::json!(["127.0.0.7"]);
    cluster["dns"]["port"] = port.into();
    cluster["services"] = serde_json::json!([
        {"name": "hello", "path": "/bin/sh",
         "args": ["-c", format!("echo \"$KEELSON_NODE_ROLE\" > {}; exec sleep 300", marker.display())],
         "roles": ["master"]}
    ]);
    std::fs::write(dir.path().join("cluster.json"), cluster.to_string()).unwrap();
    std::fs::write(
        dir.path().join("node.json"),
        r#"{"name":"master-0","role":"master","interface":"lo","addresses":["127.0.0.1/8"]}"#,
    )
    .unwrap();
    let socket = dir.path().join("status.sock");
    let mut agent = Proc::spawn(
        Command::new(BIN)
            .arg("run")
            .arg("--cluster")
            .arg(dir.path().join("cluster.json"))
            .arg("--node")
            .arg(dir.path().join("node.json"))
            .args(["--only", "dns"])
            .arg("--status-socket")
            .arg(&socket)
            .stderr(Stdio::piped()),
    );
    let stderr = BufReader::new(agent.0.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    let ready = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("ready line within 20 s");
        if line.starts_with("keelson-agent ready:") {
            break line;
        }
    };
    eprintln!("ready after {:?}", start.elapsed());
    assert_eq!(
        ready,
        "keelson-agent ready: node=master-0 role=master services=dns"
    );

    // The shell creates the file (`>`) a moment before `echo` writes the line: wait for
    // the line, not the file.
    let written = || std::fs::read_to_string(&marker).unwrap_or_default();
    wait_for(
        "the operator process's line",
        Duration::from_secs(10),
        || written().ends_with('\n'),
    );
    assert_eq!(written().trim(), "master");

    let status = output_ok(
        Command::new(BIN)
            .args(["status", "--json", "--socket"])
            .arg(&socket),
    );
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["node"]["name"], "master-0");
    assert_eq!(doc["node"]["role"], "master");
    assert_eq!(doc["ready"], serde_json::json!(["dns"]));
    let human = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("node master-0 (master)"));

    agent.signal_term();
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not stop within 15 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    assert!(!socket.exists(), "status socket removed");
}

#[test]
fn bad_cluster_json_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cluster.json"),
        r#"{"version":1,"name":"x","bogus":true}"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("run")
        .arg("--cluster")
        .arg(dir.path().join("cluster.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.json"), "{err}");
}

/// `--version` names the release and the commit it was built from (or `unknown`).
#[test]
fn version_names_the_release_and_the_commit() {
    let out = String::from_utf8(output_ok(Command::new(BIN).arg("--version")).stdout).unwrap();
    keelson_testkit::cmd::check_version_line(&out, "keelson-agent", env!("CARGO_PKG_VERSION"));
}
