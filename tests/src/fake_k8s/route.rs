//! Where a request to the fake API server points, and how it fails: path routing the way the
//! API server lays out resources (`/api/v1/…`, `/apis/<group>/<version>/…`, namespaced or
//! not), query parameters, and `Status` failure bodies with the codes and reasons a real API
//! server uses. Shared by the verbs (`api`) and watch (`watch`), which import it and not each
//! other. Answers nothing by itself.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::store::Res;

/// A failure answer, boxed to keep `Result`s small.
pub(super) type Fail = Box<Response>;

/// A `Status` failure response.
pub(crate) fn status(code: u16, reason: &str, message: impl Into<String>, details: Value) -> Fail {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code,
    });
    if !details.is_null() {
        body["details"] = details;
    }
    let sc = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Box::new((sc, axum::Json(body)).into_response())
}

pub(super) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub(super) fn not_found(res: Res, name: &str) -> Fail {
    status(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", res.plural()),
        json!({"name": name, "kind": res.plural()}),
    )
}

pub(super) fn no_route() -> Fail {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

pub(super) fn conflict(res: Res, name: &str, msg: &str) -> Fail {
    status(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {msg}",
            res.plural()
        ),
        json!({"name": name, "kind": res.plural()}),
    )
}

pub(super) fn bad(msg: impl Into<String>) -> Fail {
    status(400, "BadRequest", msg, Value::Null)
}

pub(super) fn invalid(res: Res, name: &str, msg: impl Into<String>) -> Fail {
    let msg = msg.into();
    status(
        422,
        "Invalid",
        format!("{} \"{name}\" is invalid: {msg}", res.kind()),
        json!({"name": name, "kind": res.kind(), "causes": [{"reason": "FieldValueInvalid", "message": msg}]}),
    )
}

/// Where a request points.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) res: Res,
    pub(super) ns: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

pub(super) fn route(path: &str) -> Result<Target, Fail> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(no_route()),
    };
    let lookup = |plural: &str| Res::lookup(group, version, plural).ok_or_else(no_route);
    let t = match rest {
        // /api/v1/namespaces[/name] is the Namespace resource itself.
        ["namespaces"] => Target {
            res: lookup("namespaces")?,
            ns: None,
            name: None,
            sub: None,
        },
        ["namespaces", name] => Target {
            res: lookup("namespaces")?,
            ns: None,
            name: Some(name.to_string()),
            sub: None,
        },
        ["namespaces", ns, plural, more @ ..] => {
            let res = lookup(plural)?;
            if !res.namespaced() || more.len() > 2 {
                return Err(no_route());
            }
            Target {
                res,
                ns: Some(ns.to_string()),
                name: more.first().map(|s| s.to_string()),
                sub: more.get(1).map(|s| s.to_string()),
            }
        }
        [plural, more @ ..] => {
            let res = lookup(plural)?;
            // A namespaced resource can be listed across namespaces, not addressed by name.
            if more.len() > 2 || (res.namespaced() && !more.is_empty()) {
                return Err(no_route());
            }
            Target {
                res,
                ns: None,
                name: more.first().map(|s| s.to_string()),
                sub: more.get(1).map(|s| s.to_string()),
            }
        }
        [] => return Err(no_route()),
    };
    Ok(t)
}

pub(super) fn query_param(q: &str, key: &str) -> Option<String> {
    url_pairs(q)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

pub(super) fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(x) => {
                    out.push(x);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_like_the_api_server() {
        let t = route("/api/v1/namespaces/a/pods/p/eviction").unwrap();
        assert_eq!(
            (t.res, t.ns.as_deref(), t.name.as_deref(), t.sub.as_deref()),
            (Res::Pod, Some("a"), Some("p"), Some("eviction"))
        );
        let t = route("/api/v1/namespaces/a").unwrap();
        assert_eq!((t.res, t.name.as_deref()), (Res::Namespace, Some("a")));
        let t = route("/apis/storage.k8s.io/v1/volumeattachments").unwrap();
        assert_eq!(t.res, Res::VolumeAttachment);
        assert!(route("/api/v1/widgets").is_err());
        assert!(route("/api/v1/pods/p").is_err());
        assert!(route("/api/v1/namespaces/a/nodes/n").is_err());
        assert!(route("/apis/policy/v1beta1/poddisruptionbudgets").is_err());
        assert_eq!(
            pct_decode("spec.nodeName%3Dn1%2Cx+y"),
            "spec.nodeName=n1,x y"
        );
    }
}
