//! Boots a whole keelson cluster under QEMU and checks it from outside.

fn main() {
    println!("qemu-cluster: not yet");
}
