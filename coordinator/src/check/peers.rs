//! The `coordinator check` lines that reach a peer over the network: each gateway
//! (connect and hello, no request), the Kubernetes API server (one Node and one Lease
//! read) and sabakan (one search). Each is read-only and bounded in time; the rest of the
//! check reads only files.

use protocol::transport::{TlsFiles, TlsMaterial};

use crate::config::Config;

/// How long `check` waits for each gateway's handshake and hello.
const GATEWAY_PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One gateway's `gateway` line, and the machines it said it has a BMC for.
pub(super) struct GatewayLine {
    /// Its name in `[[gateways.targets]]`.
    pub(super) name: String,
    /// The line.
    pub(super) line: Result<String, String>,
    /// The machines it serves, when it said.
    pub(super) served: Option<Vec<String>>,
}

/// Each `[[gateways.targets]]` reached as a power request would reach it (QUIC, both
/// certificates, the hello) with no power request sent, so no BMC is touched: a gateway
/// that does not answer at its address, is not the gateway its `server_name` names, or
/// refuses this coordinator's certificate fails here instead of at the first repair. Each
/// is named with its line and, when it said, the machines it has a BMC for. Nothing
/// without gateways, or when the coordinator's TLS files do not load (the `tls` line says
/// why).
pub(super) fn check_gateways(config: &Config) -> Vec<GatewayLine> {
    let targets = match &config.gateways {
        Some(g) if !g.targets.is_empty() => g.targets.clone(),
        _ => return Vec::new(),
    };
    let Ok(tls) = TlsMaterial::load(&TlsFiles {
        ca: config.tls.ca.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    }) else {
        return Vec::new();
    };
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| tls.identity().name.clone());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return vec![GatewayLine {
                name: String::new(),
                line: Err(format!("cannot start a runtime to reach the gateways: {e}")),
                served: None,
            }];
        }
    };
    let gateways = crate::gateway::QuicGateways::new(
        std::sync::Arc::new(std::sync::RwLock::new(tls)),
        name,
        targets,
        std::sync::Arc::new(|_: &str| None),
        // A check never acts: no token, so no power request could leave.
        crate::lease_token::LeaseToken::unset(),
    );
    runtime
        .block_on(gateways.probe(GATEWAY_PROBE_LIMIT))
        .into_iter()
        .map(|(t, r)| {
            let answered = format!(
                "{} at {} ({}) answered and accepted this coordinator's certificate",
                t.name, t.address, t.server_name
            );
            match r {
                Ok(Ok(machines)) => {
                    let s = if machines.len() == 1 { "" } else { "s" };
                    let line =
                        format!("{answered}; it has a BMC for {} machine{s}", machines.len());
                    GatewayLine {
                        name: t.name.clone(),
                        line: Ok(line),
                        served: Some(machines),
                    }
                }
                // Reached, but too old to say: the rest of the line is still true.
                Ok(Err(why)) => GatewayLine {
                    name: t.name.clone(),
                    line: Ok(format!("{answered}; {why}")),
                    served: None,
                },
                Err(e) => GatewayLine {
                    name: t.name.clone(),
                    line: Err(format!("{e}; power actions through it would fail or hold")),
                    served: None,
                },
            }
        })
        .collect()
}

/// With auto-repair reading sabakan: one `searchMachines` with the file's `having` /
/// `notHaving`, as the loop would ask. A sabakan that cannot be read holds every
/// auto-repair (`sabakan-unavailable`); better to learn it here than from the journal.
pub(super) fn check_sabakan(
    rem: &crate::remediation::RemediationConfig,
) -> Option<Result<String, String>> {
    use crate::remediation::sabakan::{Source, client};
    let ar = &rem.auto_repair;
    let cfg = match (&ar.source, &ar.sabakan) {
        (Source::Sabakan, Some(cfg)) if ar.enabled => cfg,
        _ => return None,
    };
    let ask = || -> Result<String, String> {
        let c = client::SabakanClient::new(cfg).map_err(|e| e.to_string())?;
        let vars = client::variables(&ar.having, &ar.not_having)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime to reach sabakan: {e}"))?;
        let found = runtime.block_on(c.search(&vars)).map_err(|e| {
            let e = e.to_string();
            let at = if e.contains(c.url()) {
                String::new()
            } else {
                format!("sabakan at {}: ", c.url())
            };
            format!("{at}{e}; auto-repair would hold (sabakan-unavailable)")
        })?;
        let s = if found.len() == 1 { "" } else { "s" };
        Ok(format!(
            "sabakan at {} answered: {} machine{s} match having/notHaving now",
            c.url(),
            found.len()
        ))
    };
    Some(ask())
}

/// The named kubeconfig and its context, then one look at its API server
/// ([`crate::k8s::probe`]).
pub(super) fn check_kubeconfig(k: &crate::k8s::KubernetesConfig) -> Result<String, String> {
    let Some(path) = &k.kubeconfig else {
        return Ok("no kubeconfig named: KUBECONFIG, ~/.kube/config or the in-cluster account is used at start (not checked here)".into());
    };
    if !path.exists() {
        return Err(format!("kubeconfig {} is missing", path.display()));
    }
    let cfg = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    let context = k
        .context
        .clone()
        .or(cfg.current_context.clone())
        .ok_or_else(|| format!("kubeconfig {} has no current context", path.display()))?;
    if !cfg.contexts.iter().any(|c| c.name == context) {
        return Err(format!(
            "kubeconfig {} has no context {context:?}",
            path.display()
        ));
    }
    let ctx = format!("{}: context {context}", path.display());
    // The same look the start would take a while to show (a `node-view-stale` hold): the
    // address, the CA, the credentials and the RBAC, before the first machine needs them.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("{ctx}; cannot start a runtime to reach the API server: {e}"))?;
    runtime
        .block_on(crate::k8s::probe::probe(k))
        .map(|ok| format!("{ctx}; {ok}"))
        .map_err(|e| format!("{ctx}; {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_kubeconfig_is_reported_as_missing() {
        let k: crate::k8s::KubernetesConfig =
            toml::from_str("kubeconfig = \"/nonexistent/kubeconfig\"").unwrap();
        let e = check_kubeconfig(&k).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
