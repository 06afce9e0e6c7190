//! Builds the appliance image alone: `cargo run -p keelson-image --example mkimage -- OUT AGENT`.

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(out), Some(agent)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: mkimage OUT AGENT");
    };
    let manifest = keelson_image::build(&keelson_image::ImageOptions::new(out, agent))?;
    println!(
        "{} {} bytes sha256 {}",
        manifest.file, manifest.qcow2_bytes, manifest.qcow2_sha256
    );
    Ok(())
}
