//! A listener whose connections can all be cut at once, to simulate a whole API server
//! going down: while "down", new connections are accepted and dropped straight away, and
//! every open (keep-alive) connection is reset, so clients see transport errors, not HTTP
//! answers.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The switch shared by the listener and the test API.
#[derive(Debug, Default)]
pub(crate) struct Switch {
    down: Mutex<Option<()>>,
    epoch: Mutex<CancellationToken>,
}

impl Switch {
    pub(crate) fn set_down(&self, down: bool) {
        let mut d = self.down.lock().expect("switch poisoned");
        if down && d.is_none() {
            *d = Some(());
            let mut e = self.epoch.lock().expect("switch poisoned");
            e.cancel();
            *e = CancellationToken::new();
        } else if !down {
            *d = None;
        }
    }

    pub(crate) fn is_down(&self) -> bool {
        self.down.lock().expect("switch poisoned").is_some()
    }

    fn token(&self) -> CancellationToken {
        self.epoch.lock().expect("switch poisoned").clone()
    }
}

/// The listener handed to axum.
pub(crate) struct CutListener {
    pub(crate) inner: TcpListener,
    pub(crate) switch: Arc<Switch>,
}

/// A connection that fails once its epoch is cancelled.
pub(crate) struct CutStream {
    inner: TcpStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl CutStream {
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "fake API server is down",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for CutStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CutStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for CutListener {
    type Io = CutStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
            };
            if self.switch.is_down() {
                drop(stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let cut = Box::pin(self.switch.token().cancelled_owned());
            return (CutStream { inner: stream, cut }, addr);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
