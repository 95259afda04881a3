//! `labelSelector` and `fieldSelector` query parameters, as the API server parses them,
//! plus the policy/v1 LabelSelector object used by PodDisruptionBudgets.

use serde_json::Value;

/// A parse failure, answered with 400.
pub(crate) type SelErr = String;

#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Default)]
pub(crate) struct Labels(Vec<LabelReq>);

fn ok_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn ok_value(s: &str) -> bool {
    s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn split_outside_parens(s: &str) -> Result<Vec<String>, SelErr> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unexpected ')'".into());
                }
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err("unclosed '('".into());
    }
    out.push(cur);
    Ok(out)
}

fn values(s: &str) -> Result<Vec<String>, SelErr> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| format!("expected '(' values ')' in {s:?}"))?;
    inner
        .split(',')
        .map(|v| {
            let v = v.trim();
            if ok_value(v) {
                Ok(v.to_string())
            } else {
                Err(format!("invalid label value: {v:?}"))
            }
        })
        .collect()
}

impl Labels {
    pub(crate) fn parse(s: &str) -> Result<Self, SelErr> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for term in split_outside_parens(s)? {
            let t = term.trim();
            let bad_key = |k: &str| format!("invalid label key {k:?}");
            let req = if let Some(k) = t.strip_prefix('!') {
                let k = k.trim();
                if !ok_name(k) {
                    return Err(bad_key(k));
                }
                LabelReq::NotExists(k.into())
            } else if let Some((k, v)) = t.split_once("!=") {
                let (k, v) = (k.trim(), v.trim());
                if !ok_name(k) {
                    return Err(bad_key(k));
                }
                if !ok_value(v) {
                    return Err(format!("invalid label value: {v:?}"));
                }
                LabelReq::Ne(k.into(), v.into())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                let (k, v) = (k.trim(), v.trim());
                if !ok_name(k) {
                    return Err(bad_key(k));
                }
                if !ok_value(v) {
                    return Err(format!("invalid label value: {v:?}"));
                }
                LabelReq::Eq(k.into(), v.into())
            } else if let Some((k, rest)) = t.split_once(char::is_whitespace) {
                let rest = rest.trim_start();
                if !ok_name(k) {
                    return Err(bad_key(k));
                }
                if let Some(v) = rest.strip_prefix("notin") {
                    LabelReq::NotIn(k.into(), values(v)?)
                } else if let Some(v) = rest.strip_prefix("in") {
                    LabelReq::In(k.into(), values(v)?)
                } else {
                    return Err(format!("unknown operator in {t:?}"));
                }
            } else {
                if !ok_name(t) {
                    return Err(bad_key(t));
                }
                LabelReq::Exists(t.into())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v),
            LabelReq::Ne(k, v) => get(k) != Some(v),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: only `=`, `==` and `!=` exist for fields.
#[derive(Debug, Default)]
pub(crate) struct Fields(Vec<(String, bool, String)>);

impl Fields {
    pub(crate) fn parse(s: &str, supported: &[&str]) -> Result<Self, SelErr> {
        let mut out = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(out));
        }
        for term in s.split(',') {
            let (k, eq, v) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                ));
            };
            let k = k.trim();
            if !supported.contains(&k) {
                return Err(format!("field label not supported: {k}"));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut v = obj;
            for part in path.split('.') {
                v = &v[part];
            }
            let got = match v {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                // Unset fields compare as their zero value.
                _ if path == "spec.unschedulable" => "false".into(),
                _ => String::new(),
            };
            (got == *want) == *eq
        })
    }
}

/// Matches a metav1.LabelSelector object (matchLabels + matchExpressions). `null` matches
/// nothing; `{}` matches everything (policy/v1 semantics).
pub(crate) fn selector_object_matches(sel: &Value, obj: &Value) -> bool {
    if sel.is_null() {
        return false;
    }
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    let ml_ok = sel["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| get(k) == v.as_str()));
    let me_ok = sel["matchExpressions"].as_array().is_none_or(|es| {
        es.iter().all(|e| {
            let k = e["key"].as_str().unwrap_or_default();
            let vals: Vec<&str> = e["values"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => get(k).is_some_and(|x| vals.contains(&x)),
                "NotIn" => get(k).is_none_or(|x| !vals.contains(&x)),
                "Exists" => get(k).is_some(),
                "DoesNotExist" => get(k).is_none(),
                _ => false,
            }
        })
    });
    ml_ok && me_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_and_field_selectors() {
        let pod = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"nodeName": "n1"}});
        assert!(Labels::parse("app=web,!gone").unwrap().matches(&pod));
        assert!(!Labels::parse("app in (db)").unwrap().matches(&pod));
        assert!(Labels::parse("app=(").is_err());
        let f = Fields::parse("spec.nodeName=n1", &["spec.nodeName"]).unwrap();
        assert!(f.matches(&pod));
        assert!(Fields::parse("spec.bogus=1", &["spec.nodeName"]).is_err());
        assert!(selector_object_matches(&json!({}), &pod));
        assert!(!selector_object_matches(&Value::Null, &pod));
        assert!(selector_object_matches(
            &json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            &pod
        ));
    }
}
