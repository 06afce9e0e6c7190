use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use keelson_cluster::Role;

use crate::node::NodeIdentity;

fn context() -> AgentContext {
    let cluster =
        keelson_cluster::ClusterConfig::from_json(include_bytes!("../dns/testdata/cluster.json"))
            .unwrap();
    let node = NodeIdentity {
        name: "worker-0".parse().unwrap(),
        role: Role::Worker,
        interface: "lo".into(),
        addresses: vec![],
    };
    AgentContext::new(cluster, node)
}

fn fast() -> Backoff {
    Backoff::new(
        Duration::from_millis(10),
        Duration::from_millis(40),
        Duration::from_secs(60),
    )
}

#[test]
fn backoff_doubles_caps_and_resets_after_a_healthy_run() {
    let mut b = Backoff::new(
        Duration::from_secs(1),
        Duration::from_secs(8),
        Duration::from_secs(60),
    )
    .without_jitter();
    let short = Duration::from_millis(10);
    let delays: Vec<u64> = (0..6).map(|_| b.delay_after(short).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
    assert_eq!(b.delay_after(Duration::from_secs(61)).as_secs(), 1);
    assert_eq!(b.delay_after(short).as_secs(), 2);
}

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn panicky(
    ctx: AgentContext,
    stop: CancellationToken,
) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> {
    boxed(async move {
        if PANICS.fetch_add(1, Ordering::SeqCst) < 2 {
            panic!("boom");
        }
        ctx.bus.mark_ready("panicky");
        stop.cancelled().await;
        Ok(())
    })
}

static FAILS: AtomicUsize = AtomicUsize::new(0);

fn failing(
    _: AgentContext,
    _: CancellationToken,
) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> {
    boxed(async move {
        FAILS.fetch_add(1, Ordering::SeqCst);
        anyhow::bail!("no such thing")
    })
}

#[tokio::test]
async fn panics_and_errors_are_restarted_and_stop_is_orderly() {
    let ctx = context();
    let stop = CancellationToken::new();
    let mut sup = Supervisor::new(ctx.clone(), stop.clone()).with_backoff(fast());
    sup.service("panicky", panicky);
    sup.service("failing", failing);
    let mut ready = ctx.bus.ready.subscribe();
    tokio::time::timeout(
        Duration::from_secs(5),
        ready.wait_for(|r| r.contains("panicky")),
    )
    .await
    .expect("the service came up after two panics")
    .unwrap();
    assert_eq!(PANICS.load(Ordering::SeqCst), 3);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        FAILS.load(Ordering::SeqCst) >= 3,
        "the failing service keeps being retried"
    );
    let restarts = ctx.bus.restarts.borrow().clone();
    assert!(
        restarts["failing"].last_error.contains("no such thing")
            && restarts["failing"].restarts >= 3,
        "{restarts:?}"
    );
    stop.cancel();
    assert!(sup.wait(Duration::from_secs(5)).await, "everything stopped");
}

#[tokio::test]
async fn processes_restart_by_policy_and_are_killed_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("runs");
    let ctx = context();
    let stop = CancellationToken::new();
    let mut sup = Supervisor::new(ctx.clone(), stop.clone()).with_backoff(fast());
    let spec = |name: &str, script: String, restart| ServiceSpec {
        name: name.into(),
        path: "/bin/sh".into(),
        args: vec!["-c".into(), script],
        env: [("OUT".to_owned(), counter.display().to_string())].into(),
        restart,
        roles: vec![],
        asset: None,
    };
    // Fails every time: restarted with backoff.
    assert!(sup.process(spec(
        "crashy",
        "echo x >> \"$OUT\"; exit 3".into(),
        RestartPolicy::OnFailure
    )));
    // Succeeds: on-failure does not restart it.
    assert!(sup.process(spec(
        "oneshot",
        "echo \"$KEELSON_NODE_NAME\" > \"$OUT.name\"".into(),
        RestartPolicy::OnFailure
    )));
    // Long-running: killed on stop.
    let pidfile = dir.path().join("sleeper.pid");
    assert!(sup.process(spec(
        "sleeper",
        format!("echo $$ > {}; exec sleep 300", pidfile.display()),
        RestartPolicy::Always
    )));
    // Not for this role.
    assert!(!sup.process(ServiceSpec {
        roles: vec![Role::Master],
        ..spec("masters-only", "exit 0".into(), RestartPolicy::Never)
    }));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let runs = std::fs::read_to_string(&counter).unwrap().lines().count();
    assert!(runs >= 3, "crashy restarted: {runs} runs");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("runs.name"))
            .unwrap()
            .trim(),
        "worker-0"
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(is_supervised(pid));
    stop.cancel();
    assert!(sup.wait(Duration::from_secs(10)).await);
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "sleeper was stopped"
    );
    assert!(!is_supervised(pid));
}

/// A service bound to the node's link is stopped cleanly and started again at once on the
/// identity the address watcher published, when its predicate cares; not counted as a
/// restart. One that does not care keeps running.
#[tokio::test]
async fn a_service_following_the_node_restarts_on_its_new_link() {
    let ctx = context();
    let stop = CancellationToken::new();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<(String, bool)>();
    let mut sup = Supervisor::new(ctx.clone(), stop.clone()).with_backoff(fast());
    let tx = seen_tx.clone();
    sup.service_following(
        "bound",
        |old, new| old.interface != new.interface,
        move |c, s| {
            let tx = tx.clone();
            boxed(async move {
                let _ = tx.send((c.node.interface.clone(), false));
                s.cancelled().await;
                let _ = tx.send((c.node.interface.clone(), true));
                Ok(())
            })
        },
    );
    let tx = seen_tx.clone();
    sup.service_following(
        "indifferent",
        |_, _| false,
        move |c, s| {
            let tx = tx.clone();
            boxed(async move {
                let _ = tx.send((format!("indifferent {}", c.node.interface), false));
                s.cancelled().await;
                Ok(())
            })
        },
    );
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), seen.recv())
            .await
            .unwrap()
            .unwrap()
    };
    let mut first = vec![next().await, next().await];
    first.sort();
    assert_eq!(
        first,
        [("indifferent lo".to_string(), false), ("lo".into(), false)]
    );
    let moved = NodeIdentity {
        interface: "br-ex".into(),
        ..(*ctx.node).clone()
    };
    ctx.bus.node.send_replace(Some(std::sync::Arc::new(moved)));
    // Stopped on the old link (cleanly: it saw its token), started on the new one.
    assert_eq!(next().await, ("lo".into(), true));
    assert_eq!(next().await, ("br-ex".into(), false));
    assert!(ctx.bus.restarts.borrow().is_empty(), "not a restart");
    assert_eq!(ctx.current_node().interface, "br-ex");
    stop.cancel();
    assert!(sup.wait(Duration::from_secs(5)).await);
    assert_eq!(next().await, ("br-ex".into(), true));
}
