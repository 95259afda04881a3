//! A UDP relay that can be cut: agents talk QUIC to the relay, the relay forwards each
//! datagram to the coordinator from a socket of its own per client, and answers come back
//! the same way. [`UdpRelay::cut`] drops every datagram in both directions, as a switch
//! that fails or a partition between the coordinator and its agents would; QUIC on either
//! side sees silence, not an error. [`UdpRelay::restore`] lets traffic through again.
//!
//! Threads and blocking sockets with short read timeouts; no async runtime, so synchronous
//! tests that drive real processes can use it. It deliberately models nothing else (no
//! latency, no reordering).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the relay's threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// A running relay; dropping it stops its threads.
pub struct UdpRelay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl std::fmt::Debug for UdpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpRelay")
            .field("addr", &self.addr)
            .finish()
    }
}

impl UdpRelay {
    /// Starts a relay on a loopback port forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let front = UdpSocket::bind("127.0.0.1:0")?;
        front.set_read_timeout(Some(POLL))?;
        let addr = front.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = Arc::new(Mutex::new(Vec::new()));
        let front = Arc::new(front);
        let t = {
            let (cut, stop, threads) = (cut.clone(), stop.clone(), threads.clone());
            std::thread::spawn(move || {
                let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::SeqCst) {
                    let Ok((n, client)) = front.recv_from(&mut buf) else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    let back = match backs.get(&client) {
                        Some(b) => b.clone(),
                        None => {
                            let Ok(b) = UdpSocket::bind("127.0.0.1:0") else {
                                continue;
                            };
                            let _ = b.set_read_timeout(Some(POLL));
                            let b = Arc::new(b);
                            backs.insert(client, b.clone());
                            let h = answers(
                                b.clone(),
                                front.clone(),
                                client,
                                cut.clone(),
                                stop.clone(),
                            );
                            threads.lock().expect("relay threads").push(h);
                            b
                        }
                    };
                    let _ = back.send_to(&buf[..n], upstream);
                }
            })
        };
        threads.lock().expect("relay threads").push(t);
        Ok(Self {
            addr,
            cut,
            stop,
            threads,
        })
    }

    /// Where clients send (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every datagram from now on, both ways.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Lets datagrams through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Forwards the upstream's answers to one client.
fn answers(
    back: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    client: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while !stop.load(Ordering::SeqCst) {
            let Ok((n, _)) = back.recv_from(&mut buf) else {
                continue;
            };
            if !cut.load(Ordering::SeqCst) {
                let _ = front.send_to(&buf[..n], client);
            }
        }
    })
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *self.threads.lock().expect("relay threads"));
        for t in threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_both_ways_until_cut_and_again_after_restore() -> std::io::Result<()> {
        let server = UdpSocket::bind("127.0.0.1:0")?;
        server.set_read_timeout(Some(Duration::from_millis(300)))?;
        let relay = UdpRelay::start(server.local_addr()?)?;
        let client = UdpSocket::bind("127.0.0.1:0")?;
        client.set_read_timeout(Some(Duration::from_millis(300)))?;
        let mut buf = [0u8; 16];
        let round_trip = |msg: &[u8], buf: &mut [u8]| -> std::io::Result<bool> {
            client.send_to(msg, relay.addr())?;
            let Ok((n, from)) = server.recv_from(buf) else {
                return Ok(false);
            };
            server.send_to(&buf[..n], from)?;
            Ok(client.recv_from(buf).is_ok())
        };
        assert!(round_trip(b"one", &mut buf)?);
        relay.cut();
        assert!(!round_trip(b"two", &mut buf)?);
        relay.restore();
        assert!(round_trip(b"three", &mut buf)?);
        Ok(())
    }
}
