//! Kubernetes label selectors: the one selector type of the coordinator. Parsed from the
//! string form (`app=web,tier!=db,env in (a,b),!legacy`) or built from YAML's `matchLabels`
//! and `matchExpressions` (the repair configuration), matched against label maps, and
//! rendered back to the string form for the API server.
//!
//! Used where the coordinator has to match labels itself (protected Job pods are matched
//! against pods it already listed); where the API server can filter (`protected_namespaces`)
//! the selector string is sent as `labelSelector` instead. Set-based and equality-based
//! requirements are supported; this deliberately does not validate label key syntax beyond
//! what the API server would reject anyway.

use std::collections::BTreeMap;

/// A label selector that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector as written.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl SelectorError {
    /// Never retriable: the configuration must be fixed.
    pub fn is_retriable(&self) -> bool {
        false
    }
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            // As in Kubernetes: `k!=v` matches objects without the label.
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the string form used by `kubectl -l` and the `labelSelector` query parameter.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let err = |reason: &str| SelectorError {
            selector: selector.to_string(),
            reason: reason.to_string(),
        };
        let mut requirements = Vec::new();
        for part in split_top_level(selector).map_err(|r| err(&r))? {
            let part = part.trim();
            if part.is_empty() {
                if selector.trim().is_empty() {
                    continue;
                }
                return Err(err("empty requirement"));
            }
            requirements.push(parse_requirement(part).map_err(|r| err(&r))?);
        }
        Ok(Self { requirements })
    }

    /// True when every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// True for the selector that matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Adds a `matchLabels` entry: `key=value`.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.requirements
            .push(Requirement::Equals(key.into(), value.into()));
        self
    }

    /// Adds a `matchExpressions` entry; `None` when `operator` is not `In`, `NotIn`,
    /// `Exists` or `DoesNotExist`.
    pub fn with_expression(
        mut self,
        key: impl Into<String>,
        operator: &str,
        values: Vec<String>,
    ) -> Option<Self> {
        let key = key.into();
        self.requirements.push(match operator {
            "In" => Requirement::In(key, values),
            "NotIn" => Requirement::NotIn(key, values),
            "Exists" => Requirement::Exists(key),
            "DoesNotExist" => Requirement::DoesNotExist(key),
            _ => return None,
        });
        Some(self)
    }

    /// The selector in the string syntax of the Kubernetes API (`a=b,c in (d,e),!f`), as
    /// sent in `labelSelector`. The empty selector is the empty string.
    pub fn to_query(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => f.write_str(k)?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or("unbalanced ')'")?,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn valid_token(t: &str) -> bool {
    !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or("set must be written as (a,b)")?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(|v| !v.is_empty() && !valid_token(v)) {
        return Err("invalid value in set".into());
    }
    Ok(values)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return valid_token(key)
            .then(|| Requirement::DoesNotExist(key.to_string()))
            .ok_or_else(|| format!("invalid key {key:?}"));
    }
    let key_value = |sep: &str| -> Option<Result<(String, String), String>> {
        let (k, v) = part.split_once(sep)?;
        let (k, v) = (k.trim(), v.trim());
        Some(if !valid_token(k) {
            Err(format!("invalid key {k:?}"))
        } else if !v.is_empty() && !valid_token(v) {
            Err(format!("invalid value {v:?}"))
        } else {
            Ok((k.to_string(), v.to_string()))
        })
    };
    if let Some(kv) = key_value("!=") {
        let (k, v) = kv?;
        return Ok(Requirement::NotEquals(k, v));
    }
    if let Some(kv) = key_value("==").or_else(|| key_value("=")) {
        let (k, v) = kv?;
        return Ok(Requirement::Equals(k, v));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default().trim();
    let rest = words.next().unwrap_or_default().trim();
    if rest.is_empty() {
        return valid_token(key)
            .then(|| Requirement::Exists(key.to_string()))
            .ok_or_else(|| format!("invalid key {key:?}"));
    }
    if !valid_token(key) {
        return Err(format!("invalid key {key:?}"));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(key.to_string(), parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Requirement::In(key.to_string(), parse_set(set)?));
    }
    Err(format!("unknown operator in {part:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_and_sets() {
        let s = LabelSelector::parse("app=web, tier!=db,env in (prod, stage),!legacy").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod"), ("legacy", "")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod"), ("tier", "db")])));
        let s = LabelSelector::parse("team notin (a,b),batch").unwrap();
        assert!(s.matches(&labels(&[("batch", "1")])));
        assert!(!s.matches(&labels(&[("batch", "1"), ("team", "a")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn built_selectors_render_in_api_syntax_and_parse_back() {
        let sel = LabelSelector::default()
            .with_label("app", "web")
            .with_expression("tier", "In", vec!["a".into(), "b".into()])
            .unwrap()
            .with_expression("gone", "DoesNotExist", Vec::new())
            .unwrap();
        assert_eq!(sel.to_query(), "app=web,tier in (a,b),!gone");
        assert_eq!(LabelSelector::parse(&sel.to_query()).unwrap(), sel);
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(
            LabelSelector::default()
                .with_expression("k", "Gt", Vec::new())
                .is_none()
        );
    }

    #[test]
    fn empty_matches_everything_and_garbage_is_refused() {
        assert!(
            LabelSelector::parse("")
                .unwrap()
                .matches(&labels(&[("x", "y")]))
        );
        assert!(LabelSelector::parse("a=(b").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a = b c").is_err());
    }
}
