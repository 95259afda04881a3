//! The HTTP side of the fake API server: the verbs (get, list, create, replace, patch,
//! delete) on the resources `route` points at, the Eviction subresource with
//! PodDisruptionBudget semantics, and `Status` bodies for every failure, with the codes and
//! reasons a real API server uses.
//!
//! Not served (answered as a real server would not, and documented as a limit of the fake):
//! server-side apply (415), `deletecollection` (405); watch lives in `watch`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::patch;
use super::route::{
    Fail, Target, bad, conflict, invalid, no_route, not_found, query_param, reason_for, route,
    status,
};
use super::select::{Fields, Labels, selector_object_matches};
use super::store::{Res, State, now_rfc3339};
use super::{Fault, Recorded, Shared};

type Answer = Result<(StatusCode, Value), Fail>;

fn content_type(h: &HeaderMap) -> String {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn parse_json(body: &[u8]) -> Result<Value, Fail> {
    serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body of the request could not be decoded: {e}")))
}

fn valid_name(res: Res, name: &str) -> bool {
    let max = if matches!(res, Res::Namespace) {
        63
    } else {
        253
    };
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Checks an object decodes as its typed Kubernetes struct, then type-specific rules.
fn validate(res: Res, obj: &Value) -> Result<(), String> {
    use k8s_openapi::api as k;
    let typed = match res {
        Res::Node => serde_json::from_value::<k::core::v1::Node>(obj.clone()).map(|_| ()),
        Res::Pod => serde_json::from_value::<k::core::v1::Pod>(obj.clone()).map(|_| ()),
        Res::Namespace => serde_json::from_value::<k::core::v1::Namespace>(obj.clone()).map(|_| ()),
        Res::Event => serde_json::from_value::<k::core::v1::Event>(obj.clone()).map(|_| ()),
        Res::Pdb => {
            serde_json::from_value::<k::policy::v1::PodDisruptionBudget>(obj.clone()).map(|_| ())
        }
        Res::VolumeAttachment => {
            serde_json::from_value::<k::storage::v1::VolumeAttachment>(obj.clone()).map(|_| ())
        }
        Res::Lease => serde_json::from_value::<k::coordination::v1::Lease>(obj.clone()).map(|_| ()),
    };
    typed.map_err(|e| e.to_string())?;
    match res {
        Res::Node => {
            let mut seen = std::collections::BTreeSet::new();
            for t in obj["spec"]["taints"].as_array().into_iter().flatten() {
                let key = t["key"].as_str().unwrap_or_default();
                let effect = t["effect"].as_str().unwrap_or_default();
                if key.is_empty() {
                    return Err("spec.taints[].key: Required value".into());
                }
                if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                    return Err(format!(
                        "spec.taints[].effect: Unsupported value: \"{effect}\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
                    ));
                }
                if !seen.insert((key.to_string(), effect.to_string())) {
                    return Err(format!(
                        "spec.taints: Duplicate value: taints must be unique by key and effect pair ({key}:{effect})"
                    ));
                }
            }
        }
        Res::Event => {
            if obj["involvedObject"]["kind"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            {
                return Err("involvedObject.kind: Required value".into());
            }
            if !obj["eventTime"].is_null() {
                // New-style events need a reporting controller, instance and action.
                for f in [
                    "reportingComponent",
                    "reportingInstance",
                    "action",
                    "reason",
                ] {
                    if obj[f].as_str().unwrap_or_default().is_empty() {
                        return Err(format!("{f}: Required value"));
                    }
                }
            }
            if let Some(t) = obj["type"].as_str()
                && !["Normal", "Warning"].contains(&t)
            {
                return Err(format!("type: Unsupported value: \"{t}\""));
            }
            // A cluster-scoped object's events live in "default" (or no namespace).
            if obj["involvedObject"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
                && !matches!(
                    obj["metadata"]["namespace"].as_str(),
                    Some("default") | None
                )
            {
                return Err("involvedObject.namespace: does not match event.namespace".into());
            }
        }
        _ => {}
    }
    Ok(())
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.state.lock().expect("fake state poisoned");
        s.sweep();
        s
    }
}

/// The single entry point for every request.
pub(crate) async fn handle(AxState(srv): AxState<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), 8 << 20).await {
        Ok(b) => b,
        Err(_) => {
            return *status(
                413,
                "RequestEntityTooLarge",
                "request body too large",
                Value::Null,
            );
        }
    };
    srv.log.lock().expect("log poisoned").push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        at: std::time::SystemTime::now(),
    });
    let latency = *srv.latency.lock().expect("latency poisoned");
    if latency > Duration::ZERO {
        tokio::time::sleep(latency).await;
    }
    if let Some(resp) = injected(&srv, &method, &path) {
        return resp;
    }
    if method == Method::GET
        && query_param(&query, "watch").is_some_and(|v| v == "true" || v == "1")
    {
        return match super::watch::start(srv.clone(), &path, &query) {
            Ok(r) => r,
            Err(f) => *f,
        };
    }
    match answer(&srv, &method, &path, &query, &headers, &body) {
        Ok((code, v)) => (code, axum::Json(v)).into_response(),
        Err(r) => *r,
    }
}

