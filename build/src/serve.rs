//! `keelson serve --dir DIR`: the Ignition server (docs/ignition-server.md) over a build directory.
//!
//! Reads `DIR/cluster.json`, `DIR/tls/{server.crt,server.key}` and serves `DIR/assets/*`
//! under `/assets/`. Clients allowed: `--allow` if given, else the cluster's
//! `ignition.allowedNetworks`, else its machine networks; loopback always.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use ipnet::IpNet;
use keelson_cluster::ClusterConfig;
use keelson_cluster::server::{
    Assets, ConfigSource, IgnitionServer, RenderSource, ServerOptions, default_allowed_networks,
    tls_config_from_files,
};
use tokio_util::sync::CancellationToken;

/// Arguments of `keelson serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The `keelson build` output directory (cluster.json, tls/, assets/).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// TLS listen address.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:22623")]
    pub listen: SocketAddr,
    /// Plain-HTTP listen address.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:22624")]
    pub listen_plain: SocketAddr,
    /// Bootstrap mode: serve only the master pool (`/config/worker` answers 500 so that
    /// workers retry until a master serves them).
    #[arg(long)]
    pub bootstrap: bool,
    /// Client networks allowed to fetch configs (repeatable); default: cluster.json's
    /// `ignition.allowedNetworks`, or its machine networks. Loopback is always allowed.
    #[arg(long = "allow", value_name = "CIDR")]
    pub allow: Vec<IpNet>,
}

/// Renders from `DIR/cluster.json`, `DIR/tls/` and the agent in `DIR/assets/keelson-agent`:
/// byte-identical to `keelson render` with the same inputs.
pub fn config_source(dir: &Path, cluster: &ClusterConfig) -> anyhow::Result<Arc<dyn ConfigSource>> {
    let source = RenderSource::from_files(
        cluster.clone(),
        &dir.join("tls"),
        &dir.join("assets").join(crate::payloads::AGENT_ASSET),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Arc::new(source))
}

/// A configured, bound server for `args` (split from [`run`] so tests bind port 0).
pub async fn bind(args: &ServeArgs) -> anyhow::Result<keelson_cluster::server::BoundServer> {
    let cluster_path = args.dir.join("cluster.json");
    let bytes = std::fs::read(&cluster_path)
        .with_context(|| format!("reading {}", cluster_path.display()))?;
    let cluster =
        ClusterConfig::from_json(&bytes).with_context(|| format!("{}", cluster_path.display()))?;
    let tls = tls_config_from_files(
        &args.dir.join("tls/server.crt"),
        &args.dir.join("tls/server.key"),
    )?;
    let assets = Assets::from_dir(&args.dir.join("assets"))?;
    let allowed = if args.allow.is_empty() {
        default_allowed_networks(&cluster)
    } else {
        args.allow.clone()
    };
    tracing::info!(
        assets = ?assets.names().collect::<Vec<_>>(),
        allowed = ?allowed,
        bootstrap = args.bootstrap,
        "keelson serve"
    );
    let opts = ServerOptions {
        tls_listen: Some(args.listen),
        plain_listen: Some(args.listen_plain),
        bootstrap: args.bootstrap,
        allowed_networks: allowed,
        ..ServerOptions::default()
    };
    let server = IgnitionServer::from_shared(config_source(&args.dir, &cluster)?, assets, opts)
        .with_tls(tls);
    Ok(server.bind().await?)
}

