//! `keelson`: builds a cluster's payloads from an install-config.yaml.

fn main() {
    eprintln!("keelson: not implemented yet");
    std::process::exit(2);
}
