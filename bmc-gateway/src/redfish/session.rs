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
        return match ext {
            Some(x) if x != m => format!("{m} ({x})"),
            _ => m.to_string(),
        };
    }
    let mut b = body.trim().to_string();
    b.truncate(200);
    b
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
            let url = if path.starts_with("http") {
                path.to_string()
            } else {
                format!("{}{path}", self.base)
            };
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
            let text = resp.text().await.map_err(|e| self.err_send(&what, e))?;
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
        let (status, _, text) = self.send(cached, Method::GET, path, None).await?;
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
                let text = resp
                    .text()
                    .await
                    .map_err(|e| self.err_send("session login", e))?;
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
    use super::super::fake_service::{Fake, client, serve};
    use super::*;
    use crate::power::PowerControl;
    use std::sync::Arc;

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
}
