//! A small sabakan: its GraphQL endpoint (`POST /graphql`) with the one query Fleetmend
//! asks, `searchMachines(having: MachineParams, notHaving: MachineParams)`, over an
//! in-memory machine list shaped like sabakan's schema (`gql/schema.graphql`: `Machine {
//! spec { serial labels rack indexInRack role ipv4 registerDate retireDate bmc { bmcType
//! ipv4 } } status { state timestamp duration } }`).
//!
//! It filters the way sabakan does: `having` needs every given field to match (labels: all
//! of them; racks, roles, states: any of the list; `minDaysBeforeRetire`: at least that many
//! days left before the retire date), `notHaving` excludes a machine matching any given
//! field (`minDaysBeforeRetire`: that many days left or more). Variables are checked against `MachineParams` (unknown keys, states outside
//! the enum and racks that are not integers are GraphQL errors, as a real server answers).
//!
//! What it deliberately does not do: parse GraphQL. A query that names `searchMachines`
//! gets every field of the schema back whatever it selected; any other query is an error.
//! It can be told to fail ([`Fault`]) or be stopped, so tests can show what the coordinator
//! does when sabakan cannot be read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// sabakan's `MachineState` enum.
pub const STATES: [&str; 7] = [
    "UNINITIALIZED",
    "HEALTHY",
    "UNHEALTHY",
    "UNREACHABLE",
    "UPDATING",
    "RETIRING",
    "RETIRED",
];

/// One machine, as sabakan stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct SabakanMachine {
    /// `spec.serial`.
    pub serial: String,
    /// `spec.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.rack`.
    pub rack: i64,
    /// `spec.indexInRack`.
    pub index_in_rack: i64,
    /// `spec.role`.
    pub role: String,
    /// `spec.ipv4`.
    pub ipv4: Vec<String>,
    /// `spec.registerDate`.
    pub register_date: Timestamp,
    /// `spec.retireDate`.
    pub retire_date: Timestamp,
    /// `spec.bmc.bmcType`.
    pub bmc_type: String,
    /// `spec.bmc.ipv4`.
    pub bmc_ipv4: String,
    /// `status.state`, one of [`STATES`].
    pub state: String,
    /// `status.timestamp`: when the state was entered.
    pub timestamp: Timestamp,
}

impl SabakanMachine {
    /// A healthy `cs` machine in `rack` with address `ipv4` and an `IPMI-2.0` BMC, retiring
    /// in five years.
    pub fn new(serial: &str, ipv4: &str, rack: i64) -> Self {
        let now = Timestamp::now();
        Self {
            serial: serial.into(),
            labels: BTreeMap::new(),
            rack,
            index_in_rack: 1,
            role: "cs".into(),
            ipv4: vec![ipv4.into()],
            register_date: now,
            retire_date: now + jiff::SignedDuration::from_hours(5 * 365 * 24),
            bmc_type: "IPMI-2.0".into(),
            bmc_ipv4: "10.72.17.1".into(),
            state: "HEALTHY".into(),
            timestamp: now,
        }
    }

    /// Sets the role.
    pub fn role(mut self, role: &str) -> Self {
        self.role = role.into();
        self
    }

    /// Sets the state, entered `ago` before now.
    pub fn state(mut self, state: &str, ago: Duration) -> Self {
        assert!(STATES.contains(&state), "not a sabakan state: {state}");
        self.state = state.into();
        self.timestamp = Timestamp::now() - jiff::SignedDuration::try_from(ago).expect("short");
        self
    }

    /// Adds a label.
    pub fn label(mut self, name: &str, value: &str) -> Self {
        self.labels.insert(name.into(), value.into());
        self
    }

    fn to_json(&self, now: Timestamp) -> Value {
        let duration = now.duration_since(self.timestamp).as_secs_f64();
        json!({
            "spec": {
                "serial": self.serial,
                "labels": self.labels.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
                "rack": self.rack,
                "indexInRack": self.index_in_rack,
                "role": self.role,
                "ipv4": self.ipv4,
                "registerDate": self.register_date.to_string(),
                "retireDate": self.retire_date.to_string(),
                "bmc": {"bmcType": self.bmc_type, "ipv4": self.bmc_ipv4},
            },
            "status": {"state": self.state, "timestamp": self.timestamp.to_string(), "duration": duration},
        })
    }
}

