//! One look at the API server for `coordinator check`: can the coordinator's identity reach
//! it and read what the node view reads (Nodes, and Leases in `kube-node-lease`)?
//!
//! The running coordinator never needs this (its node view says the same thing every
//! `node_view_refresh`), but an operator checking a new `[kubernetes]` section should learn
//! before the start that the address, the CA, the credentials or the RBAC are wrong, not
//! from a `node-view-stale` hold when the first machine dies. Read-only: it lists at most
//! one object of each and changes nothing.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use super::KubernetesConfig;
use super::client::{error_chain, load_config};
use super::view::NODE_LEASE_NAMESPACE;

/// Lists one Node and one node Lease as the coordinator would. `Ok` says what answered;
/// `Err` says what is wrong, with the server's address and what to do.
pub async fn probe(cfg: &KubernetesConfig) -> Result<String, String> {
    let config = load_config(cfg).await.map_err(|e| e.to_string())?;
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("cannot build Kubernetes client: {e}"))?;
    // The client's own timeouts bound each phase; this bounds the whole look (connect,
    // TLS, two lists) so a server that trickles bytes cannot hold the check.
    let limit = cfg.request_timeout.max(std::time::Duration::from_secs(1)) * 3;
    let look = async {
        let nodes: Api<Node> = Api::all(client.clone());
        let listed = nodes
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| explain(&server, "list nodes", &e))?;
        let leases: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
        leases
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| explain(&server, "list leases in kube-node-lease", &e))?;
        let some = if listed.items.is_empty() {
            "no Node yet"
        } else {
            "Nodes"
        };
        Ok(format!(
            "API server {server} answered: the coordinator may list Nodes ({some}) and node Leases"
        ))
    };
    match tokio::time::timeout(limit, look).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "API server {server} did not answer within {}s (3 × kubernetes.request_timeout)",
            limit.as_secs()
        )),
    }
}

/// What an operator should read for a failed `what` against `server`.
fn explain(server: &str, what: &str, err: &kube::Error) -> String {
    match err {
        kube::Error::Api(s) if s.code == 401 => format!(
            "API server {server} refused the kubeconfig's credentials ({what}: 401 {}): \
             the token or client certificate is wrong or expired",
            s.message
        ),
        kube::Error::Api(s) if s.code == 403 => format!(
            "API server {server} does not let the coordinator {what} (403 {}): \
             bind it the ClusterRole in docs/kubernetes.md#rbac",
            s.message
        ),
        // Nodes and node Leases exist on every API server: a 404 for the list itself means
        // the address is something else (another HTTP service, a wrong path prefix).
        kube::Error::Api(s) if s.code == 404 => format!(
            "{server} answered 404 to {what} ({}): it does not look like a Kubernetes API \
             server; check the kubeconfig's `server` (host, port and any path prefix)",
            body_gist(&s.message)
        ),
        kube::Error::Api(s) => format!("API server {server}: {what}: {} {}", s.code, s.message),
        other => format!(
            "cannot {what} at API server {server}: {}",
            error_chain(other)
        ),
    }
}

/// A response body as one short line for a check line: an HTML page is named as such, other
/// text is cut at its first line and 120 characters.
fn body_gist(body: &str) -> String {
    let body = body.trim();
    if body.starts_with('<') {
        return "an HTML page".into();
    }
    let first = body.lines().next().unwrap_or("").trim_end();
    match first.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &first[..i]),
        None => first.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::body_gist;

    #[test]
    fn a_body_is_shown_as_one_short_line() {
        assert_eq!(body_gist("<!DOCTYPE HTML>\n<html>…</html>"), "an HTML page");
        assert_eq!(body_gist(" not found \n more"), "not found");
        assert_eq!(body_gist(&"x".repeat(200)).chars().count(), 121);
    }
}
