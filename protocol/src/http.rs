//! Plain-HTTP serving of an axum router for the `/metrics` and `/healthz` listeners.
//!
//! `axum::serve` gives hyper no timer, so a client that connects and never finishes its request
//! header holds a connection (and a task) for as long as it likes. [`serve_router`] drives each
//! connection through hyper's HTTP/1 builder with a timer and a header-read timeout instead: a
//! connection whose request header is not complete within the timeout is closed.

use std::future::Future;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// How long a client may take to send a complete request header before its connection is closed.
///
/// A scraper or a health probe on the same network sends its header in one packet; five seconds
/// leaves room for a slow link while a silent connection is dropped well before it matters.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed `accept` (for example EMFILE), so that a persistent error does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `router` over HTTP/1 on `listener` until `shutdown` completes.
///
/// Every connection must deliver a complete request header within `header_read_timeout`, or it is
/// closed. On shutdown the listener stops accepting and open connections are closed.
pub async fn serve_router(
    listener: TcpListener,
    router: axum::Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "HTTP accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                };
                let service = TowerToHyperService::new(router.clone());
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_read_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                connections.spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%peer, %error, "HTTP connection closed with an error");
                    }
                });
            }
        }
    }
    connections.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(timeout: Duration) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/healthz", get(|| async { "ok\n" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_router(listener, router, timeout, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Reads until the peer closes; returns what was read, or None if it stayed open past `limit`.
    async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<String> {
        let mut out = Vec::new();
        tokio::time::timeout(limit, stream.read_to_end(&mut out))
            .await
            .ok()
            .map(|_| String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test]
    async fn silent_and_partial_clients_are_dropped_while_a_get_is_served() {
        let (addr, _stop) = start(Duration::from_secs(1)).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();

        let mut normal = TcpStream::connect(addr).await.unwrap();
        normal
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(&mut normal, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok\n"), "{answer}");

        let started = std::time::Instant::now();
        assert!(
            read_until_closed(&mut silent, Duration::from_secs(10))
                .await
                .is_some()
        );
        assert!(
            read_until_closed(&mut partial, Duration::from_secs(10))
                .await
                .is_some()
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_client_within_the_timeout_is_not_dropped() {
        let (addr, _stop) = start(Duration::from_secs(3)).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        // Silent for a while but well inside the timeout: the connection must stay open.
        assert!(
            read_until_closed(&mut slow, Duration::from_millis(500))
                .await
                .is_none()
        );
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(&mut slow, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