/// A way to fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer HTTP 200 with this message in the GraphQL `errors` array.
    GraphQl(String),
    /// Answer this HTTP status with a plain-text body.
    Status(u16),
    /// Never answer (the client's timeout must fire).
    Hang,
}

/// `MachineParams`, checked.
#[derive(Debug, Default)]
struct Params {
    labels: Vec<(String, String)>,
    racks: Vec<i64>,
    roles: Vec<String>,
    states: Vec<String>,
    min_days_before_retire: Option<i64>,
}

fn params(v: Option<&Value>, name: &str) -> Result<Option<Params>, String> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(other) => return Err(format!("{name}: expected MachineParams, got {other}")),
    };
    let mut p = Params::default();
    let list = |k: &str| -> Result<Vec<Value>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a.clone()),
            Some(other) => Err(format!("{name}.{k}: expected a list, got {other}")),
        }
    };
    for k in obj.keys() {
        if !["labels", "racks", "roles", "states", "minDaysBeforeRetire"].contains(&k.as_str()) {
            return Err(format!("{name}.{k}: unknown field of MachineParams"));
        }
    }
    for l in list("labels")? {
        match (
            l.get("name").and_then(Value::as_str),
            l.get("value").and_then(Value::as_str),
        ) {
            (Some(n), Some(v)) => p.labels.push((n.into(), v.into())),
            _ => {
                return Err(format!(
                    "{name}.labels: LabelInput needs name and value: {l}"
                ));
            }
        }
    }
    for r in list("racks")? {
        p.racks.push(
            r.as_i64()
                .ok_or_else(|| format!("{name}.racks: {r} is not an Int"))?,
        );
    }
    for r in list("roles")? {
        p.roles.push(
            r.as_str()
                .ok_or_else(|| format!("{name}.roles: {r} is not a String"))?
                .into(),
        );
    }
    for s in list("states")? {
        match s.as_str() {
            Some(s) if STATES.contains(&s) => p.states.push(s.into()),
            _ => return Err(format!("{name}.states: {s} is not a valid MachineState")),
        }
    }
    p.min_days_before_retire = match obj.get("minDaysBeforeRetire") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| format!("{name}.minDaysBeforeRetire: {v} is not an Int"))?,
        ),
    };
    Ok(Some(p))
}

/// sabakan's `matchMachine`: `having` needs all its given fields, `notHaving` excludes on any.
fn matches(m: &SabakanMachine, h: Option<&Params>, nh: Option<&Params>, now: Timestamp) -> bool {
    let label = |(k, v): &(String, String)| m.labels.get(k) == Some(v);
    let days = now.duration_until(m.retire_date).as_hours() / 24;
    if let Some(h) = h {
        let any = |list: bool, hit: bool| list || hit;
        if !h.labels.iter().all(label)
            || !any(h.racks.is_empty(), h.racks.contains(&m.rack))
            || !any(h.roles.is_empty(), h.roles.contains(&m.role))
            || !any(h.states.is_empty(), h.states.contains(&m.state))
            || h.min_days_before_retire.is_some_and(|d| d > days)
        {
            return false;
        }
    }
    if let Some(nh) = nh
        && (nh.labels.iter().any(label)
            || nh.racks.contains(&m.rack)
            || nh.roles.contains(&m.role)
            || nh.states.contains(&m.state)
            || nh.min_days_before_retire.is_some_and(|d| d <= days))
    {
        return false;
    }
    true
}

#[derive(Debug, Default)]
struct Inner {
    machines: Vec<SabakanMachine>,
    fault: Option<Fault>,
    /// The `variables` of every request, in order.
    requests: Vec<Value>,
}

type Shared = Arc<Mutex<Inner>>;

