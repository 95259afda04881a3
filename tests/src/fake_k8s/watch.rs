//! `?watch=true` on a collection: a chunked stream of newline-delimited JSON watch events
//! (`{"type": "ADDED"|"MODIFIED"|"DELETED", "object": …}`), as the API server sends them.
//!
//! - `resourceVersion` absent or `"0"`: every matching object is first sent as `ADDED`, then
//!   changes; otherwise only changes after that version.
//! - `labelSelector` and `fieldSelector` filter as for a list; an object that stops matching
//!   is sent as `DELETED`.
//! - The stream ends after `timeoutSeconds` (default 300 s; kube-rs' watcher asks for 290).
//!
//! The fake's store has no change log, so the stream polls it every [`POLL`] and diffs
//! `resourceVersion`s (and the version each object was created at): two changes to one
//! object between polls arrive as one `MODIFIED` with the latest state, which a real server
//! may also do after compaction. It keeps no history: an object deleted before the watch
//! started is not sent, and no `resourceVersion` is ever "too old" (410).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Shared;
use super::route::{Fail, Target, bad, query_param, route};
use super::select::{Fields, Labels};

/// How often a watch looks for changes: fast enough for tests with sub-second intervals.
const POLL: Duration = Duration::from_millis(50);

/// The default lifetime of a watch without `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

type Key = (String, String);

struct Watch {
    srv: Arc<Shared>,
    t: Target,
    labels: Labels,
    fields: Fields,
    seen: BTreeMap<Key, (u64, Value)>,
    deadline: Instant,
}

fn rv_of(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn key_of(o: &Value) -> Key {
    let m = &o["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

impl Watch {
    /// Matching objects now, by key, with their resource versions and the version each
    /// was created at.
    fn current_with_creation(&self) -> BTreeMap<Key, (u64, u64, Value)> {
        let mut st = self.srv.state.lock().expect("fake state poisoned");
        st.sweep();
        let res = self.t.res;
        st.list(res, self.t.ns.as_deref())
            .into_iter()
            .filter(|o| self.labels.matches(o) && self.fields.matches(o))
            .map(|o| {
                let k = key_of(o);
                let created = st
                    .created_rv
                    .get(&(res, k.0.clone(), k.1.clone()))
                    .copied()
                    .unwrap_or(0);
                (k, (rv_of(o), created, o.clone()))
            })
            .collect()
    }

    /// Matching objects now, by key, with their resource versions.
    fn current(&self) -> BTreeMap<Key, (u64, Value)> {
        self.current_with_creation()
            .into_iter()
            .map(|(k, (rv, _, o))| (k, (rv, o)))
            .collect()
    }

    /// The events since the last call, as NDJSON lines.
    fn changes(&mut self) -> String {
        let now = self.current();
        let mut out = String::new();
        let mut line = |kind: &str, obj: &Value| {
            out.push_str(&json!({"type": kind, "object": obj}).to_string());
            out.push('\n');
        };
        for (k, (rv, obj)) in &now {
            match self.seen.get(k) {
                None => line("ADDED", obj),
                Some((old, _)) if old != rv => line("MODIFIED", obj),
                _ => {}
            }
        }
        for (k, (_, obj)) in &self.seen {
            if !now.contains_key(k) {
                line("DELETED", obj);
            }
        }
        self.seen = now;
        out
    }
}

/// Starts a watch for `path?query`.
pub(super) fn start(srv: Arc<Shared>, path: &str, query: &str) -> Result<Response, Fail> {
    let t = route(path)?;
    if t.name.is_some() || t.sub.is_some() {
        return Err(bad(
            "watch a collection (with fieldSelector=metadata.name=NAME for one object)",
        ));
    }
    let labels = Labels::parse(&query_param(query, "labelSelector").unwrap_or_default())
        .map_err(|e| bad(format!("unable to parse requirement: {e}")))?;
    let fields = Fields::parse(
        &query_param(query, "fieldSelector").unwrap_or_default(),
        t.res.field_labels(),
    )
    .map_err(bad)?;
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    let from: Option<u64> = query_param(query, "resourceVersion")
        .filter(|v| !v.is_empty() && v != "0")
        .and_then(|v| v.parse().ok());
    let mut w = Watch {
        srv,
        t,
        labels,
        fields,
        seen: BTreeMap::new(),
        deadline: Instant::now() + timeout,
    };
    if let Some(from) = from {
        // Objects that existed at `from` are known to the client as they were then: one
        // changed since is MODIFIED, one created since is ADDED.
        w.seen = w
            .current_with_creation()
            .into_iter()
            .filter(|(_, (_, created, _))| *created <= from)
            .map(|(k, (rv, _, o))| (k, (rv.min(from), o)))
            .collect();
    }
    let stream = futures::stream::unfold(w, |mut w| async move {
        loop {
            let chunk = w.changes();
            if !chunk.is_empty() {
                return Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), w));
            }
            if Instant::now() >= w.deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}
