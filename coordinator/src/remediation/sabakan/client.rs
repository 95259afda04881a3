//! The GraphQL client of a sabakan: one query, `searchMachines(having, notHaving)`, POSTed
//! as `{query, variables}` with reqwest, and the answer parsed into [`SabakanMachine`]s.
//!
//! Parsing is separate from sending ([`parse_response`] takes the status and the body) so it
//! is tested without a socket. It deliberately asks for the fields the remediation needs
//! and no others, and it does not page: `searchMachines` returns the whole match at once.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::SabakanConfig;
use crate::health::MachineState;
use crate::remediation::config::MachineFilter;

/// The query, as sabakan's schema (`gql/schema.graphql`) names the fields.
pub const SEARCH_MACHINES: &str =
    "query search($having: MachineParams, $notHaving: MachineParams) {
  searchMachines(having: $having, notHaving: $notHaving) {
    spec {
      serial
      labels { name value }
      rack
      indexInRack
      role
      ipv4
      registerDate
      retireDate
      bmc { bmcType ipv4 }
    }
    status { state timestamp duration }
  }
}";

/// How much of an error body goes into a message: enough for a proxy's one-line reason,
/// not a whole HTML page.
const BODY_EXCERPT: usize = 200;

/// Why sabakan could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SabakanError {
    /// The client could not be built (bad CA file).
    #[error("sabakan client for {url}: {detail}")]
    Setup {
        /// The configured URL.
        url: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// No answer: connection refused, DNS, TLS, or the request timeout passed.
    #[error("cannot reach sabakan at {url}: {detail}")]
    Unreachable {
        /// The configured URL.
        url: String,
        /// The transport's reason.
        detail: String,
    },
    /// An HTTP status other than 200.
    #[error("sabakan answered HTTP {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The body is not the JSON a GraphQL server answers.
    #[error("sabakan's answer is not a GraphQL response: {0}")]
    Decode(String),
    /// The GraphQL `errors` array was not empty.
    #[error("sabakan answered with GraphQL errors: {}", .0.join("; "))]
    GraphQl(Vec<String>),
    /// A machine in the answer cannot be used (the message names its serial).
    #[error("sabakan machine {serial}: {detail}")]
    Machine {
        /// The machine's serial.
        serial: String,
        /// What is wrong.
        detail: String,
    },
}

impl SabakanError {
    /// True when asking again later may succeed (the poller retries every interval anyway;
    /// this says whether an operator needs to act).
    pub fn is_retriable(&self) -> bool {
        match self {
            SabakanError::Unreachable { .. } => true,
            SabakanError::Status { status, .. } => *status >= 500 || *status == 429,
            SabakanError::Setup { .. }
            | SabakanError::Decode(_)
            | SabakanError::GraphQl(_)
            | SabakanError::Machine { .. } => false,
        }
    }
}

/// One machine as sabakan reports it, with the fields the remediation reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SabakanMachine {
    /// `spec.serial`.
    pub serial: String,
    /// `spec.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.rack`.
    pub rack: i64,
    /// `spec.role`.
    pub role: String,
    /// `spec.ipv4[0]`: the address, the key of a repair entry.
    pub address: String,
    /// `spec.bmc.bmcType`: the machine type.
    pub bmc_type: String,
    /// `status.state`.
    pub state: MachineState,
    /// `status.timestamp`: when the state was entered.
    pub since: Timestamp,
    /// `status.duration`: seconds in the state when sabakan answered.
    pub duration: f64,
}

/// sabakan's machine states; the others (`stopped`, `awaiting-registration`) are
/// Fleetmend's own and sabakan would reject them.
const SABAKAN_STATES: [MachineState; 7] = [
    MachineState::Uninitialized,
    MachineState::Healthy,
    MachineState::Unhealthy,
    MachineState::Unreachable,
    MachineState::Updating,
    MachineState::Retiring,
    MachineState::Retired,
];

/// The variables of [`SEARCH_MACHINES`] for a `having` / `not_having` pair. A value sabakan
/// cannot take (a rack that is not a number, a state sabakan does not have) is an error,
/// never dropped: dropping a condition would widen the search.
pub fn variables(having: &MachineFilter, not_having: &MachineFilter) -> Result<Value, String> {
    Ok(json!({
        "having": params(having, "having")?,
        "notHaving": params(not_having, "not_having")?,
    }))
}

