//! A TCP proxy for one directed link between two nodes: node `from` dials
//! node `to` through it (its `quorum.voters` entry for `to` is the proxy's
//! address). The harness can cut the link: while cut, the proxy moves no
//! byte in either direction on the connections `from` opened, and takes no
//! new one into service, as a network that silently drops packets would;
//! TCP holds what was sent, and the nodes' own timeouts give up on it. A
//! healed link moves what is left, late. What `to` sends to `from` on its
//! own connections goes through the opposite link's proxy, so cutting one
//! link is a one-way fault.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a pump waits for bytes before it looks at the link's state.
const POLL: Duration = Duration::from_millis(20);

struct Shared {
    cut: AtomicBool,
    stopped: AtomicBool,
}

pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        let acceptor = std::thread::spawn(move || accept(listener, target, accepting));
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_cut(&self, cut: bool) {
        self.shared.cut.store(cut, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept(listener: TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    let mut pumps = Vec::new();
    while !shared.stopped.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let shared = shared.clone();
                pumps.push(std::thread::spawn(move || connect(client, target, shared)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
        pumps.retain(|pump: &JoinHandle<()>| !pump.is_finished());
    }
    for pump in pumps {
        let _ = pump.join();
    }
}

/// Serves one connection of `from`: waits while the link is cut, dials
/// `to`, then moves bytes both ways until either side closes.
fn connect(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    while shared.cut.load(Ordering::SeqCst) {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(POLL);
    }
    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
        return; // the node is down: `from` sees its connection closed
    };
    let _ = client.set_nonblocking(false);
    let (Ok(client_back), Ok(server_back)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let back_shared = shared.clone();
    let back = std::thread::spawn(move || pump(server_back, client_back, back_shared));
    pump(client, server, shared);
    let _ = back.join();
}

/// Copies `from` to `to` while the link is not cut, until either side
/// closes or the proxy stops; then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    let _ = from.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        if shared.cut.load(Ordering::SeqCst) {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