fn injected(srv: &Shared, method: &Method, path: &str) -> Option<Response> {
    let mut faults = srv.faults.lock().expect("faults poisoned");
    let idx = faults.iter().position(|f: &Fault| {
        f.path_contains.as_deref().is_none_or(|p| path.contains(p))
            && f.method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
    })?;
    let f = &mut faults[idx];
    let code = f.status;
    let message = f.message.clone();
    if let Some(n) = f.times.as_mut() {
        *n -= 1;
        if *n == 0 {
            faults.remove(idx);
        }
    }
    Some(*status(code, reason_for(code), message, Value::Null))
}

fn answer(
    srv: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    if path == "/version" {
        let s = srv.lock();
        let (major, minor) = s.version.clone();
        return Ok((
            StatusCode::OK,
            json!({
                "major": major, "minor": minor,
                "gitVersion": format!("v{major}.{minor}.0"),
                "gitCommit": "fake", "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64"
            }),
        ));
    }
    if path == "/api" {
        return Ok((
            StatusCode::OK,
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ));
    }
    let t = route(path)?;
    let dry_run = query_param(query, "dryRun").is_some_and(|v| v == "All");
    let mut st = srv.lock();
    if let (Some(ns), true) = (&t.ns, method != Method::GET)
        && st.get(Res::Namespace, "", ns).is_none()
        && method == Method::POST
    {
        return Err(not_found(Res::Namespace, ns));
    }
    match (method.clone(), &t.name, t.sub.as_deref()) {
        (Method::GET, None, None) => list(&st, &t, query),
        (Method::GET, Some(name), None) => {
            let ns = t.ns.clone().unwrap_or_default();
            st.get(t.res, &ns, name)
                .cloned()
                .map(|v| (StatusCode::OK, v))
                .ok_or_else(|| not_found(t.res, name))
        }
        (Method::POST, None, None) => create(&mut st, &t, headers, body, dry_run),
        (Method::POST, Some(name), Some("eviction")) if t.res == Res::Pod => evict(
            &mut st,
            t.ns.as_deref().unwrap_or_default(),
            name,
            headers,
            body,
            dry_run,
        ),
        (Method::PUT, Some(name), None | Some("status")) => {
            replace(&mut st, &t, name, headers, body, dry_run)
        }
        (Method::PATCH, Some(name), None | Some("status")) => {
            patch_obj(&mut st, &t, name, headers, body, dry_run)
        }
        (Method::DELETE, Some(name), None) => delete(&mut st, &t, name, query, body, dry_run),
        (_, _, Some(_)) => Err(no_route()),
        (m, _, None) => Err(status(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({m})"),
            Value::Null,
        )),
    }
}

fn strip_for_list(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

fn list(st: &State, t: &Target, query: &str) -> Answer {
    let labels = Labels::parse(&query_param(query, "labelSelector").unwrap_or_default())
        .map_err(|e| bad(format!("unable to parse requirement: {e}")))?;
    let fields = Fields::parse(
        &query_param(query, "fieldSelector").unwrap_or_default(),
        t.res.field_labels(),
    )
    .map_err(bad)?;
    let items: Vec<Value> = st
        .list(t.res, t.ns.as_deref())
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .map(strip_for_list)
        .collect();
    Ok((
        StatusCode::OK,
        json!({
            "kind": format!("{}List", t.res.kind()),
            "apiVersion": t.res.api_version(),
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": items,
        }),
    ))
}

fn require_json(headers: &HeaderMap) -> Result<(), Fail> {
    let ct = content_type(headers);
    if ct == "application/json" || ct.is_empty() {
        Ok(())
    } else {
        Err(status(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {ct})"
            ),
            Value::Null,
        ))
    }
}

