//! Kernel module selection: the closure of the wanted modules over `modules.dep`, in the order
//! they must be loaded (dependencies first).
//!
//! Pure: works on the text of `modules.dep` and `modules.builtin`, so it is unit-tested
//! without a kernel tree.

use std::collections::{BTreeMap, BTreeSet};

/// The modules the appliance needs (docs/image.md): virtio, the block drivers a config
/// drive arrives on, common NICs, the ACPI power button and its input events, and VLAN/bond
/// support for `network_data.json` links. Names as `modprobe` takes them.
pub const WANTED: &[&str] = &[
    // virtio transport, disks, NIC.
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "virtio_scsi",
    // Config drive as a CD-ROM (IDE on i440fx, SCSI) or a disk.
    "sr_mod",
    "cdrom",
    "sd_mod",
    "ata_piix",
    "ahci",
    // NICs OpenStack commonly exposes besides virtio.
    "e1000",
    "e1000e",
    // The cloud's entropy source (Nova's `hw_rng_model=virtio`): without RDRAND or this, the
    // kernel's CRNG fills only from interrupts and TLS waits for it.
    "virtio_rng",
    // ACPI power button -> input event the agent reads for an orderly power-off.
    "button",
    "evdev",
    // network_data.json vlan and bond links.
    "8021q",
    "bonding",
];

/// The module closure to put into the image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModuleSet {
    /// Module files, relative to `lib/modules/<version>/`, in load order.
    pub load_order: Vec<String>,
    /// Wanted modules that are built into this kernel (nothing to load).
    pub builtin: Vec<String>,
    /// Wanted modules this kernel does not have at all (e.g. Debian's cloud kernel has no
    /// e1000 or ahci); recorded in the manifest, not an error.
    pub missing: Vec<String>,
}

/// Errors in `modules.dep`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModulesError {
    /// A line is not `path: dep dep...`.
    #[error("modules.dep line {line}: expected `path.ko: dependencies`, got {text:?}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A module depends on one that is not listed.
    #[error("modules.dep: {module} depends on {dependency}, which has no entry")]
    MissingDependency {
        /// The module.
        module: String,
        /// The dependency.
        dependency: String,
    },
    /// Dependencies form a cycle.
    #[error("modules.dep: dependency cycle through {0}")]
    Cycle(String),
}

/// The module name of a path: `kernel/drivers/net/virtio_net.ko` -> `virtio_net`
/// (`-` and `_` are the same to the kernel; we normalise to `_`).
pub fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file
        .strip_suffix(".ko")
        .or_else(|| file.strip_suffix(".ko.xz"))
        .or_else(|| file.strip_suffix(".ko.zst"))
        .or_else(|| file.strip_suffix(".ko.gz"))
        .unwrap_or(file);
    stem.replace('-', "_")
}

/// Parsed `modules.dep`: path of every module and its direct dependencies (paths).
#[derive(Debug, Clone, Default)]
pub struct DepTable {
    by_name: BTreeMap<String, (String, Vec<String>)>,
}

