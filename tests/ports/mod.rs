//! Loopback ports for tests that start real listeners.
//!
//! A port is found by binding 127.0.0.1:0 and letting it go, so two calls
//! can get the same port back from the kernel: a node whose raft and HTTP
//! listeners were given one port fails to start. Each port is handed out
//! at most once per test process.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// A port on 127.0.0.1 that was free a moment ago and that no earlier call
/// in this process returned.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("bind 127.0.0.1:0")
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// [`free_port`] as an address.
#[allow(dead_code)] // not every test binary wants an address
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}
