//! `qemu-cluster`: boots a whole keelson cluster under QEMU and checks it from outside.

use anyhow::Result;
use keelson_qemu_tests::segment::{Segment, TapBridge};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        // Debug aid: bridge a segment into an existing namespace until killed.
        Some("bridge") => {
            let group: std::net::Ipv4Addr = args.next().unwrap_or_default().parse()?;
            let port: u16 = args.next().unwrap_or_default().parse()?;
            let netns = args.next().unwrap_or_default();
            let _bridge = TapBridge::start(Segment { group, port }, &netns, "kqtap0")?;
            eprintln!("bridging {group}:{port} into {netns}/kqtap0");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        _ => {
            println!("qemu-cluster: not yet (issue 9)");
            Ok(())
        }
    }
}
