//! Service executables carried by the appliance image (`keelson build --asset` puts them in
//! `/etc/keelson/assets/`). Masters and workers get theirs from the Ignition server; the
//! bootstrap's config cannot point at a server it is about to start itself, so it installs
//! them from the image instead.

use std::path::{Path, PathBuf};

use keelson_cluster::{ClusterConfig, Role};
use sha2::{Digest, Sha512};

/// Where the image carries the build's assets, relative to the root it is unpacked in.
pub const IMAGE_ASSETS_DIR: &str = keelson_cluster::paths::ASSETS_DIR.split_at(1).1;

/// What [`install_from_image`] did, one line per service.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Installed {
    /// Executables copied into place.
    pub installed: Vec<PathBuf>,
    /// Services whose executable is neither in place nor (verified) in the image.
    pub missing: Vec<String>,
}

/// For every service of `role` with an asset and no executable at its path yet, copies the
/// image's copy into place, if its sha512 is the one cluster.json names.
pub fn install_from_image(cluster: &ClusterConfig, role: Role, root: &Path) -> Installed {
    let mut out = Installed::default();
    for svc in cluster.services.iter().filter(|s| s.runs_on(role)) {
        let Some(asset) = &svc.asset else { continue };
        let target = root.join(svc.path.trim_start_matches('/'));
        if target.exists() {
            continue;
        }
        let source = root.join(IMAGE_ASSETS_DIR).join(&asset.name);
        let copied = std::fs::read(&source)
            .ok()
            .filter(|bytes| hex::encode(Sha512::digest(bytes)) == asset.sha512)
            .and_then(|bytes| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::create_dir_all(target.parent()?).ok()?;
                std::fs::write(&target, bytes).ok()?;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).ok()
            });
        match copied {
            Some(()) => out.installed.push(target),
            None => out.missing.push(format!(
                "service {}: {} is not here and {} is not in the image with the sha512 of cluster.json",
                svc.name,
                svc.path,
                source.display()
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use keelson_cluster::cluster::{ServiceAsset, ServiceSpec};

    fn cluster(bytes: &[u8]) -> ClusterConfig {
        let text = include_str!("../../../examples/install-config.yaml");
        let mut c = keelson_cluster::install_config::InstallConfig::parse(text)
            .unwrap()
            .cluster_config();
        c.services.push(ServiceSpec {
            name: "svc".into(),
            path: "/usr/local/bin/svc".into(),
            args: vec![],
            env: Default::default(),
            restart: Default::default(),
            roles: vec![Role::Bootstrap],
            asset: Some(ServiceAsset {
                name: "svc".into(),
                sha512: hex::encode(Sha512::digest(bytes)),
            }),
        });
        c
    }

    #[test]
    fn installs_verified_image_copies_for_the_roles_that_run_them() {
        let root = tempfile::tempdir().unwrap();
        let c = cluster(b"binary");
        std::fs::create_dir_all(root.path().join(IMAGE_ASSETS_DIR)).unwrap();
        std::fs::write(root.path().join(IMAGE_ASSETS_DIR).join("svc"), b"binary").unwrap();
        // Not a master service: nothing to do.
        assert_eq!(
            install_from_image(&c, Role::Master, root.path()),
            Installed::default()
        );
        let done = install_from_image(&c, Role::Bootstrap, root.path());
        let target = root.path().join("usr/local/bin/svc");
        assert_eq!(done.installed, vec![target.clone()]);
        assert_eq!(std::fs::read(&target).unwrap(), b"binary");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // Already in place: left alone.
        assert_eq!(
            install_from_image(&c, Role::Bootstrap, root.path()),
            Installed::default()
        );
    }

    #[test]
    fn a_wrong_hash_is_reported_not_installed() {
        let root = tempfile::tempdir().unwrap();
        let c = cluster(b"the real one");
        std::fs::create_dir_all(root.path().join(IMAGE_ASSETS_DIR)).unwrap();
        std::fs::write(root.path().join(IMAGE_ASSETS_DIR).join("svc"), b"tampered").unwrap();
        let done = install_from_image(&c, Role::Bootstrap, root.path());
        assert!(done.installed.is_empty());
        assert_eq!(done.missing.len(), 1);
        assert!(
            done.missing[0].contains("service svc"),
            "{:?}",
            done.missing
        );
        assert!(!root.path().join("usr/local/bin/svc").exists());
    }
}
