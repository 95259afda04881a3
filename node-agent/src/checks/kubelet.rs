//! kubelet check: `GET` of kubelet's healthz URL with a short timeout; `ok` iff the answer
//! is `200` with body `ok`.
//!
//! The HTTP/1.1 client here is deliberately minimal (plain `http://` only, `Content-Length`,
//! chunked or read-to-close bodies, a hard size cap): the agent runs on every server and
//! must stay small, so it does not pull in hyper or reqwest. It is not a general HTTP client
//! and does not follow redirects.
//!
//! One keep-alive connection is kept open across cycles (kubelet's Go server keeps HTTP/1.1
//! connections open): a TCP connect and close per cycle was the largest share of the agent's
//! CPU per report. A probe that fails on a reused connection for any reason but a timeout
//! (closed, reset, garbage: what a kubelet restart leaves behind) is retried once on a fresh
//! connection before it counts, so a restarted kubelet is not reported unhealthy for a stale
//! socket. A timeout is not retried: a kubelet that accepts but does not answer is the hang
//! this check exists to see, and retrying would double the time the check may take. A
//! server that answers `Connection: close`, HTTP/1.0 without keep-alive, or a body read to
//! the close gets a fresh connection every cycle, as before.

use std::time::Duration;

use protocol::messages::{CheckKind, CheckResult, CheckStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::base::result;

/// Subject of the kubelet result.
pub const SUBJECT: &str = "kubelet";

/// Largest response read: healthz answers are a few bytes, a verbose one a few hundred;
/// anything bigger is not a healthz answer and is cut off instead of buffered.
const MAX_RESPONSE: usize = 16 * 1024;

/// A parsed `http://host[:port]/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port (default 80).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl HttpUrl {
    /// Parses a plain-http URL; anything else is an error saying why.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only plain http:// URLs are supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("{url:?}: missing or unsupported host"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{url:?}: unterminated IPv6 address"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(format!("{url:?}: garbage after IPv6 address")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{url:?}: missing host"));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse()
                .map_err(|_| format!("{url:?}: {p:?} is not a port number"))?,
        };
        Ok(Self {
            host,
            port,
            path: path.to_string(),
        })
    }

    /// `Host` header value.
    fn host_header(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Body bytes (decoded from chunked if needed).
    pub body: Vec<u8>,
    /// Whether the connection may carry the next request: HTTP/1.1 without
    /// `Connection: close` (or HTTP/1.0 with `Connection: keep-alive`), a body of known
    /// length, and nothing read past the response.
    pub keep_alive: bool,
}

/// Finds `\r\n\r\n`.
fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// A decoded chunked body and what follows its last chunk's size line.
type Dechunked<'a> = (Vec<u8>, &'a [u8]);

