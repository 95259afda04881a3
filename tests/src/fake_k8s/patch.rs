//! The three PATCH flavours the API server accepts for built-in types: JSON merge patch
//! (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.
//!
//! The strategic merge is the subset that matters for the objects the fake serves: maps merge
//! recursively, `null` deletes, lists with a `patchMergeKey` in the Kubernetes API
//! (conditions and addresses by `type`, containers and volumes by `name`, owner references by
//! `uid`) merge element-wise with `$patch: delete` support, `metadata.finalizers` is a set
//! union, every other list (taints included, which carry no patch strategy) is replaced.
//! `$setElementOrder/…` directives are accepted and ignored; `$retainKeys` and
//! `$deleteFromPrimitiveList/…` are refused as unsupported by the fake.

use serde_json::{Map, Value};

fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets" => "name",
        "ownerReferences" => "uid",
        "ports" => "containerPort",
        _ => return None,
    })
}

/// Applies a strategic merge patch to `target`.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Some(pmap) = patch.as_object() else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if pmap.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut m = pmap.clone();
        m.remove("$patch");
        *target = Value::Object(m);
        return Ok(());
    }
    let tmap = target.as_object_mut().expect("object");
    for (k, v) in pmap {
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if k.starts_with('$') {
            return Err(format!(
                "strategic merge directive {k} is not supported by the fake"
            ));
        }
        match v {
            Value::Null => {
                tmap.remove(k);
            }
            Value::Object(_) => {
                let slot = tmap.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v)?;
            }
            Value::Array(items) => {
                if k == "finalizers" {
                    let slot = tmap
                        .entry(k.clone())
                        .or_insert_with(|| Value::Array(vec![]));
                    if let Some(arr) = slot.as_array_mut() {
                        for it in items {
                            if !arr.contains(it) {
                                arr.push(it.clone());
                            }
                        }
                    }
                } else if let Some(mk) = merge_key(k) {
                    let slot = tmap
                        .entry(k.clone())
                        .or_insert_with(|| Value::Array(vec![]));
                    if !slot.is_array() {
                        *slot = Value::Array(vec![]);
                    }
                    let arr = slot.as_array_mut().expect("array");
                    for it in items {
                        let Some(key) = it.get(mk) else {
                            return Err(format!("list {k}: element lacks merge key {mk}"));
                        };
                        let pos = arr.iter().position(|e| e.get(mk) == Some(key));
                        if it.get("$patch").and_then(Value::as_str) == Some("delete") {
                            if let Some(p) = pos {
                                arr.remove(p);
                            }
                            continue;
                        }
                        match pos {
                            Some(p) => strategic_merge(&mut arr[p], it)?,
                            None => arr.push(it.clone()),
                        }
                    }
                } else {
                    tmap.insert(k.clone(), v.clone());
                }
            }
            _ => {
                tmap.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

/// Applies a JSON merge patch (RFC 7386).
pub(crate) fn merge(target: &mut Value, patch: &Value) -> Result<(), String> {
    if !patch.is_object() {
        return Err("merge patch must be a JSON object".into());
    }
    json_patch::merge(target, patch);
    Ok(())
}

/// Applies a JSON patch (RFC 6902).
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let p: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(target, &p).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_by_key_and_replace_elsewhere() {
        let mut node = json!({
            "metadata": {"annotations": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}
        });
        strategic_merge(
            &mut node,
            &json!({
                "metadata": {"annotations": {"a": null, "c": "3"}, "finalizers": ["y"]},
                "spec": {"unschedulable": true, "taints": [{"key": "t2", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "$patch": "delete"}]}
            }),
        )
        .unwrap();
        assert_eq!(node["metadata"]["annotations"], json!({"b": "2", "c": "3"}));
        assert_eq!(node["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "t2", "effect": "NoExecute"}])
        );
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}])
        );
        assert!(strategic_merge(&mut node, &json!({"$retainKeys": []})).is_err());
        assert!(strategic_merge(&mut node, &json!([1])).is_err());
    }
}
