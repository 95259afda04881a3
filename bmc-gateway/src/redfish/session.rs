//! The HTTP side of [`RedfishPowerControl`]: the reqwest client (rustls configured in
//! [`crate::redfish_tls`]), one request sent with the current credentials (Basic auth or a
//! session token, logging in again once when a session expired), JSON reads, and the
//! SessionService login. It does not know what a ComputerSystem or a Task is (see the parent
//! module).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::{debug, info};

use super::{AuthMode, Cached, RedfishPowerControl, RedfishTarget, Trust, json_str, rustls_config};
use crate::power::BmcError;
use crate::redfish_tls::connect_hint;

/// Largest answer body read from a BMC.
///
/// 1 MiB: a ComputerSystem, a Task or a Systems collection is a few kB to tens of kB. A BMC
/// (or whatever answers on its port) sending more is sending something else, and reading it
/// whole grew the gateway by gigabytes within one request timeout.
pub(super) const MAX_BODY: usize = 1 << 20;

/// Longest part of a BMC's error text put in a message, in characters.
///
/// 200: enough for a Redfish message and its first extended message; an HTML error page
/// would otherwise fill a `check` table cell and every log line about it.
const MESSAGE_SHOWN: usize = 200;

/// `s` made safe for a terminal and a log line: newlines and tabs become spaces, other
/// control characters (an escape starting a terminal sequence) their Rust escape, and the
/// text is cut after `max` characters (never inside one).
pub(super) fn printable(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.trim().chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// Follows a redirect only within the BMC's own origin (scheme, host and port; some services
/// redirect `/redfish/v1` to `/redfish/v1/`), at most 5 times. Following one elsewhere sent
/// the session token there and took the power state from whoever answered: a fence could have
/// been confirmed by a host that is not the BMC.
fn same_origin_only(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let first = attempt.previous().first().map(|u| u.origin());
    if attempt.previous().len() <= 5 && first == Some(attempt.url().origin()) {
        attempt.follow()
    } else {
        attempt.stop()
    }
}

/// The URL for `path` on the BMC at `base`. A Task, a session or a reset target the BMC names
/// by a full URL is asked of the BMC itself, at that URL's path: sent as given, one naming
/// another host got our credentials and answered for the BMC (and a BMC naming itself by a
/// host name the gateway does not use still works).
fn own_url(base: &str, path: &str) -> String {
    match reqwest::Url::parse(path) {
        Ok(u) => {
            let q = u.query().map(|q| format!("?{q}")).unwrap_or_default();
            format!("{base}{}{q}", u.path())
        }
        Err(_) => format!("{base}{path}"),
    }
}

/// What a BMC's error answer says: the Redfish message (and its first extended message), or
/// the start of the body, shown with [`printable`].
pub(super) fn error_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body)
        && let Some(m) = json_str(&v, &["error", "message"])
    {
        let ext = v
            .get("error")
            .and_then(|e| e.get("@Message.ExtendedInfo"))
            .and_then(|x| x.as_array())
            .and_then(|a| a.first())
            .and_then(|i| i.get("Message"))
            .and_then(|m| m.as_str());
        let said = match ext {
            Some(x) if x != m => format!("{m} ({x})"),
            _ => m.to_string(),
        };
        return printable(&said, MESSAGE_SHOWN);
    }
    printable(body, MESSAGE_SHOWN)
}

impl RedfishPowerControl {
    /// Builds the client. Fails when the TLS configuration cannot be built.
    pub fn new(t: RedfishTarget) -> Result<Self, BmcError> {
        let cfg = rustls_config(&t.trust).map_err(|detail| BmcError::Protocol {
            bmc: t.name.clone(),
            what: "TLS configuration".into(),
            detail,
        })?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(cfg)
            .timeout(t.request_timeout)
            .connect_timeout(t.request_timeout)
            .redirect(reqwest::redirect::Policy::custom(same_origin_only))
            .build()
            .map_err(|e| BmcError::Protocol {
                bmc: t.name.clone(),
                what: "HTTP client".into(),
                detail: e.to_string(),
            })?;
        let scheme = match t.trust {
            Trust::PlainHttp => "http",
            _ => "https",
        };
        let base = format!("{scheme}://{}", t.authority);
        Ok(Self {
            t,
            base,
            client,
            cached: Mutex::new(Cached::default()),
        })
    }