async fn graphql(State(s): State<Shared>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    let fault = {
        let mut g = s.lock().expect("fake sabakan poisoned");
        g.requests
            .push(body.get("variables").cloned().unwrap_or(Value::Null));
        g.fault.clone()
    };
    let error = |msg: String| {
        (
            StatusCode::OK,
            Json(json!({"errors": [{"message": msg}], "data": null})),
        )
    };
    match fault {
        Some(Fault::GraphQl(msg)) => return error(msg),
        Some(Fault::Status(code)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (code, Json(json!("injected failure")));
        }
        Some(Fault::Hang) => std::future::pending::<()>().await,
        None => {}
    }
    let query = body
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !query.contains("searchMachines(") {
        return error("this fake sabakan answers only searchMachines".into());
    }
    let vars = body.get("variables");
    let (h, nh) = match (
        params(vars.and_then(|v| v.get("having")), "having"),
        params(vars.and_then(|v| v.get("notHaving")), "notHaving"),
    ) {
        (Ok(h), Ok(nh)) => (h, nh),
        (Err(e), _) | (_, Err(e)) => return error(format!("input: variable.{e}")),
    };
    let now = Timestamp::now();
    let g = s.lock().expect("fake sabakan poisoned");
    let found: Vec<Value> = g
        .machines
        .iter()
        .filter(|m| matches(m, h.as_ref(), nh.as_ref(), now))
        .map(|m| m.to_json(now))
        .collect();
    (
        StatusCode::OK,
        Json(json!({"data": {"searchMachines": found}})),
    )
}