fn check_type_meta(res: Res, obj: &Value) -> Result<(), Fail> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != res.api_version()
    {
        return Err(bad(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            res.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != res.kind()
    {
        return Err(bad(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind()
        )));
    }
    Ok(())
}

fn create(st: &mut State, t: &Target, headers: &HeaderMap, body: &[u8], dry_run: bool) -> Answer {
    require_json(headers)?;
    let mut obj = parse_json(body)?;
    if !obj.is_object() {
        return Err(bad("the body of the request must be a JSON object"));
    }
    check_type_meta(t.res, &obj)?;
    if let (Some(ns), Some(bns)) = (&t.ns, obj["metadata"]["namespace"].as_str())
        && ns != bns
    {
        return Err(bad(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if let Some(ns) = &t.ns {
        obj["metadata"]["namespace"] = json!(ns);
    }
    if obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        if let Some(prefix) = obj["metadata"]["generateName"].as_str() {
            let suffix: u32 = rand::random();
            obj["metadata"]["name"] = json!(format!("{prefix}{:05x}", suffix & 0xfffff));
        } else {
            return Err(invalid(
                t.res,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if !valid_name(t.res, &name) {
        return Err(invalid(
            t.res,
            &name,
            "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        ));
    }
    let ns = t.ns.clone().unwrap_or_default();
    if st.get(t.res, &ns, &name).is_some() {
        return Err(status(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.res.plural()),
            json!({"name": name, "kind": t.res.plural()}),
        ));
    }
    for f in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
    ] {
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove(f);
        }
    }
    obj["apiVersion"] = json!(t.res.api_version());
    obj["kind"] = json!(t.res.kind());
    validate(t.res, &obj).map_err(bad)?;
    if dry_run {
        return Ok((StatusCode::CREATED, obj));
    }
    Ok((StatusCode::CREATED, st.insert_new(t.res, obj)))
}

/// Stores `new` over the current object after optimistic-concurrency and immutability
/// checks. `from_patch` selects 422 rather than 400 for invalid results.
fn commit(
    st: &mut State,
    t: &Target,
    name: &str,
    current: &Value,
    mut new: Value,
    from_patch: bool,
    dry_run: bool,
) -> Answer {
    let ns = t.ns.clone().unwrap_or_default();
    if let Some(rv) = new["metadata"]["resourceVersion"].as_str()
        && rv
            != current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
    {
        return Err(conflict(
            t.res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if new["metadata"]["name"].as_str() != Some(name) {
        return Err(bad(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            new["metadata"]["name"].as_str().unwrap_or_default()
        )));
    }
    if !new["metadata"]["uid"].is_null() && new["metadata"]["uid"] != current["metadata"]["uid"] {
        return Err(invalid(
            t.res,
            name,
            "metadata.uid: Invalid value: field is immutable",
        ));
    }
    check_type_meta(t.res, &new)?;
    if t.sub.as_deref() == Some("status") {
        // The status subresource changes status only.
        let status = new["status"].clone();
        new = current.clone();
        new["status"] = status;
    }
    for f in ["uid", "creationTimestamp", "deletionTimestamp", "namespace"] {
        new["metadata"][f] = current["metadata"][f].clone();
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    new["apiVersion"] = json!(t.res.api_version());
    new["kind"] = json!(t.res.kind());
    if let Err(e) = validate(t.res, &new) {
        return Err(if from_patch {
            invalid(t.res, name, e)
        } else {
            bad(e)
        });
    }
    if dry_run {
        return Ok((StatusCode::OK, new));
    }
    new["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.objects
        .insert((t.res, ns, name.to_string()), new.clone());
    Ok((StatusCode::OK, new))
}

fn replace(
    st: &mut State,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    dry_run: bool,
) -> Answer {
    require_json(headers)?;
    let new = parse_json(body)?;
    let ns = t.ns.clone().unwrap_or_default();
    let current = st
        .get(t.res, &ns, name)
        .cloned()
        .ok_or_else(|| not_found(t.res, name))?;
    commit(st, t, name, &current, new, false, dry_run)
}

fn patch_obj(
    st: &mut State,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    dry_run: bool,
) -> Answer {
    let ct = content_type(headers);
    let ns = t.ns.clone().unwrap_or_default();
    let kind = match ct.as_str() {
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => ct.clone(),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            return Err(status(
                415,
                "UnsupportedMediaType",
                "server-side apply is not implemented by the fake API server",
                Value::Null,
            ));
        }
        other => {
            return Err(status(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
                ),
                Value::Null,
            ));
        }
    };
    let p = parse_json(body)?;
    let current = st
        .get(t.res, &ns, name)
        .cloned()
        .ok_or_else(|| not_found(t.res, name))?;
    let mut new = current.clone();
    // The precondition, if any, is the patch's own resourceVersion: drop the stored one so
    // a patch without one is unconditional.
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let res = match kind.as_str() {
        "application/merge-patch+json" => patch::merge(&mut new, &p),
        "application/strategic-merge-patch+json" => patch::strategic_merge(&mut new, &p),
        _ => patch::json_patch(&mut new, &p),
    };
    if let Err(e) = res {
        // Malformed patches are 400 (decode) for merge flavours, 422 for JSON patch ops
        // that do not apply.
        return Err(if kind == "application/json-patch+json" {
            invalid(t.res, name, e)
        } else {
            bad(e)
        });
    }
    commit(st, t, name, &current, new, true, dry_run)
}

fn delete(
    st: &mut State,
    t: &Target,
    name: &str,
    query: &str,
    body: &[u8],
    dry_run: bool,
) -> Answer {
    let ns = t.ns.clone().unwrap_or_default();
    let opts = if body.is_empty() {
        json!({})
    } else {
        parse_json(body)?
    };
    if let Some(k) = opts.get("kind").and_then(Value::as_str)
        && k != "DeleteOptions"
    {
        return Err(bad(format!(
            "the kind in the data ({k}) does not match the expected kind (DeleteOptions)"
        )));
    }
    let current = st
        .get(t.res, &ns, name)
        .cloned()
        .ok_or_else(|| not_found(t.res, name))?;
    check_preconditions(t.res, name, &current, &opts["preconditions"])?;
    let grace = query_param(query, "gracePeriodSeconds")
        .and_then(|g| g.parse::<u64>().ok())
        .or_else(|| opts["gracePeriodSeconds"].as_u64());
    if dry_run {
        return Ok((StatusCode::OK, current));
    }
    let obj = if t.res == Res::Pod {
        st.delete_pod(&ns, name, grace).unwrap_or(current)
    } else {
        st.remove(t.res, &ns, name);
        current
    };
    Ok((StatusCode::OK, obj))
}

fn check_preconditions(res: Res, name: &str, current: &Value, pre: &Value) -> Result<(), Fail> {
    if let Some(uid) = pre["uid"].as_str()
        && current["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(conflict(
            res,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                current["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = pre["resourceVersion"].as_str()
        && current["metadata"]["resourceVersion"].as_str() != Some(rv)
    {
        return Err(conflict(
            res,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                current["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

fn evict(
    st: &mut State,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    dry_run: bool,
) -> Answer {
    require_json(headers)?;
    let ev = parse_json(body)?;
    if !ev.is_object() {
        return Err(bad("the body of the request must be an Eviction object"));
    }
    if let Some(av) = ev.get("apiVersion").and_then(Value::as_str)
        && av != "policy/v1"
        && av != "policy/v1beta1"
    {
        return Err(bad(format!(
            "unsupported apiVersion {av:?} for Eviction: expected policy/v1"
        )));
    }
    if let Some(k) = ev.get("kind").and_then(Value::as_str)
        && k != "Eviction"
    {
        return Err(bad(format!(
            "the kind in the data ({k}) does not match the expected kind (Eviction)"
        )));
    }
    if ev["metadata"]["name"].as_str() != Some(name) {
        return Err(bad("name in URL does not match name in Eviction object"));
    }
    if let Some(bns) = ev["metadata"]["namespace"].as_str()
        && bns != ns
    {
        return Err(bad(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let pod = st
        .get(Res::Pod, ns, name)
        .cloned()
        .ok_or_else(|| not_found(Res::Pod, name))?;
    let opts = &ev["deleteOptions"];
    check_preconditions(Res::Pod, name, &pod, &opts["preconditions"])?;
    let grace = opts["gracePeriodSeconds"].as_u64();
    let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    // Pods that are already terminating, finished or pending are evicted without
    // consulting budgets, as the API server does.
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    if !pod["metadata"]["deletionTimestamp"].is_null()
        || matches!(phase, "Succeeded" | "Failed" | "Pending")
    {
        if !dry_run {
            st.delete_pod(ns, name, grace);
        }
        return Ok((StatusCode::CREATED, ok));
    }
    let pdbs: Vec<Value> = st
        .list(Res::Pdb, Some(ns))
        .into_iter()
        .filter(|b| selector_object_matches(&b["spec"]["selector"], &pod))
        .cloned()
        .collect();
    if pdbs.len() > 1 {
        return Err(status(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            Value::Null,
        ));
    }
    if let Some(pdb) = pdbs.first() {
        let pdb_name = pdb["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
        if allowed <= 0 {
            let desired = pdb["status"]["desiredHealthy"].as_i64().unwrap_or(0);
            let current = pdb["status"]["currentHealthy"].as_i64().unwrap_or(0);
            return Err(status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                json!({"causes": [{
                    "reason": "DisruptionBudget",
                    "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently")
                }]}),
            ));
        }
        if !dry_run {
            let rv = st.next_rv();
            if let Some(b) = st.objects.get_mut(&(Res::Pdb, ns.to_string(), pdb_name)) {
                b["status"]["disruptionsAllowed"] = json!(allowed - 1);
                b["status"]["disruptedPods"][name] = json!(now_rfc3339());
                b["metadata"]["resourceVersion"] = json!(rv);
            }
        }
    }
    if !dry_run {
        st.delete_pod(ns, name, grace);
    }
    Ok((StatusCode::CREATED, ok))
}

/// For axum's `fallback`: every path goes through [`handle`].
pub(crate) fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(shared)
}
