//! keelson-image: the appliance image (initramfs, kernel module closure, bootable disk, qcow2).

use std::path::PathBuf;

/// What to build the image from.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// Directory the image files are written to (`keelson.qcow2`, `image-manifest.json`).
    pub out: PathBuf,
    /// The static agent binary, which becomes `/init`.
    pub agent: PathBuf,
    /// The kernel (`vmlinuz`); default: the one `make setup` unpacked into `.cache/kernel`.
    pub kernel: Option<PathBuf>,
    /// The kernel's modules directory (`lib/modules/<version>`); default as for `kernel`.
    pub modules: Option<PathBuf>,
    /// Timestamp written into every entry (`SOURCE_DATE_EPOCH`).
    pub source_date_epoch: u64,
}

/// Errors building the image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Not implemented yet.
    #[error("the image builder is not implemented yet")]
    Unimplemented,
}

/// What was built.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageManifest {
    /// Path of the qcow2 image.
    pub qcow2: PathBuf,
    /// Its sha256, hex.
    pub qcow2_sha256: String,
}

/// Builds `keelson.qcow2` and its manifest into `opts.out`.
pub fn build(_opts: &ImageOptions) -> Result<ImageManifest, ImageError> {
    Err(ImageError::Unimplemented)
}