impl DepTable {
    /// Parses the text of `modules.dep`.
    pub fn parse(text: &str) -> Result<Self, ModulesError> {
        let mut by_name = BTreeMap::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let Some((path, deps)) = line.split_once(':') else {
                return Err(ModulesError::BadLine {
                    line: index + 1,
                    text: line.into(),
                });
            };
            let path = path.trim();
            if path.is_empty() || path.contains(char::is_whitespace) {
                return Err(ModulesError::BadLine {
                    line: index + 1,
                    text: line.into(),
                });
            }
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            by_name.insert(module_name(path), (path.to_owned(), deps));
        }
        Ok(DepTable { by_name })
    }

    /// The path of a module by name, if the kernel has it as a module.
    pub fn path(&self, name: &str) -> Option<&str> {
        self.by_name
            .get(&name.replace('-', "_"))
            .map(|(p, _)| p.as_str())
    }

    /// The closure of `wanted` in load order. `builtin` is the text of `modules.builtin`.
    pub fn closure(&self, wanted: &[&str], builtin: &str) -> Result<ModuleSet, ModulesError> {
        let builtin_names: BTreeSet<String> = builtin
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(module_name)
            .collect();
        let mut set = ModuleSet {
            load_order: Vec::new(),
            builtin: Vec::new(),
            missing: Vec::new(),
        };
        let mut done = BTreeSet::new();
        let mut visiting = BTreeSet::new();
        for name in wanted {
            let name = name.replace('-', "_");
            if self.by_name.contains_key(&name) {
                self.visit(&name, &mut done, &mut visiting, &mut set.load_order)?;
            } else if builtin_names.contains(&name) {
                set.builtin.push(name);
            } else {
                set.missing.push(name);
            }
        }
        Ok(set)
    }

    /// Depth-first, dependencies before dependents, each module once.
    fn visit(
        &self,
        name: &str,
        done: &mut BTreeSet<String>,
        visiting: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), ModulesError> {
        if done.contains(name) {
            return Ok(());
        }
        if !visiting.insert(name.to_owned()) {
            return Err(ModulesError::Cycle(name.to_owned()));
        }
        let (path, deps) = &self.by_name[name];
        // modules.dep lists the full transitive closure; visiting each one's own deps first
        // still gives a correct order when a tool wrote only direct dependencies.
        for dep in deps {
            let dep_name = module_name(dep);
            if !self.by_name.contains_key(&dep_name) {
                return Err(ModulesError::MissingDependency {
                    module: path.clone(),
                    dependency: dep.clone(),
                });
            }
            self.visit(&dep_name, done, visiting, order)?;
        }
        visiting.remove(name);
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }

    /// The `modules.dep` lines for a subset of modules (the image's own `modules.dep`).
    pub fn render_subset(&self, paths: &[String]) -> String {
        let mut out = String::new();
        let mut sorted: Vec<&String> = paths.iter().collect();
        sorted.sort();
        for path in sorted {
            let name = module_name(path);
            let deps = self
                .by_name
                .get(&name)
                .map(|(_, d)| d.join(" "))
                .unwrap_or_default();
            if deps.is_empty() {
                out.push_str(&format!("{path}:\n"));
            } else {
                out.push_str(&format!("{path}: {deps}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/scsi/sr_mod.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/cdrom/cdrom.ko
kernel/drivers/scsi/scsi_mod.ko:
kernel/drivers/cdrom/cdrom.ko:
kernel/drivers/acpi/button.ko:
";

    #[test]
    fn closure_puts_dependencies_first_once() {
        let table = DepTable::parse(DEP).unwrap();
        let set = table
            .closure(
                &["virtio_net", "sr-mod", "cdrom", "ahci", "af_packet"],
                "kernel/net/packet/af_packet.ko\n",
            )
            .unwrap();
        assert_eq!(
            set.load_order,
            [
                "kernel/net/core/failover.ko",
                "kernel/drivers/net/net_failover.ko",
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/net/virtio_net.ko",
                "kernel/drivers/scsi/scsi_mod.ko",
                "kernel/drivers/cdrom/cdrom.ko",
                "kernel/drivers/scsi/sr_mod.ko",
            ]
        );
        assert_eq!(set.builtin, ["af_packet"]);
        assert_eq!(set.missing, ["ahci"]);
        // Every module appears after all of its dependencies.
        for (i, path) in set.load_order.iter().enumerate() {
            let (_, deps) = &table.by_name[&module_name(path)];
            for dep in deps {
                let at = set.load_order.iter().position(|p| p == dep).unwrap();
                assert!(at < i, "{dep} must load before {path}");
            }
        }
    }

    #[test]
    fn bad_input_names_the_line() {
        let err = DepTable::parse("kernel/a.ko: \nno colon here\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let table = DepTable::parse("kernel/a.ko: kernel/b.ko\n").unwrap();
        let err = table.closure(&["a"], "").unwrap_err().to_string();
        assert!(err.contains("kernel/b.ko"), "{err}");
        let cyclic = DepTable::parse("k/a.ko: k/b.ko\nk/b.ko: k/a.ko\n").unwrap();
        assert!(matches!(
            cyclic.closure(&["a"], ""),
            Err(ModulesError::Cycle(_))
        ));
    }

    #[test]
    fn subset_keeps_dependency_lines() {
        let table = DepTable::parse(DEP).unwrap();
        let text = table.render_subset(&[
            "kernel/drivers/virtio/virtio.ko".into(),
            "kernel/drivers/virtio/virtio_ring.ko".into(),
        ]);
        assert_eq!(
            text,
            "kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/virtio/virtio_ring.ko:\n"
        );
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn parse_never_panics(text in "\\PC*") {
            let _ = DepTable::parse(&text).map(|t| t.closure(&["a", "b"], &text));
        }
    }
}
