//! A hand-written Redfish service for the unit tests of [`super`] (test builds only).

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{AuthMode, RedfishPowerControl, RedfishTarget, Trust};

/// A hand-written Redfish service: SessionService login, one system offering only
/// ForceOff and On, resets answered 202 with a Task that completes on its second read.
#[derive(Default)]
pub(super) struct Fake {
    pub(super) power: StdMutex<String>,
    pub(super) calls: StdMutex<Vec<String>>,
    pub(super) task_reads: StdMutex<u32>,
    /// Answer resets with a task that is already gone (404).
    pub(super) task_gone: StdMutex<bool>,
    /// Answer resets with this task URL instead (e.g. on another host).
    pub(super) task_at: StdMutex<Option<String>>,
    /// Power states the system reads after each reset before the reset's result (e.g.
    /// `PoweringOff`), and those still to be read.
    pub(super) transient: StdMutex<Vec<String>>,
    pending: StdMutex<Vec<String>>,
}

const TOKEN: &str = "tok-123";

fn authed(h: &HeaderMap) -> bool {
    h.get("X-Auth-Token").and_then(|v| v.to_str().ok()) == Some(TOKEN)
}

async fn root() -> Response {
    axum::Json(json!({
        "Systems": {"@odata.id": "/redfish/v1/Systems"},
        "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}
    }))
    .into_response()
}

async fn login(State(f): State<Arc<Fake>>, body: axum::Json<Value>) -> Response {
    f.calls.lock().unwrap().push("login".into());
    if body["UserName"] == "admin" && body["Password"] == "pw" {
        (
            StatusCode::CREATED,
            [
                ("X-Auth-Token", TOKEN),
                ("Location", "/redfish/v1/SessionService/Sessions/1"),
            ],
            "{}",
        )
            .into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            r#"{"error":{"message":"bad credentials"}}"#,
        )
            .into_response()
    }
}

async fn systems(h: HeaderMap) -> Response {
    if !authed(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(json!({"Members": [{"@odata.id": "/redfish/v1/Systems/s1"}]})).into_response()
}

async fn system(State(f): State<Arc<Fake>>, h: HeaderMap) -> Response {
    if !authed(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut pending = f.pending.lock().unwrap();
    let p = if pending.is_empty() {
        f.power.lock().unwrap().clone()
    } else {
        pending.remove(0)
    };
    // Empty: a system that does not say its power state (null).
    let p = if p.is_empty() { Value::Null } else { p.into() };
    axum::Json(json!({
        "PowerState": p,
        "Actions": {"#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/s1/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues": ["ForceOff", "On"]
        }}
    }))
    .into_response()
}

async fn reset(State(f): State<Arc<Fake>>, h: HeaderMap, body: axum::Json<Value>) -> Response {
    if !authed(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let t = body["ResetType"].as_str().unwrap_or("").to_string();
    f.calls.lock().unwrap().push(t.clone());
    *f.power.lock().unwrap() = if t == "On" { "On" } else { "Off" }.into();
    *f.task_reads.lock().unwrap() = 0;
    *f.pending.lock().unwrap() = f.transient.lock().unwrap().clone();
    let task = if let Some(t) = f.task_at.lock().unwrap().clone() {
        t
    } else if *f.task_gone.lock().unwrap() {
        "/redfish/v1/TaskService/Tasks/gone".into()
    } else {
        "/redfish/v1/TaskService/Tasks/7".into()
    };
    (StatusCode::ACCEPTED, [("Location", task)], "{}").into_response()
}

async fn task(State(f): State<Arc<Fake>>, h: HeaderMap) -> Response {
    if !authed(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut n = f.task_reads.lock().unwrap();
    *n += 1;
    f.calls.lock().unwrap().push(format!("task{n}"));
    let state = if *n >= 2 { "Completed" } else { "Running" };
    axum::Json(json!({"TaskState": state, "TaskStatus": "OK"})).into_response()
}

async fn logout(State(f): State<Arc<Fake>>, Path(id): Path<String>) -> Response {
    f.calls.lock().unwrap().push(format!("logout {id}"));
    StatusCode::NO_CONTENT.into_response()
}

pub(super) async fn serve(fake: Arc<Fake>) -> std::net::SocketAddr {
    let app = Router::new()
        .route("/redfish/v1/", get(root))
        .route("/redfish/v1/SessionService/Sessions", post(login))
        .route(
            "/redfish/v1/SessionService/Sessions/{id}",
            axum::routing::delete(logout),
        )
        .route("/redfish/v1/Systems", get(systems))
        .route("/redfish/v1/Systems/s1", get(system))
        .route(
            "/redfish/v1/Systems/s1/Actions/ComputerSystem.Reset",
            post(reset),
        )
        .route("/redfish/v1/TaskService/Tasks/7", get(task))
        .with_state(fake);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// A service answering every request with `status` and `body` (for answers no Redfish
/// service should give).
pub(super) async fn answering(status: StatusCode, body: Vec<u8>) -> std::net::SocketAddr {
    let app = Router::new().fallback(move || async move { (status, body) });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

pub(super) fn client(addr: std::net::SocketAddr, password: &str) -> RedfishPowerControl {
    RedfishPowerControl::new(RedfishTarget {
        name: "fake".into(),
        authority: addr.to_string(),
        trust: Trust::PlainHttp,
        username: "admin".into(),
        password: password.into(),
        system: "discover".into(),
        auth: AuthMode::Auto,
        request_timeout: Duration::from_secs(5),
    })
    .unwrap()
}
