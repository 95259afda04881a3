//! Building the Kubernetes client and mapping its errors.
//!
//! Written against Kubernetes 1.33 (k8s-openapi feature `v1_33`); it works with any API
//! server that serves `policy/v1` Eviction (1.22+), and detects servers older than 1.28
//! (no out-of-service taint support) at run time. Configuration comes from, in order: the
//! `kubernetes.kubeconfig` path in the coordinator configuration, `KUBECONFIG` or
//! `~/.kube/config`, the in-cluster service account.
//!
//! kube's default retry layer (`Config::default_retry`) silently retries 429 up to 15 times
//! with backoff up to 1000 s, which would make a PDB-blocked eviction never return. It is
//! turned off here: the drain owns its retry policy (`evict_retries` × `evict_interval`, and the
//! repair engine's backoff). This module deliberately does not hold any Kubernetes logic.

use std::time::Duration;

use super::KubeError;
pub use super::config::{KubernetesConfig, ReleaseMethod};

/// Builds the client from `cfg`, with kube's silent retries turned off, and its writes
/// behind `gate` when given ([`super::gate`]).
pub async fn build_client(
    cfg: &KubernetesConfig,
    gate: Option<&super::gate::WriteGate>,
) -> Result<kube::Client, KubeError> {
    let config = load_config(cfg).await?;
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeError::Config(format!("cannot build Kubernetes client: {e}")))?;
    Ok(match gate {
        Some(g) => builder.with_layer(g).build(),
        None => builder.build(),
    })
}

/// The client configuration `cfg` names (kubeconfig, context or in-cluster account), with
/// kube's silent retries turned off and `request_timeout` applied.
pub async fn load_config(cfg: &KubernetesConfig) -> Result<kube::Config, KubeError> {
    let options = kube::config::KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let mut config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                KubeError::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| {
                    KubeError::Config(format!("kubeconfig {} is unusable: {e}", path.display()))
                })?
        }
        None if cfg.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| KubeError::Config(format!("kubeconfig is unusable: {e}")))?,
        None => kube::Config::infer().await.map_err(|e| {
            KubeError::Config(format!(
                "no Kubernetes configuration found (kubernetes.kubeconfig, KUBECONFIG, \
                 ~/.kube/config or in-cluster service account): {e}"
            ))
        })?,
    };
    // Our retry policy, not kube's: see the module documentation.
    config.default_retry = false;
    let timeout = cfg.request_timeout.max(Duration::from_secs(1));
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(config)
}

/// `err` followed by each of its sources that says something new, joined by `: `. kube's
/// transport errors say only "client error (Connect)" themselves; the cause (connection
/// refused, an unknown certificate issuer, a timeout) is in their sources.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let part = e.to_string();
        if !part.is_empty() && !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        next = e.source();
    }
    s
}

/// HTTP status and message of an API error, if the error is an API answer.
pub fn api_status(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(s) => Some((s.code, s.message.clone())),
        _ => None,
    }
}

/// Maps a kube error to a [`KubeError`], with `what` saying what was attempted.
///
/// Transport failures, timeouts, 429 (API priority and fairness) and 5xx are
/// [`KubeError::Unavailable`]: the repair entry holds and resumes. Other API answers are
/// [`KubeError::Refused`].
pub fn map_err(what: &str, err: kube::Error) -> KubeError {
    match &err {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            KubeError::Unavailable(format!("{what}: {} {}", s.code, s.message))
        }
        kube::Error::Api(s) => KubeError::Refused(format!("{what}: {} {}", s.code, s.message)),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            KubeError::Unavailable(format!("{what}: {}", error_chain(&err)))
        }
        // A body that does not parse usually means a proxy or a half-up API server answered.
        kube::Error::SerdeError(_) => KubeError::Unavailable(format!("{what}: {err}")),
        _ => KubeError::Refused(format!("{what}: {err}")),
    }
}

/// True when `err` is a 404 answer.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

/// True when `err` is a 409 answer (conflict on resourceVersion or UID precondition).
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_section_defaults_and_rejects_unknown_keys() {
        let cfg: KubernetesConfig = toml::from_str("kubeconfig = \"/etc/k.yaml\"").unwrap();
        assert_eq!(cfg.release_method, ReleaseMethod::Auto);
        assert_eq!(cfg.node_view_refresh, Duration::from_secs(10));
        let cfg: KubernetesConfig =
            toml::from_str("node_view_refresh = \"2s\"\nrequest_timeout = \"1m\"").unwrap();
        assert_eq!(cfg.node_view_refresh, Duration::from_secs(2));
        assert_eq!(cfg.request_timeout, Duration::from_secs(60));
        let bare = toml::from_str::<KubernetesConfig>("request_timeout = 30")
            .unwrap_err()
            .to_string();
        assert!(bare.contains("30 has no unit"), "{bare}");
        assert!(toml::from_str::<KubernetesConfig>("kubeconfg = \"/x\"").is_err());
        let cfg: KubernetesConfig = toml::from_str("release_method = \"delete-node\"").unwrap();
        assert_eq!(cfg.release_method, ReleaseMethod::DeleteNode);
    }

    #[test]
    fn api_errors_map_to_hold_or_refuse() {
        let api = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "m".into(),
                ..Default::default()
            }))
        };
        assert!(map_err("x", api(503)).is_retriable());
        assert!(map_err("x", api(429)).is_retriable());
        assert!(!map_err("x", api(403)).is_retriable());
        assert!(is_not_found(&api(404)) && is_conflict(&api(409)));
    }
}
