//! A TCP relay that can be cut: a client (a coordinator's etcd client) connects to the relay,
//! which opens its own connection upstream for each and copies bytes both ways.
//! [`TcpRelay::cut`] makes every connection silent in both directions from then on (bytes
//! read are dropped, connections stay open), as a partition between the client and the
//! server would: the client sees no error, only no answer. [`TcpRelay::restore`] forwards
//! again; a connection that lost bytes while cut is broken for its protocol, and closed by
//! it, so the client connects anew.
//!
//! Threads and blocking sockets with short read timeouts, as [`crate::relay::UdpRelay`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the relay's threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// A running relay; dropping it stops its threads and closes its connections.
pub struct TcpRelay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl std::fmt::Debug for TcpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpRelay")
            .field("addr", &self.addr)
            .finish()
    }
}

impl TcpRelay {
    /// Starts a relay on a loopback port forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (cut, stop, threads) = (cut.clone(), stop.clone(), threads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let client = match listener.accept() {
                        Ok((c, _)) => c,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = client.set_nonblocking(false);
                    let mut list = threads.lock().unwrap_or_else(|p| p.into_inner());
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                            continue;
                        };
                        list.push(copy(from, to, cut.clone(), stop.clone()));
                    }
                }
            })
        };
        threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(accept);
        Ok(Self {
            addr,
            cut,
            stop,
            threads,
        })
    }

    /// Where clients connect (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Silences every connection from now on, both ways.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes or the relay stops; drops what it reads while
/// the relay is cut.
fn copy(
    mut from: TcpStream,
    mut to: TcpStream,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(POLL));
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::SeqCst) {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    })
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_until_cut_and_pass_again_once_restored() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let up = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut buf = [0u8; 16];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let relay = TcpRelay::start(up).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 4];
        c.write_all(b"ping").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        relay.cut();
        c.write_all(b"lost").unwrap();
        assert!(
            c.read(&mut buf).is_err(),
            "an answer came through a cut relay"
        );
        relay.restore();
        c.write_all(b"back").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"back");
        drop(c);
        drop(relay);
        echo.join().unwrap();
    }
}