/// Serves `app` over TLS, one task per connection (HTTP/1.1), until `stop`. A handshake
/// that fails (a client that does not trust the certificate) only ends that connection.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    stop: CancellationToken,
) {
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

/// A running fake sabakan on its own runtime thread; stopped on drop.
pub struct FakeSabakan {
    addr: SocketAddr,
    https: bool,
    inner: Shared,
    stop: CancellationToken,
    rt: Option<tokio::runtime::Runtime>,
}

impl FakeSabakan {
    /// Starts on an ephemeral loopback port with `machines`, over plain HTTP.
    pub fn start(machines: Vec<SabakanMachine>) -> anyhow::Result<Self> {
        Self::start_with(machines, None)
    }

    /// Starts over HTTPS with the certificate and key in `tls` (PEM; a certificate naming
    /// 127.0.0.1), as sabakan runs behind its private CA. [`FakeSabakan::url`] then says
    /// `https`.
    pub fn start_https(
        machines: Vec<SabakanMachine>,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> anyhow::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(key)?;
        let cfg = rustls::ServerConfig::builder_with_provider(protocol::transport::provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Self::start_with(
            machines,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg))),
        )
    }

    fn start_with(
        machines: Vec<SabakanMachine>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-sabakan")
            .enable_all()
            .build()?;
        let inner: Shared = Arc::new(Mutex::new(Inner {
            machines,
            ..Inner::default()
        }));
        let stop = CancellationToken::new();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/graphql", post(graphql))
            .with_state(inner.clone());
        let s = stop.clone();
        let https = tls.is_some();
        match tls {
            None => {
                rt.spawn(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async move { s.cancelled().await })
                        .await;
                });
            }
            Some(acceptor) => {
                rt.spawn(serve_tls(listener, acceptor, app, s));
            }
        }
        Ok(Self {
            addr,
            https,
            inner,
            stop,
            rt: Some(rt),
        })
    }

    /// `http://127.0.0.1:PORT/graphql` (`https` when started with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}/graphql", self.addr)
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("fake sabakan poisoned")
    }

    /// Changes the machine with `serial`.
    pub fn update(&self, serial: &str, f: impl FnOnce(&mut SabakanMachine)) {
        let mut g = self.inner();
        let m = g
            .machines
            .iter_mut()
            .find(|m| m.serial == serial)
            .unwrap_or_else(|| panic!("no sabakan machine {serial}"));
        f(m);
    }

    /// Fails every request from now on (`None`: answers again).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.inner().fault = fault;
    }

    /// The `variables` of every request so far.
    pub fn requests(&self) -> Vec<Value> {
        self.inner().requests.clone()
    }

    /// Stops listening: connections are refused from now on.
    pub fn stop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for FakeSabakan {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    //! Through the coordinator's own client, so both sides of the wire are exercised.

    use coordinator::remediation::sabakan::SabakanConfig;
    use coordinator::remediation::sabakan::client::{SabakanClient, SabakanError};

    use super::*;

    fn search(f: &FakeSabakan, vars: Value) -> Result<Vec<String>, SabakanError> {
        let client = SabakanClient::new(&SabakanConfig {
            url: f.url(),
            timeout: Duration::from_secs(1),
            ca_file: None,
        })
        .expect("client");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let found = rt.block_on(client.search(&vars))?;
        Ok(found.into_iter().map(|m| m.serial).collect())
    }

    fn graphql_error(r: Result<Vec<String>, SabakanError>) -> String {
        match r {
            Err(SabakanError::GraphQl(m)) => m.join("; "),
            other => panic!("expected GraphQL errors, got {other:?}"),
        }
    }

    #[test]
    fn search_machines_filters_like_sabakan_and_fails_on_demand() {
        let mut f = FakeSabakan::start(vec![
            SabakanMachine::new("a", "10.0.0.1", 0).state("UNHEALTHY", Duration::from_secs(60)),
            SabakanMachine::new("b", "10.0.0.2", 1).state("UNREACHABLE", Duration::ZERO),
            SabakanMachine::new("c", "10.0.0.3", 1)
                .state("UNHEALTHY", Duration::ZERO)
                .role("boot"),
            SabakanMachine::new("d", "10.0.0.4", 2)
                .label("pinned", "yes")
                .state("UNHEALTHY", Duration::ZERO),
            SabakanMachine::new("e", "10.0.0.5", 2),
        ])
        .unwrap();
        assert_eq!(search(&f, json!({})).unwrap(), ["a", "b", "c", "d", "e"]);
        let vars = json!({
            "having": {"states": ["UNHEALTHY", "UNREACHABLE"]},
            "notHaving": {"roles": ["boot"], "labels": [{"name": "pinned", "value": "yes"}]}
        });
        assert_eq!(search(&f, vars.clone()).unwrap(), ["a", "b"]);
        assert_eq!(f.requests().last(), Some(&vars));
        let racks = json!({"having": {"racks": [1, 2], "roles": ["cs"]}});
        assert_eq!(search(&f, racks).unwrap(), ["b", "d", "e"]);
        let retire = |k: &str| json!({ k: {"minDaysBeforeRetire": 10_000} });
        assert!(search(&f, retire("having")).unwrap().is_empty());
        assert_eq!(search(&f, retire("notHaving")).unwrap().len(), 5);
        // Variables are checked against MachineParams.
        let bad = |v: Value| graphql_error(search(&f, v));
        assert!(bad(json!({"having": {"states": ["BROKEN"]}})).contains("BROKEN"));
        assert!(bad(json!({"having": {"racks": ["r1"]}})).contains("not an Int"));
        assert!(bad(json!({"having": {"zone": 1}})).contains("unknown field"));
        // Failures on demand.
        f.set_fault(Some(Fault::GraphQl("etcd is down".into())));
        assert_eq!(bad(json!({})), "etcd is down");
        f.set_fault(Some(Fault::Status(503)));
        let e = search(&f, json!({})).unwrap_err();
        assert!(matches!(e, SabakanError::Status { status: 503, .. }), "{e}");
        f.set_fault(Some(Fault::Hang));
        let e = search(&f, json!({})).unwrap_err().to_string();
        assert!(e.contains("timed out"), "{e}");
        f.set_fault(None);
        assert_eq!(search(&f, json!({})).unwrap().len(), 5);
        f.stop();
        let e = search(&f, json!({})).unwrap_err();
        assert!(matches!(e, SabakanError::Unreachable { .. }), "{e}");
    }
}
