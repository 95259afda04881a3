//! The `power` line that compares what the gateways said they serve with the inventory: a
//! machine the coordinator routes to a gateway (by its address or rack) that has no BMC for
//! it fails its first power step at once ("no BMC configured"). Pure: the gateways were
//! asked by [`super::peers::check_gateways`].

use std::collections::BTreeMap;

use crate::config::Config;
use crate::inventory::MachineRecord;

/// `None` when no step is a power step, no machine has such a type, or no gateway said what
/// it serves; else which machines their gateway does not serve, by gateway. `served` holds
/// the machines of each gateway (by name) that answered.
pub(super) fn power_served(
    config: &Config,
    procedures: &crate::repair::RepairConfig,
    machines: &[MachineRecord],
    served: &BTreeMap<String, Vec<String>>,
) -> Option<Result<String, String>> {
    let (steps, types) = super::fit::power_steps(procedures);
    let targets = config.gateways.as_ref()?.targets.as_slice();
    if steps.is_empty() || served.is_empty() {
        return None;
    }
    let mut missing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut compared = 0;
    for m in machines {
        if !m.machine_type.as_deref().is_some_and(|t| types.contains(t)) {
            continue;
        }
        let Some(i) = crate::gateway::serving(targets, &m.address, || {
            (!m.rack.is_empty()).then(|| m.rack.clone())
        }) else {
            continue; // the first `power` line names machines with no gateway at all
        };
        let gateway = targets[i].name.as_str();
        let Some(list) = served.get(gateway) else {
            continue; // not reached or too old to say: its `gateway` line says so
        };
        compared += 1;
        if !list.iter().any(|a| a == &m.address) {
            missing.entry(gateway).or_default().push(&m.address);
        }
    }
    if compared == 0 {
        return None;
    }
    let steps = steps.into_iter().collect::<Vec<_>>().join(", ");
    if missing.is_empty() {
        let s = if compared == 1 { "" } else { "s" };
        return Some(Ok(format!(
            "power steps ({steps}): the gateways have a BMC for each of the {compared} machine{s} routed to them"
        )));
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(g, addrs)| {
            let shown = addrs
                .iter()
                .take(10)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            let more = addrs.len().saturating_sub(10);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("gateway {g} has no [[bmc]] for {shown}{more}")
        })
        .collect();
    let n: usize = missing.values().map(Vec::len).sum();
    Some(Err(format!(
        "{}: the power steps ({steps}) of {n} machine{} would fail at once; add a [[bmc]] table \
         for each to its gateway's bmc-gateway.toml, or route it to the gateway that has one \
         ([[gateways.targets]] racks or machines)",
        parts.join("; "),
        if n == 1 { "" } else { "s" }
    )))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::inventory::RecordSource;

    #[test]
    fn machines_routed_to_a_gateway_without_their_bmc_are_named() {
        let config = Config::parse(
            "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\nca = \"a\"\ncert = \"b\"\n\
             key = \"c\"\n[[gateways.targets]]\nname = \"rack-1\"\naddress = \"127.0.0.1:1\"\n\
             server_name = \"g\"\nracks = [\"r1\"]\n[[gateways.targets]]\nname = \"rack-2\"\n\
             address = \"127.0.0.1:2\"\nserver_name = \"g\"\nracks = [\"r2\"]\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let procedures = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: op\n      repair_steps:\n      - repair_command: [\"@power-cycle\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nrack = \"r1\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.1.2\"\nhostname = \"b\"\nrack = \"r1\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.2.1\"\nhostname = \"c\"\nrack = \"r2\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.1.3\"\nhostname = \"d\"\nrack = \"r1\"\nmachine_type = \"other\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        let served = |r1: &[&str]| {
            BTreeMap::from([(
                "rack-1".to_string(),
                r1.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )])
        };
        // rack-2 did not say (an older gateway): its machine is not judged.
        let ok = power_served(
            &config,
            &procedures,
            &machines,
            &served(&["10.0.1.1", "10.0.1.2"]),
        )
        .unwrap()
        .unwrap();
        assert!(ok.contains("each of the 2 machines"), "{ok}");
        let e = power_served(&config, &procedures, &machines, &served(&["10.0.1.1"]))
            .unwrap()
            .unwrap_err();
        assert!(
            e.starts_with("gateway rack-1 has no [[bmc]] for 10.0.1.2: the power steps (@power-cycle) of 1 machine would fail at once"),
            "{e}"
        );
        // Nobody said: nothing to compare.
        assert!(power_served(&config, &procedures, &machines, &BTreeMap::new()).is_none());
    }
}