    fn err_send(&self, what: &str, e: reqwest::Error) -> BmcError {
        if e.is_timeout() {
            BmcError::Timeout {
                bmc: self.t.name.clone(),
                what: what.to_string(),
                waited_ms: self.t.request_timeout.as_millis() as u64,
            }
        } else {
            let mut detail = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                detail.push_str(": ");
                detail.push_str(&s.to_string());
                src = s.source();
            }
            let https = !matches!(self.t.trust, Trust::PlainHttp);
            if let Some(h) = connect_hint(https, &detail) {
                detail.push_str(" (");
                detail.push_str(h);
                detail.push(')');
            }
            BmcError::Unreachable {
                bmc: self.t.name.clone(),
                detail: format!("{what}: {detail}"),
            }
        }
    }

    /// Reads an answer's body, at most [`MAX_BODY`] bytes of it (bytes that are not UTF-8
    /// are replaced: the body is only parsed as JSON or quoted in a message).
    async fn read_body(&self, what: &str, mut resp: reqwest::Response) -> Result<String, BmcError> {
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.err_send(what, e))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(BmcError::Protocol {
                    bmc: self.t.name.clone(),
                    what: what.to_string(),
                    detail: format!(
                        "the answer is longer than {} KiB, far more than any Redfish resource \
                         we read; is a Redfish service on this port?",
                        MAX_BODY / 1024
                    ),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Sends one request with the current credentials; returns status, headers' Location and
    /// X-Auth-Token, and body.
    pub(super) async fn send(
        &self,
        cached: &mut Cached,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Option<String>, String), BmcError> {
        let what = format!("{method} {path}");
        for attempt in 0..2 {
            let url = own_url(&self.base, path);
            let mut rb = self
                .client
                .request(method.clone(), &url)
                .header("Accept", "application/json");
            rb = match &cached.token {
                Some((tok, _)) => rb.header("X-Auth-Token", tok),
                None => rb.basic_auth(&self.t.username, Some(&self.t.password)),
            };
            if let Some(b) = body {
                rb = rb.json(b);
            }
            let resp = rb.send().await.map_err(|e| self.err_send(&what, e))?;
            let status = resp.status();
            let location = resp
                .headers()
                .get("Location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let text = self.read_body(&what, resp).await?;
            if status == StatusCode::UNAUTHORIZED && cached.token.is_some() && attempt == 0 {
                // The session expired: log in again once.
                info!(bmc = %self.t.name, "Redfish session expired; logging in again");
                cached.token = None;
                // Boxed: login itself sends requests through here.
                Box::pin(self.login(cached)).await?;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                return Err(BmcError::Auth {
                    bmc: self.t.name.clone(),
                    detail: format!("{what}: HTTP {status}: {}", error_message(&text)),
                });
            }
            return Ok((status, location, text));
        }
        Err(BmcError::Auth {
            bmc: self.t.name.clone(),
            detail: format!("{what}: still unauthorized after a new session login"),
        })
    }

    pub(super) async fn get_json(
        &self,
        cached: &mut Cached,
        path: &str,
    ) -> Result<Value, BmcError> {
        let (status, location, text) = self.send(cached, Method::GET, path, None).await?;
        if status.is_redirection() {
            return Err(BmcError::Refused {
                bmc: self.t.name.clone(),
                what: format!("GET {path}"),
                detail: format!(
                    "HTTP {status} to {}, not followed: the gateway reads only the BMC itself \
                     (same scheme, host and port)",
                    printable(location.as_deref().unwrap_or("nowhere"), MESSAGE_SHOWN)
                ),
            });
        }
        if !status.is_success() {
            return Err(BmcError::Refused {
                bmc: self.t.name.clone(),
                what: format!("GET {path}"),
                detail: format!("HTTP {status}: {}", error_message(&text)),
            });
        }
        serde_json::from_str(&text).map_err(|e| BmcError::Protocol {
            bmc: self.t.name.clone(),
            what: format!("GET {path}"),
            detail: format!("not JSON: {e}"),
        })
    }

    pub(super) async fn login(&self, cached: &mut Cached) -> Result<(), BmcError> {
        let root = self.get_json(cached, "/redfish/v1/").await?;
        let sessions = json_str(&root, &["Links", "Sessions", "@odata.id"]).map(str::to_string);
        match (sessions, self.t.auth) {
            (None, AuthMode::Session) => Err(BmcError::Unsupported {
                bmc: self.t.name.clone(),
                what: "SessionService login".into(),
                detail: "the service root links no Sessions; use auth = \"basic\"".into(),
            }),
            (None, _) | (_, AuthMode::Basic) => Ok(()),
            (Some(uri), _) => {
                let body = json!({"UserName": self.t.username, "Password": self.t.password});
                let resp = self
                    .client
                    .post(format!("{}{uri}", self.base))
                    .header("Accept", "application/json")
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| self.err_send("session login", e))?;
                let status = resp.status();
                let header = |name: &str| {
                    resp.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let (token, loc) = (header("X-Auth-Token"), header("Location"));
                let text = self.read_body("session login", resp).await?;
                if !status.is_success() {
                    return Err(BmcError::Auth {
                        bmc: self.t.name.clone(),
                        detail: format!("session login: HTTP {status}: {}", error_message(&text)),
                    });
                }
                let token = token.ok_or_else(|| BmcError::Protocol {
                    bmc: self.t.name.clone(),
                    what: "session login".into(),
                    detail: "no X-Auth-Token in the answer".into(),
                })?;
                debug!(bmc = %self.t.name, "Redfish session opened");
                cached.token = Some((token, loc));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::super::fake_service::{Fake, answering, client, serve};
    use super::*;
    use crate::power::{ChassisOp, PowerControl};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn wrong_password_is_an_auth_error() {
        let fake = Arc::new(Fake::default());
        let addr = serve(fake).await;
        let e = client(addr, "nope").power_state().await.unwrap_err();
        assert!(matches!(e, BmcError::Auth { .. }), "{e}");
        assert!(e.to_string().contains("bad credentials"), "{e}");
        assert!(!e.is_retriable());
        assert_eq!(
            crate::gateway::reach::<()>(&Err(e)),
            crate::metrics::Reach::CredentialsRefused,
            "an HTTP 401 is not reachable"
        );
    }

    #[tokio::test]
    async fn unreachable_service_is_retriable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = client(port, "pw").power_state().await.unwrap_err();
        assert!(e.is_unreachable() && e.is_retriable(), "{e}");
    }

    /// A Task monitor named by a full URL on another host was polled there, with the session
    /// token; it is asked of the BMC itself.
    #[tokio::test]
    async fn a_task_named_on_another_host_is_asked_of_the_bmc() {
        let fake = Arc::new(Fake::default());
        *fake.power.lock().unwrap() = "On".into();
        let task = "http://192.0.2.1:8000/redfish/v1/TaskService/Tasks/7";
        *fake.task_at.lock().unwrap() = Some(task.into());
        let c = client(serve(fake.clone()).await, "pw");
        let said = tokio::time::timeout(Duration::from_secs(10), c.chassis(ChassisOp::Off))
            .await
            .expect("the task on 192.0.2.1 was waited for")
            .unwrap();
        assert!(said.contains("completed"), "{said}");
        assert_eq!(
            *fake.calls.lock().unwrap(),
            ["login", "ForceOff", "task1", "task2"]
        );
        assert_eq!(
            own_url("https://10.0.0.1:443", "https://bmc.example/a/b?x=1"),
            "https://10.0.0.1:443/a/b?x=1"
        );
    }

    /// A redirect to another host got the session token and the power state from there.
    #[tokio::test]
    async fn redirects_off_the_bmc_are_not_followed() {
        let odd = br#"{"Members": [{"@odata.id": "/redfish/v1/Systems/1"}], "PowerState": "Off"}"#;
        let elsewhere = answering(StatusCode::OK, odd.to_vec()).await;
        let to = format!("http://{elsewhere}/redfish/v1/");
        let app = axum::Router::new()
            .fallback(move || async move { (StatusCode::FOUND, [("Location", to.clone())]) });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        let e = client(addr, "pw").power_state().await.unwrap_err();
        assert!(matches!(e, BmcError::Refused { .. }), "{e}");
        assert!(
            e.to_string().contains(&format!(
                "HTTP 302 Found to http://{elsewhere}/redfish/v1/, not followed"
            )),
            "{e}"
        );
    }

    /// A redirect within the BMC (`/Systems` to `/Systems/`) is still followed.
    #[tokio::test]
    async fn a_redirect_within_the_bmc_is_followed() {
        use axum::routing::get;
        let app = axum::Router::new()
            .route("/redfish/v1/", get(|| async { "{}" }))
            .route(
                "/redfish/v1/Systems",
                get(|| async { (StatusCode::FOUND, [("Location", "/redfish/v1/Systems/")]) }),
            )
            .route(
                "/redfish/v1/Systems/",
                get(|| async { r#"{"Members": [{"@odata.id": "/s"}]}"# }),
            )
            .route("/s", get(|| async { r#"{"PowerState": "On"}"# }));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        let s = client(addr, "pw").power_state().await;
        assert_eq!(s, Ok(crate::power::PowerState::On));
    }

    /// An error page in a multi-byte script panicked the gateway (the message was cut inside
    /// a character: in `check` the BMC's row vanished) and its escape sequences reached the
    /// terminal raw; an endless body was read whole, gigabytes within one request timeout.
    #[tokio::test]
    async fn error_pages_are_cut_safely_and_escaped_and_endless_bodies_refused() {
        let page = format!("\u{1b}]0;owned\u{7}\n{}", "エラー".repeat(100));
        let addr = answering(StatusCode::INTERNAL_SERVER_ERROR, page.into_bytes()).await;
        let e = client(addr, "pw")
            .power_state()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r"HTTP 500 Internal Server Error: \u{1b}]0;owned\u{7} エラー"),
            "{e}"
        );
        assert!(e.ends_with('…') && !e.contains(char::is_control), "{e}");

        let addr = answering(StatusCode::OK, vec![b' '; MAX_BODY + 1]).await;
        let e = client(addr, "pw").power_state().await.unwrap_err();
        assert!(matches!(e, BmcError::Protocol { .. }), "{e}");
        assert!(e.to_string().contains("longer than 1024 KiB"), "{e}");

        // One body for the service root, the Systems collection and the system itself.
        let odd = br#"{"Members": [{"@odata.id": "/redfish/v1/Systems/1"}], "PowerState": 42}"#;
        let addr = answering(StatusCode::OK, odd.to_vec()).await;
        let e = client(addr, "pw").power_state().await.unwrap_err();
        assert!(
            e.to_string().contains("PowerState is 42, not a string"),
            "{e}"
        );
    }
}
