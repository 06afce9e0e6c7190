//! The RHCOS stand-in (docs/rhcos.md, docs/qemu-cluster.md): what makes a node "RHCOS" for
//! keelson, built from Debian packages as a test fixture.
//!
//! The Debian cloud kernel; a dracut initramfs whose first boot runs the unmodified upstream
//! Ignition 2.14 (Debian's `ignition` and its dracut module `30ignition`) with `-platform
//! openstack -root /sysroot`; a root with systemd, NetworkManager and nftables; the stand-in
//! kube-apiserver on `*:6443` as a systemd unit. The payload (`master.ign`), not the image,
//! installs the agent and its unit. Built with `mmdebstrap` into a directory and
//! `mkfs.ext4 -d` (no mount), cached under `payload::standin_cache()`.
//!
//! - [`recipe`]: packages, files, keys, kernel command line (pure).
//! - [`build`]: runs the recipe and keeps the cache.

pub mod build;
pub mod recipe;

pub use build::{BuildTimes, Manifest, StandinImage, disk, ensure};
pub use recipe::{BootSpec, NodeNetwork};