fn params(f: &MachineFilter, which: &str) -> Result<Value, String> {
    // An empty list is "no condition" to sabakan too; null keeps the request minimal.
    let list = |v: Vec<Value>| {
        if v.is_empty() {
            Value::Null
        } else {
            Value::Array(v)
        }
    };
    let racks = f
        .racks
        .iter()
        .map(|r| {
            r.parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("{which}.racks: {r:?} is not a sabakan rack number"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let states = f
        .states
        .iter()
        .map(|s| {
            if SABAKAN_STATES.contains(s) {
                Ok(Value::from(s.as_str().to_uppercase()))
            } else {
                Err(format!(
                    "{which}.states: {s} is not a sabakan machine state"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json!({
        "labels": list(f.labels.iter().map(|(k, v)| json!({"name": k, "value": v})).collect()),
        "racks": list(racks),
        "roles": list(f.roles.iter().map(|r| Value::from(r.as_str())).collect()),
        "states": list(states),
    }))
}

#[derive(Deserialize)]
struct Response {
    data: Option<Data>,
    #[serde(default)]
    errors: Vec<GraphQlError>,
}

#[derive(Deserialize)]
struct GraphQlError {
    message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    search_machines: Vec<WireMachine>,
}

#[derive(Deserialize)]
struct WireMachine {
    spec: WireSpec,
    status: WireStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpec {
    serial: String,
    #[serde(default)]
    labels: Option<Vec<WireLabel>>,
    rack: i64,
    role: String,
    ipv4: Vec<String>,
    bmc: WireBmc,
}

#[derive(Deserialize)]
struct WireLabel {
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireBmc {
    bmc_type: String,
}

#[derive(Deserialize)]
struct WireStatus {
    state: String,
    timestamp: String,
    duration: f64,
}

fn excerpt(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    let s = s.trim();
    match s.char_indices().nth(BODY_EXCERPT) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Parses sabakan's answer: HTTP status, then the GraphQL envelope (a non-empty `errors`
/// is an error even when `data` is present: a partial answer would hide machines), then
/// each machine.
pub fn parse_response(status: u16, body: &[u8]) -> Result<Vec<SabakanMachine>, SabakanError> {
    // GraphQL servers may answer errors with 4xx and a GraphQL body; prefer its messages.
    let parsed: Result<Response, _> = serde_json::from_slice(body);
    if status != 200 {
        if let Ok(r) = &parsed
            && !r.errors.is_empty()
        {
            return Err(SabakanError::GraphQl(
                r.errors.iter().map(|e| e.message.clone()).collect(),
            ));
        }
        return Err(SabakanError::Status {
            status,
            body: excerpt(body),
        });
    }
    let r = parsed.map_err(|e| SabakanError::Decode(format!("{e} (body: {})", excerpt(body))))?;
    if !r.errors.is_empty() {
        return Err(SabakanError::GraphQl(
            r.errors.into_iter().map(|e| e.message).collect(),
        ));
    }
    let data = r
        .data
        .ok_or_else(|| SabakanError::Decode("neither data nor errors in the answer".into()))?;
    data.search_machines.into_iter().map(machine).collect()
}

fn machine(w: WireMachine) -> Result<SabakanMachine, SabakanError> {
    let serial = w.spec.serial;
    let bad = |detail: String| SabakanError::Machine {
        serial: serial.clone(),
        detail,
    };
    let address = w
        .spec
        .ipv4
        .first()
        .cloned()
        .ok_or_else(|| bad("spec.ipv4 is empty, so it has no address".into()))?;
    let state: MachineState = w
        .status
        .state
        .to_lowercase()
        .parse()
        .map_err(|e| bad(format!("status.state: {e}")))?;
    let since: Timestamp = w
        .status
        .timestamp
        .parse()
        .map_err(|e| bad(format!("status.timestamp {:?}: {e}", w.status.timestamp)))?;
    Ok(SabakanMachine {
        labels: w
            .spec
            .labels
            .unwrap_or_default()
            .into_iter()
            .map(|l| (l.name, l.value))
            .collect(),
        rack: w.spec.rack,
        role: w.spec.role,
        address,
        bmc_type: w.spec.bmc.bmc_type,
        state,
        since,
        duration: w.status.duration,
        serial,
    })
}

/// A client of one sabakan.
#[derive(Debug, Clone)]
pub struct SabakanClient {
    url: String,
    http: reqwest::Client,
}

impl SabakanClient {
    /// Builds the client: the request timeout covers connect, send and the whole answer.
    pub fn new(cfg: &SabakanConfig) -> Result<Self, SabakanError> {
        let setup = |detail: String| SabakanError::Setup {
            url: cfg.url.clone(),
            detail,
        };
        let tls = tls_config(cfg).map_err(setup)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            .build()
            .map_err(|e| setup(e.to_string()))?;
        Ok(Self {
            url: cfg.url.clone(),
            http,
        })
    }

    /// The configured URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `searchMachines(having, notHaving)`.
    pub async fn search(&self, variables: &Value) -> Result<Vec<SabakanMachine>, SabakanError> {
        let body = json!({"query": SEARCH_MACHINES, "variables": variables});
        let unreachable = |e: reqwest::Error| SabakanError::Unreachable {
            url: self.url.clone(),
            detail: describe(&e),
        };
        let resp = self
            .http
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(unreachable)?;
        parse_response(status, &bytes)
    }
}

/// reqwest's top-level message ("error sending request") hides the cause; name it.
fn describe(e: &reqwest::Error) -> String {
    let mut s = if e.is_timeout() {
        "request timed out".to_string()
    } else {
        e.to_string()
    };
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s = format!("{s}: {c}");
        src = c.source();
    }
    s
}

/// TLS for an `https` sabakan: the roots in `ca_file` (sabakan runs with a private CA);
/// unused for `http`.
fn tls_config(cfg: &SabakanConfig) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = &cfg.ca_file {
        let pem = protocol::file::read_regular(path)
            .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        for c in CertificateDer::pem_slice_iter(&pem) {
            let c = c.map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            roots
                .add(c)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        }
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(protocol::transport::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(serial: &str, ip: &str, state: &str) -> Value {
        json!({
            "spec": {
                "serial": serial,
                "labels": [{"name": "product", "value": "R640"}],
                "rack": 3,
                "indexInRack": 1,
                "role": "cs",
                "ipv4": [ip, "10.1.0.1"],
                "registerDate": "2026-01-01T00:00:00Z",
                "retireDate": "2031-01-01T00:00:00Z",
                "bmc": {"bmcType": "IPMI-2.0", "ipv4": "10.72.0.1"}
            },
            "status": {"state": state, "timestamp": "2026-11-23T05:00:00.5Z", "duration": 61.5}
        })
    }

    fn ok(machines: Vec<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({"data": {"searchMachines": machines}})).unwrap()
    }

    #[test]
    fn a_machine_maps_address_type_state_and_since() {
        let m = parse_response(200, &ok(vec![wire("s1", "10.0.0.7", "UNHEALTHY")])).unwrap();
        assert_eq!(m.len(), 1);
        let m = &m[0];
        assert_eq!(m.address, "10.0.0.7", "spec.ipv4[0]");
        assert_eq!(m.bmc_type, "IPMI-2.0");
        assert_eq!(m.state, MachineState::Unhealthy);
        assert_eq!(
            m.state.as_str(),
            "unhealthy",
            "the operation: lower-cased state"
        );
        assert_eq!(
            m.since,
            "2026-11-23T05:00:00.5Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(m.rack, 3);
        assert_eq!(m.labels["product"], "R640");
        assert_eq!(m.serial, "s1");
        assert!((m.duration - 61.5).abs() < f64::EPSILON);
    }

    #[test]
    fn graphql_errors_are_errors_even_with_data() {
        let body = json!({
            "data": {"searchMachines": []},
            "errors": [{"message": "bad state FOO", "path": ["searchMachines"]}, {"message": "second"}]
        });
        let e = parse_response(200, &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sabakan answered with GraphQL errors: bad state FOO; second"
        );
        assert!(!e.is_retriable());
        // A 422 with a GraphQL body reports the messages, not just the status.
        let e = parse_response(422, &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(matches!(e, SabakanError::GraphQl(_)), "{e}");
    }

    #[test]
    fn status_and_garbage_are_named() {
        let e = parse_response(502, b"<html>bad gateway</html>").unwrap_err();
        assert_eq!(
            e.to_string(),
            "sabakan answered HTTP 502: <html>bad gateway</html>"
        );
        assert!(e.is_retriable());
        let e = parse_response(200, b"not json").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("sabakan's answer is not a GraphQL response"),
            "{e}"
        );
        let e = parse_response(200, b"{}").unwrap_err();
        assert!(e.to_string().contains("neither data nor errors"), "{e}");
        let long = "x".repeat(1000);
        let e = parse_response(500, long.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 300, "{e}");
    }

    #[test]
    fn an_unusable_machine_is_named_by_serial() {
        let mut w = wire("s9", "10.0.0.9", "UNHEALTHY");
        w["spec"]["ipv4"] = json!([]);
        let e = parse_response(200, &ok(vec![w])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sabakan machine s9: spec.ipv4 is empty, so it has no address"
        );
        let w = wire("s8", "10.0.0.8", "BROKEN");
        let e = parse_response(200, &ok(vec![w])).unwrap_err();
        assert!(e.to_string().contains("s8: status.state"), "{e}");
    }

    #[test]
    fn variables_follow_sabakans_machine_params() {
        let having = MachineFilter {
            states: vec![MachineState::Unhealthy, MachineState::Unreachable],
            racks: vec!["3".into()],
            labels: BTreeMap::from([("zone".into(), "a".into())]),
            ..MachineFilter::default()
        };
        let not_having = MachineFilter {
            roles: vec!["boot".into()],
            ..MachineFilter::default()
        };
        let v = variables(&having, &not_having).unwrap();
        assert_eq!(
            v,
            json!({
                "having": {"labels": [{"name": "zone", "value": "a"}], "racks": [3], "roles": null,
                           "states": ["UNHEALTHY", "UNREACHABLE"]},
                "notHaving": {"labels": null, "racks": null, "roles": ["boot"], "states": null}
            })
        );
        // Never dropped, which would widen the search.
        let racks = MachineFilter {
            racks: vec!["r1".into()],
            ..MachineFilter::default()
        };
        let e = variables(&racks, &not_having).unwrap_err();
        assert_eq!(e, "having.racks: \"r1\" is not a sabakan rack number");
        let stopped = MachineFilter {
            states: vec![MachineState::Stopped],
            ..MachineFilter::default()
        };
        let e = variables(&having, &stopped).unwrap_err();
        assert_eq!(
            e,
            "not_having.states: stopped is not a sabakan machine state"
        );
    }
}
