//! Ports on the host's loopback. Prefer binding port 0 and reading the address back; this
//! is for a program that must be told a port before it starts.

use std::net::{TcpListener, UdpSocket};

/// A port free on 127.0.0.1 for both UDP and TCP right now (a DNS server binds both).
pub fn free_port() -> u16 {
    loop {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("binding a UDP port on loopback");
        let port = udp.local_addr().unwrap().port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