/// Serves until SIGINT or SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let bound = bind(&args).await?;
    eprintln!(
        "keelson serve: https://{} and http://{} (Ctrl-C stops)",
        bound.tls_addr().map(|a| a.to_string()).unwrap_or_default(),
        bound
            .plain_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );
    let stop = CancellationToken::new();
    keelson_agent::signals::cancel_on_stop_signal(stop.clone())?;
    bound.serve(stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER_JSON: &str = r#"{
      "version": 1, "name": "ocp4", "baseDomain": "osd2019.local",
      "machineNetworks": ["10.0.0.0/16"], "apiVips": ["10.0.0.5"], "ingressVips": ["10.0.0.7"],
      "vrrp": {"instances": []},
      "api": {"frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
              "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 2,
              "connectTimeoutMs": 1000, "idleTimeoutSecs": 3600, "maxConnections": 1000},
      "dns": {"port": 53, "ttl": 30, "manageResolvConf": false},
      "ignition": {"tlsPort": 22623, "plainPort": 22624, "allowedNetworks": [], "spec": "3.2.0"},
      "members": {"transport": "mdns", "renewIntervalSecs": 10, "expirySecs": 30}
    }"#;

    /// curl on the host: the status and the body.
    fn curl(args: &[&str]) -> (String, Vec<u8>) {
        let reply = keelson_testkit::http::curl(args);
        (reply.status.to_string(), reply.body)
    }

    #[test]
    fn default_allowed_falls_back_to_machine_networks() {
        let mut c = ClusterConfig::from_json(CLUSTER_JSON.as_bytes()).unwrap();
        assert_eq!(
            default_allowed_networks(&c),
            vec!["10.0.0.0/16".parse::<IpNet>().unwrap()]
        );
        c.ignition.allowed_networks = vec!["10.0.1.0/24".parse().unwrap()];
        assert_eq!(
            default_allowed_networks(&c),
            vec!["10.0.1.0/24".parse::<IpNet>().unwrap()]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_a_build_directory() {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("cluster.json"), CLUSTER_JSON).unwrap();
        std::fs::create_dir_all(d.join("tls")).unwrap();
        std::fs::create_dir_all(d.join("assets")).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Distinct from the server's default subject, or clients see a self-signed cert.
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "keelson serve test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(d.join("tls/ca.crt"), ca.pem()).unwrap();
        std::fs::write(d.join("tls/server.crt"), cert.pem()).unwrap();
        std::fs::write(d.join("tls/server.key"), key.serialize_pem()).unwrap();
        std::fs::write(d.join("assets/keelson-agent"), b"\x7fELF agent").unwrap();
        let cluster = ClusterConfig::from_json(CLUSTER_JSON.as_bytes()).unwrap();
        let source = config_source(d, &cluster).unwrap();
        let master = source
            .config(
                keelson_cluster::Role::Master,
                keelson_cluster::SpecVersion::V3_2,
            )
            .unwrap()
            .to_vec();
        let master22 = source
            .config(
                keelson_cluster::Role::Master,
                keelson_cluster::SpecVersion::V2_2,
            )
            .unwrap()
            .to_vec();
        // What `keelson render` prints for the same inputs.
        let assets = keelson_cluster::render::NodeAssets {
            ca_pem: ca.pem(),
            server_cert_pem: cert.pem(),
            server_key_pem: key.serialize_pem(),
            agent_sha512: hex::encode(<sha2::Sha512 as sha2::Digest>::digest(b"\x7fELF agent")),
            agent_url: None,
            agent_inline: None,
            membership_keys: Default::default(),
            operator: Default::default(),
        };
        assert_eq!(
            master,
            keelson_cluster::render::render_full(
                &cluster,
                keelson_cluster::Role::Master,
                keelson_cluster::SpecVersion::V3_2,
                &assets
            )
            .unwrap()
        );

        let args = ServeArgs {
            dir: d.to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            listen_plain: "127.0.0.1:0".parse().unwrap(),
            bootstrap: true,
            allow: vec![],
        };
        let bound = bind(&args).await.unwrap();
        let (tls, plain) = (bound.tls_addr().unwrap(), bound.plain_addr().unwrap());
        let stop = CancellationToken::new();
        let task = tokio::spawn(bound.serve(stop.clone()));
        let ca_path = d.join("tls/ca.crt").display().to_string();
        let tls_port = tls.port();
        let results = tokio::task::spawn_blocking(move || {
            let resolve = format!("localhost:{tls_port}:127.0.0.1");
            let url = |p: &str| format!("https://localhost:{tls_port}{p}");
            let accept = "Accept: application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1";
            vec![
                curl(&[
                    "--cacert",
                    &ca_path,
                    "--resolve",
                    &resolve,
                    "-H",
                    accept,
                    &url("/config/master"),
                ]),
                curl(&[
                    "--cacert",
                    &ca_path,
                    "--resolve",
                    &resolve,
                    "-H",
                    accept,
                    &url("/config/worker"),
                ]),
                curl(&[
                    "--cacert",
                    &ca_path,
                    "--resolve",
                    &resolve,
                    &url("/assets/keelson-agent"),
                ]),
                curl(&[&format!("http://{plain}/config/master")]),
            ]
        })
        .await
        .unwrap();
        assert_eq!(results[0], ("200".to_string(), master.clone()));
        assert_eq!(results[1].0, "500", "bootstrap mode: worker retries");
        assert_eq!(results[2], ("200".to_string(), b"\x7fELF agent".to_vec()));
        // No Accept version: spec 2.2.0, as Ignition 0.x clients expect.
        assert_eq!(results[3], ("200".to_string(), master22));
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let args = ServeArgs {
            dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            listen_plain: "127.0.0.1:0".parse().unwrap(),
            bootstrap: false,
            allow: vec![],
        };
        let e = format!("{:#}", bind(&args).await.unwrap_err());
        assert!(e.contains("cluster.json"), "{e}");
        std::fs::write(dir.path().join("cluster.json"), CLUSTER_JSON).unwrap();
        let e = format!("{:#}", bind(&args).await.unwrap_err());
        assert!(e.contains("tls/server.crt"), "{e}");
    }
}
