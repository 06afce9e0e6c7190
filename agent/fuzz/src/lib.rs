//! Helpers the fuzz targets share: splitting one input into several packets, the cluster
//! fixture, a runtime for the async entry points, scratch paths for file parsers, and the
//! checks on a config drive read.

use std::path::PathBuf;
use std::sync::OnceLock;

use keelson_cluster::ClusterConfig;

/// The unit tests' `cluster.json` (zone `ocp4.example.com`, machine network 10.0.0.0/24).
pub const CLUSTER_JSON: &str = include_str!("../../src/dns/testdata/cluster.json");

/// [`CLUSTER_JSON`], parsed once.
pub fn cluster() -> &'static ClusterConfig {
    static CLUSTER: OnceLock<ClusterConfig> = OnceLock::new();
    CLUSTER.get_or_init(|| ClusterConfig::from_json(CLUSTER_JSON.as_bytes()).expect("fixture"))
}

/// Splits `data` into packets, each prefixed by its length (2 bytes, big-endian); a length
/// running past the end takes what is left. Lets one input be a sequence of packets, so
/// state carried between packets (caches, the DHCP client) is fuzzed too.
pub fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let rest = &data[2..];
        let (frame, tail) = rest.split_at(len.min(rest.len()));
        out.push(frame);
        data = tail;
    }
    out
}

/// The inverse of [`frames`], for building seeds.
pub fn frame(packets: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in packets {
        let len = u16::try_from(p.len()).expect("packet under 64 KiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// A current-thread runtime with time and I/O, built once per process.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// A directory private to this fuzzing process, on tmpfs when there is one: file parsers
/// are fed through real files. Removed when the process exits (libFuzzer ends with `exit`).
pub fn scratch_dir() -> &'static std::path::Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("keelson-fuzz-")
            .tempdir_in(parent)
            .expect("scratch directory")
            .keep();
        extern "C" fn remove_scratch() {
            if let Some(dir) = DIR.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registers a plain `extern "C" fn()` that takes no arguments, as atexit(3)
        // requires; it only reads the OnceLock, which is initialised by then.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// A file path in [`scratch_dir`].
pub fn scratch_file(name: &str) -> PathBuf {
    scratch_dir().join(name)
}

/// Reads the config-drive image at `path` as init does and checks the outcome: a drive
/// that reads was probed and has a config-drive label; a failure is `Invalid` naming the
/// drive.
pub fn check_config_drive(path: &std::path::Path) {
    use keelson_agent::metadata::{MetadataError, config_drive};
    let probed = config_drive::probe(path);
    match config_drive::read(path) {
        Ok(md) => {
            assert_eq!(md.source, format!("config-drive:{}", path.display()));
            let (_, label) = probed.expect("a drive that reads was probed");
            assert!(config_drive::is_config_drive_label(&label));
        }
        Err(MetadataError::Invalid { origin, message }) => {
            assert!(origin.starts_with("config-drive:"));
            assert!(!message.is_empty());
        }
        Err(other) => panic!("a read error must name the drive: {other}"),
    }
}