/// Decodes a chunked body; `Ok(None)` when more bytes are needed. With the body, the bytes
/// after the last chunk's size line (the trailers and the final `\r\n`).
fn dechunk(mut b: &[u8]) -> Result<Option<Dechunked<'_>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&b[..eol]).map_err(|_| "bad chunk size line")?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size {size_hex:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            // Trailers are ignored; the last chunk is enough to know the body.
            return Ok(Some((out, b)));
        }
        if b.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Parses what has been read so far. `Ok(None)`: incomplete, read more (at `eof`, a body
/// without length is complete). Pure.
pub fn parse_response(buf: &[u8], eof: bool) -> Result<Option<HttpResponse>, String> {
    let Some(end) = header_end(buf) else {
        return if eof {
            Err("connection closed before the response headers ended".into())
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "response headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x response: {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    // HTTP/1.1 connections persist unless closed; HTTP/1.0 ones only when asked to.
    let mut persistent = version == "HTTP/1.1";
    for l in lines {
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    persistent = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && version != "HTTP/1.1" {
                    persistent = true;
                }
            }
        }
    }
    let body = &buf[end + 4..];
    if chunked {
        return match dechunk(body)? {
            // Trailers are not parsed: only a response that ends right after the last
            // chunk leaves the connection at a known place.
            Some((b, rest)) => Ok(Some(HttpResponse {
                status,
                body: b,
                keep_alive: persistent && rest == b"\r\n",
            })),
            None if eof => Err("connection closed inside a chunked body".into()),
            None => Ok(None),
        };
    }
    match content_length {
        Some(n) if body.len() >= n => Ok(Some(HttpResponse {
            status,
            body: body[..n].to_vec(),
            keep_alive: persistent && body.len() == n,
        })),
        Some(n) if eof => Err(format!(
            "connection closed after {} of {n} body bytes",
            body.len()
        )),
        Some(_) => Ok(None),
        None if eof => Ok(Some(HttpResponse {
            status,
            body: body.to_vec(),
            keep_alive: false,
        })),
        None => Ok(None),
    }
}

/// Why one exchange failed: a timeout is told apart because it is not retried.
#[derive(Debug)]
enum ExchangeError {
    /// No complete answer within the timeout.
    Timeout,
    /// Anything else (connect, write, read, parse), said for a person.
    Other(String),
}

/// Writes `request` on `s` and reads one response into `buf` (cleared first).
async fn exchange(
    s: &mut TcpStream,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Result<HttpResponse, String> {
    s.write_all(request)
        .await
        .map_err(|e| format!("cannot send request: {e}"))?;
    buf.clear();
    let mut chunk = [0u8; 1024];
    loop {
        let n = s
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading response: {e}"))?;
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
        }
        if let Some(r) = parse_response(buf, n == 0)? {
            return Ok(r);
        }
    }
}

/// The kubelet check's client: one healthz URL, and the connection kept between cycles.
#[derive(Debug)]
pub struct KubeletClient {
    url: HttpUrl,
    timeout: Duration,
    /// The request, built once.
    request: Vec<u8>,
    /// The kept-alive connection, if the last answer allowed one.
    conn: Option<TcpStream>,
    /// Response buffer, reused across cycles.
    buf: Vec<u8>,
    /// TCP connections opened so far (tests and debugging).
    connects: u64,
}

impl KubeletClient {
    /// A client for `url` with `timeout` per request.
    pub fn new(url: HttpUrl, timeout: Duration) -> Self {
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fleetmend-node-agent/{}\r\nAccept: */*\r\n\r\n",
            url.path,
            url.host_header(),
            env!("CARGO_PKG_VERSION")
        )
        .into_bytes();
        Self {
            url,
            timeout,
            request,
            conn: None,
            buf: Vec::with_capacity(512),
            connects: 0,
        }
    }

    /// TCP connections opened so far.
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// One exchange on `conn`, or on a fresh connection when `None`, under the timeout;
    /// keeps the connection when the answer allows it.
    async fn attempt(&mut self, conn: Option<TcpStream>) -> Result<HttpResponse, ExchangeError> {
        let (host, port) = (self.url.host.as_str(), self.url.port);
        let (request, buf) = (&self.request, &mut self.buf);
        let connects = &mut self.connects;
        let work = async {
            let mut s = match conn {
                Some(s) => s,
                None => {
                    *connects += 1;
                    TcpStream::connect((host, port))
                        .await
                        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?
                }
            };
            let r = exchange(&mut s, request, buf).await?;
            Ok::<_, String>((r, s))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => Err(ExchangeError::Timeout),
            Ok(Err(e)) => Err(ExchangeError::Other(e)),
            Ok(Ok((r, s))) => {
                if r.keep_alive {
                    self.conn = Some(s);
                }
                Ok(r)
            }
        }
    }

    /// Performs one `GET` (see the module docs for connection reuse and the one retry).
    pub async fn get(&mut self) -> Result<HttpResponse, String> {
        let reused = self.conn.take();
        let r = match reused {
            Some(s) => match self.attempt(Some(s)).await {
                Err(ExchangeError::Other(e)) => {
                    tracing::debug!(error = %e, "kubelet: kept-alive connection failed, retrying on a fresh one");
                    self.attempt(None).await
                }
                r => r,
            },
            None => self.attempt(None).await,
        };
        r.map_err(|e| match e {
            ExchangeError::Timeout => format!("no answer within {:?}", self.timeout),
            ExchangeError::Other(e) => e,
        })
    }

    /// Runs the check.
    pub async fn check(&mut self) -> CheckResult {
        let r = self.get().await;
        evaluate(&self.url, &r)
    }
}

/// Judges a response. Pure.
pub fn evaluate(url: &HttpUrl, r: &Result<HttpResponse, String>) -> CheckResult {
    let st = |s, d: String| result(CheckKind::Kubelet, SUBJECT, s, d);
    match r {
        Err(e) => st(CheckStatus::Fail, format!("GET {}: {e}", url.path)),
        Ok(resp) => {
            let body = String::from_utf8_lossy(&resp.body);
            let body = body.trim();
            if resp.status == 200 && body == "ok" {
                st(CheckStatus::Ok, "healthz ok".into())
            } else {
                let mut shown: String = body.chars().take(200).collect();
                shown = shown.replace('\n', " | ");
                st(
                    CheckStatus::Fail,
                    format!("healthz answered {}: {shown}", resp.status),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit_fixture::FakeKubelet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    #[test]
    fn url_parsing() {
        let u = HttpUrl::parse("http://127.0.0.1:10248/healthz").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 10248, "/healthz")
        );
        let u = HttpUrl::parse("http://[::1]:8080/healthz?verbose").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 8080));
        assert_eq!(u.host_header(), "[::1]:8080");
        let u = HttpUrl::parse("http://kubelet.local").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        assert!(HttpUrl::parse("https://127.0.0.1/healthz").is_err());
        assert!(HttpUrl::parse("http://:80/").is_err());
        assert!(HttpUrl::parse("http://h:xx/").is_err());
    }

    #[test]
    fn response_parsing() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        for cut in 0..full.len() {
            assert_eq!(
                parse_response(&full[..cut], false).unwrap(),
                None,
                "cut {cut}"
            );
        }
        let r = parse_response(full, false).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\no\r\n1;x=y\r\nk\r\n0\r\n\r\n";
        let r = parse_response(chunked, false).unwrap().unwrap();
        assert_eq!(r.body, b"ok");
        let close = b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy";
        assert_eq!(parse_response(close, false).unwrap(), None);
        let r = parse_response(close, true).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (503, &b"busy"[..]));
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok", true).is_err());
        assert!(parse_response(b"HTTP/1.1 200", true).is_err());
    }

    #[test]
    fn keep_alive_only_when_the_connection_is_left_at_a_known_place() {
        let keep = |raw: &[u8], eof| parse_response(raw, eof).unwrap().unwrap().keep_alive;
        assert!(keep(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            false
        ));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            false
        ));
        assert!(!keep(
            b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
            false
        ));
        assert!(keep(
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok",
            false
        ));
        // Bytes past the response: the connection is out of step.
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP",
            false
        ));
        // A body read to the close.
        assert!(!keep(b"HTTP/1.1 200 OK\r\n\r\nok", true));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n";
        assert!(!keep(chunked, false), "final CRLF not read yet");
        assert!(keep(&[&chunked[..], b"\r\n"].concat(), false));
        assert!(!keep(&[&chunked[..], b"X-T: 1\r\n\r\n"].concat(), false));
    }

    /// What the scripted server does with one request on one connection.
    #[derive(Clone, Copy)]
    enum Step {
        /// Answer `200 ok`, keeping the connection.
        Ok,
        /// Close the connection without answering.
        Close,
        /// Read the request and never answer.
        Hold,
    }

    /// A kubelet stand-in that keeps connections alive and follows `script(conn, request)`
    /// (both counted from 0); returns its URL and the count of accepted connections.
    async fn scripted_kubelet(
        script: fn(usize, usize) -> Step,
    ) -> (HttpUrl, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = HttpUrl::parse(&format!("http://{}/healthz", l.local_addr().unwrap())).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let conn = a.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    for req in 0.. {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        match script(conn, req) {
                            Step::Ok => s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                                .await
                                .unwrap(),
                            Step::Close => return,
                            Step::Hold => {
                                tokio::time::sleep(Duration::from_secs(30)).await;
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, accepted, task)
    }

    #[tokio::test]
    async fn one_connection_serves_every_cycle() {
        let (url, accepted, task) = scripted_kubelet(|_, _| Step::Ok).await;
        let mut c = KubeletClient::new(url, Duration::from_secs(5));
        for _ in 0..5 {
            let r = c.check().await;
            assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        }
        assert_eq!((c.connects(), accepted.load(Ordering::SeqCst)), (1, 1));
        task.abort();
    }

    #[tokio::test]
    async fn a_stale_connection_is_retried_once_on_a_fresh_one() {
        // The first connection answers once, then the "restarted" kubelet has dropped it.
        let (url, accepted, task) = scripted_kubelet(|conn, req| {
            if conn == 0 && req > 0 {
                Step::Close
            } else {
                Step::Ok
            }
        })
        .await;
        let mut c = KubeletClient::new(url, Duration::from_secs(5));
        assert_eq!(c.check().await.status, CheckStatus::Ok);
        let r = c.check().await;
        assert_eq!(
            r.status,
            CheckStatus::Ok,
            "a stale socket is not a failure: {r:?}"
        );
        assert_eq!((c.connects(), accepted.load(Ordering::SeqCst)), (2, 2));
        // And the fresh connection is kept.
        assert_eq!(c.check().await.status, CheckStatus::Ok);
        assert_eq!(c.connects(), 2);
        task.abort();
    }

    #[tokio::test]
    async fn a_failure_on_the_fresh_connection_counts() {
        // Every connection after the first is closed unanswered: the retry fails too.
        let (url, _, task) = scripted_kubelet(|conn, req| {
            if conn == 0 && req == 0 {
                Step::Ok
            } else {
                Step::Close
            }
        })
        .await;
        let mut c = KubeletClient::new(url, Duration::from_secs(5));
        assert_eq!(c.check().await.status, CheckStatus::Ok);
        let r = c.check().await;
        assert_eq!(r.status, CheckStatus::Fail, "{r:?}");
        assert!(r.detail.contains("closed before the response"), "{r:?}");
        assert_eq!(c.connects(), 2, "exactly one retry");
        task.abort();
    }

    #[tokio::test]
    async fn a_hang_on_a_kept_connection_is_not_retried() {
        let (url, _, task) =
            scripted_kubelet(|_, req| if req == 0 { Step::Ok } else { Step::Hold }).await;
        let mut c = KubeletClient::new(url, Duration::from_millis(300));
        assert_eq!(c.check().await.status, CheckStatus::Ok);
        let r = c.check().await;
        assert_eq!(r.status, CheckStatus::Fail, "{r:?}");
        assert!(r.detail.contains("no answer within"), "{r:?}");
        assert_eq!(c.connects(), 1);
        // The hung connection is dropped: the next cycle connects afresh.
        let _ = c.check().await;
        assert_eq!(c.connects(), 2);
        task.abort();
    }

    #[tokio::test]
    async fn healthy_and_unhealthy_fake_kubelet() {
        let k = FakeKubelet::start().unwrap();
        let mut c = KubeletClient::new(HttpUrl::parse(&k.url()).unwrap(), Duration::from_secs(2));
        let r = tokio::time::timeout(Duration::from_secs(10), c.check())
            .await
            .unwrap();
        assert_eq!(r.status, CheckStatus::Ok, "{r:?}");
        k.set_healthy(false);
        let r = tokio::time::timeout(Duration::from_secs(10), c.check())
            .await
            .unwrap();
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("500"), "{r:?}");
    }

    #[tokio::test]
    async fn nothing_listening_fails() {
        // Bind and drop to get a port that is very likely closed.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/healthz")).unwrap();
        let r = KubeletClient::new(url, Duration::from_secs(2))
            .check()
            .await;
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("cannot connect"), "{r:?}");
    }

    #[tokio::test]
    async fn silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = HttpUrl::parse(&format!("http://{}/healthz", l.local_addr().unwrap())).unwrap();
        // Accept and hold the connection without answering.
        let hold = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(s);
        });
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            KubeletClient::new(url, Duration::from_millis(200)).check(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.detail.contains("no answer within"), "{r:?}");
        hold.abort();
    }

    #[tokio::test]
    async fn ok_body_must_be_ok() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = HttpUrl::parse(&format!("http://{}/healthz", l.local_addr().unwrap())).unwrap();
        let srv = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nnot ok!")
                .await
                .unwrap();
        });
        let r = KubeletClient::new(url, Duration::from_secs(2))
            .check()
            .await;
        assert_eq!(r.status, CheckStatus::Fail, "{r:?}");
        srv.await.unwrap();
    }
}
