//! Whether the configuration's files fit together: every power step of the repair file has
//! a gateway for each inventory machine it would run on, and every operation automatic
//! remediation may enqueue has a procedure. Pure functions of what `check` (and the start,
//! through [`unfit`]) has loaded; nothing here reads a file or contacts anything.

use crate::config::Config;

/// The fit checks' failures (`power`, `remediation`), for the log at start: a coordinator
/// started without `coordinator check` still says which repairs cannot run. Takes what the
/// start has loaded already.
pub fn unfit(
    config: &Config,
    procedures: &crate::repair::RepairConfig,
    machines: Option<&[crate::inventory::MachineRecord]>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Err(e)) = power_coverage(config, procedures, machines) {
        out.push(e);
    }
    if let (Some(m), Some(rem)) = (machines, &config.remediation)
        && let Err(e) = remediation_coverage(rem, procedures, m)
    {
        out.push(e);
    }
    out
}

/// The power built-ins (`@power-cycle`, `@fence`, …) the repair file's steps use, and the
/// machine types of the procedures that use them.
pub(super) fn power_steps(
    procedures: &crate::repair::RepairConfig,
) -> (
    std::collections::BTreeSet<&'static str>,
    std::collections::BTreeSet<&str>,
) {
    let mut steps = std::collections::BTreeSet::new();
    let mut types = std::collections::BTreeSet::new();
    for p in &procedures.repair_procedures {
        for op in &p.repair_operations {
            for s in &op.repair_steps {
                if let Some(b) = s.repair_command.power_builtin() {
                    steps.insert(b.name());
                    types.extend(p.machine_types.iter().map(String::as_str));
                }
            }
        }
    }
    (steps, types)
}

/// Whether the repair file's power steps (`@power-cycle`, `@fence`, …) have a gateway to go
/// through: without one such a step fails at once ("power control not available"), which
/// nothing at start would say. `None` when no step is a power step. With an inventory file,
/// each of its machines whose type has a power step must be served by a gateway (by address
/// or rack); without one, only that some gateway is configured can be checked.
pub(super) fn power_coverage(
    config: &Config,
    procedures: &crate::repair::RepairConfig,
    machines: Option<&[crate::inventory::MachineRecord]>,
) -> Option<Result<String, String>> {
    let (steps, types) = power_steps(procedures);
    if steps.is_empty() {
        return None;
    }
    let steps = steps.into_iter().collect::<Vec<_>>().join(", ");
    let types_list = types.iter().copied().collect::<Vec<_>>().join(", ");
    let targets = config
        .gateways
        .as_ref()
        .map(|g| g.targets.as_slice())
        .unwrap_or_default();
    let Some(machines) = machines else {
        return Some(if targets.is_empty() {
            Err(format!(
                "the repair file has power steps ({steps}, machine types {types_list}) but no \
                 [[gateways.targets]] is configured: every such step would fail"
            ))
        } else {
            Ok(format!(
                "power steps ({steps}) go through {} gateway(s); no inventory file to check \
                 each machine against",
                targets.len()
            ))
        });
    };
    let concerned: Vec<_> = machines
        .iter()
        .filter(|m| m.machine_type.as_deref().is_some_and(|t| types.contains(t)))
        .collect();
    if concerned.is_empty() {
        return Some(Ok(format!(
            "power steps ({steps}) are for machine types ({types_list}) no machine in the \
             inventory has"
        )));
    }
    if targets.is_empty() {
        return Some(Err(format!(
            "the repair file has power steps ({steps}) for {} machine{} (types {types_list}) but \
             no [[gateways.targets]] is configured: every such step would fail",
            concerned.len(),
            if concerned.len() == 1 { "" } else { "s" }
        )));
    }
    let unserved: Vec<String> = concerned
        .iter()
        .filter(|m| {
            crate::gateway::serving(targets, &m.address, || {
                (!m.rack.is_empty()).then(|| m.rack.clone())
            })
            .is_none()
        })
        .map(|m| {
            if m.rack.is_empty() {
                format!("{} (no rack)", m.address)
            } else {
                format!("{} (rack {})", m.address, m.rack)
            }
        })
        .collect();
    Some(if unserved.is_empty() {
        Ok(format!(
            "power steps ({steps}): each of the {} machines of types {types_list} has a gateway",
            concerned.len()
        ))
    } else {
        let shown = unserved
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = unserved.len().saturating_sub(5);
        Err(format!(
            "{} of {} machines whose repairs have power steps ({steps}) have no gateway serving \
             their address or rack, so those steps would fail: {shown}{}; add the rack to a \
             [[gateways.targets]] racks list",
            unserved.len(),
            concerned.len(),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ))
    })
}

/// Whether every operation automatic remediation may enqueue for an inventory machine has a
/// procedure for the machine's type: auto-repair enqueues the machine's state (`unhealthy`,
/// `unreachable`) for the machines its `having` / `not_having` filters let through, and each
/// health check its `operation` for the machines it selects. A missing one is refused at
/// enqueue time, so the machine is never repaired by itself; this says so before.
pub(super) fn remediation_coverage(
    rem: &crate::remediation::RemediationConfig,
    procedures: &crate::repair::RepairConfig,
    machines: &[crate::inventory::MachineRecord],
) -> Result<String, String> {
    use std::collections::{BTreeMap, BTreeSet};
    // (machine type, operation) → machines that would need it.
    let mut needed: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in machines {
        let Some(t) = &r.machine_type else { continue };
        let m = as_remediation_machine(r);
        let ar = &rem.auto_repair;
        if ar.enabled && ar.source == crate::remediation::sabakan::Source::Inventory {
            for state in &ar.having.states {
                let mut m = m.clone();
                m.state = *state;
                if ar.having.matches_all(&m) && !ar.not_having.matches_any(&m) {
                    needed
                        .entry((t.clone(), state.as_str().to_string()))
                        .or_default()
                        .insert(r.address.clone());
                    // An unhealthy machine's operation may come from its failing check.
                    if *state == crate::health::MachineState::Unhealthy {
                        for o in &ar.operation_by_check {
                            needed
                                .entry((t.clone(), o.operation.clone()))
                                .or_default()
                                .insert(r.address.clone());
                        }
                    }
                }
            }
        }
        for hc in &rem.health_checks {
            if hc.selector.matches(&m) {
                needed
                    .entry((t.clone(), hc.operation.clone()))
                    .or_default()
                    .insert(r.address.clone());
            }
        }
    }
    let missing: Vec<String> = needed
        .iter()
        .filter(|((t, op), _)| procedures.operation_for(t, op).is_err())
        .map(|((t, op), who)| {
            let n = who.len();
            let first = who.iter().next().map(String::as_str).unwrap_or_default();
            format!(
                "`{op}` for type {t} ({n} machine{}, e.g. {first})",
                if n == 1 { "" } else { "s" }
            )
        })
        .collect();
    let ar = &rem.auto_repair;
    // With sabakan, which states machines may be in is sabakan's answer at each pass: the
    // auto-repair operations are checked then (held `enqueue-refused` when a procedure is
    // missing), not here.
    let from_sabakan = if ar.enabled && ar.source == crate::remediation::sabakan::Source::Sabakan {
        "; auto-repair's operations come from sabakan's states and are checked at each pass"
    } else {
        ""
    };
    if missing.is_empty() {
        let n = needed.len();
        Ok(format!(
            "each operation remediation may enqueue has a procedure ({n} type/operation pair{}){from_sabakan}",
            if n == 1 { "" } else { "s" }
        ))
    } else {
        Err(format!(
            "remediation would enqueue operations the repair file has no procedure for, so \
             those machines are never repaired by themselves: {}",
            missing.join(", ")
        ))
    }
}

/// An inventory record as the remediation filters see a machine (state set by the caller).
fn as_remediation_machine(r: &crate::inventory::MachineRecord) -> crate::remediation::Machine {
    crate::remediation::Machine {
        serial: r.serial.clone(),
        rack: r.rack.clone(),
        role: r.role.clone(),
        machine_type: r.machine_type.clone(),
        labels: r.labels.clone(),
        ..crate::remediation::Machine::unreported(
            &r.address,
            crate::health::MachineState::Healthy,
            jiff::Timestamp::UNIX_EPOCH,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::inventory::RecordSource;

    #[test]
    fn power_steps_need_a_gateway_for_every_machine_of_their_types() {
        let config = |gateways: &str| {
            let text = format!(
                "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\nca = \"a\"\n\
                 cert = \"b\"\nkey = \"c\"\n{gateways}"
            );
            Config::parse(&text, Path::new("c.toml")).unwrap()
        };
        let repair = |cmd: &str| {
            let yaml = format!(
                "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
                 - operation: op\n      repair_steps:\n      - repair_command: [{cmd}]\n      \
                 health_check_command: [\"@agent-healthy\"]\n"
            );
            crate::repair::load::load_str(&yaml, Path::new("r.yml"))
                .unwrap()
                .config
        };
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nrack = \"r1\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.2.1\"\nhostname = \"b\"\nrack = \"r2\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.3.1\"\nhostname = \"c\"\nrack = \"r3\"\nmachine_type = \"other\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        let target = |racks: &str, machines: &str| {
            format!(
                "[[gateways.targets]]\nname = \"g\"\naddress = \"127.0.0.1:1\"\nserver_name = \"g\"\n\
                 racks = [{racks}]\nmachines = [{machines}]\n"
            )
        };
        // No power step: nothing to say.
        assert!(power_coverage(&config(""), &repair("\"true\""), Some(&machines)).is_none());
        // Power steps and no gateway at all.
        let e = power_coverage(&config(""), &repair("\"@power-cycle\""), None)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("no [[gateways.targets]]"), "{e}");
        let e = power_coverage(&config(""), &repair("\"@fence\""), Some(&machines))
            .unwrap()
            .unwrap_err();
        assert!(
            e.contains("for 2 machines") && e.contains("no [[gateways.targets]]"),
            "{e}"
        );
        // One rack served, the other machine listed by address: all covered (the third
        // machine's type has no power step).
        let ok = power_coverage(
            &config(&target("\"r1\"", "\"10.0.2.1\"")),
            &repair("\"@power-cycle\""),
            Some(&machines),
        )
        .unwrap()
        .unwrap();
        assert!(ok.contains("each of the 2 machines"), "{ok}");
        let e = power_coverage(
            &config(&target("\"r1\"", "")),
            &repair("\"@power-cycle\""),
            Some(&machines),
        )
        .unwrap()
        .unwrap_err();
        assert!(
            e.contains("1 of 2") && e.contains("10.0.2.1 (rack r2)"),
            "{e}"
        );
    }

    #[test]
    fn remediation_needs_a_procedure_for_each_operation_it_may_enqueue() {
        let rem = |extra: &str| -> crate::remediation::RemediationConfig {
            toml::from_str(extra).unwrap()
        };
        let repair = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"true\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nmachine_type = \"lab\"\n\
             [[machines]]\naddress = \"10.0.1.2\"\nhostname = \"b\"\nrole = \"boot\"\nmachine_type = \"gpu\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        // Auto-repair's defaults: `unhealthy` and `unreachable`; the boot server (type gpu,
        // no procedure at all) is left alone by not_having, so only lab's gap is named.
        let e = remediation_coverage(&rem(""), &repair, &machines).unwrap_err();
        assert!(
            e.contains("`unreachable` for type lab (1 machine, e.g. 10.0.1.1)"),
            "{e}"
        );
        assert!(
            !e.contains("gpu") && !e.contains("`unhealthy` for type lab"),
            "{e}"
        );
        // An operation chosen by failing check needs its procedure too.
        let e = remediation_coverage(
            &rem("[auto_repair]\nhaving = { states = [\"unhealthy\"] }\n\
                 operation_by_check = [{ check = \"gpu\", operation = \"gpu-xid\" }]\n"),
            &repair,
            &machines,
        )
        .unwrap_err();
        assert!(
            e.contains("`gpu-xid` for type lab (1 machine, e.g. 10.0.1.1)"),
            "{e}"
        );
        // Only unhealthy machines, and a health check whose operation lab has.
        let ok = remediation_coverage(
            &rem(
                "[auto_repair.having]\nstates = [\"unhealthy\"]\n[[health_checks]]\nname = \"h\"\n\
                  selector = { machine_types = [\"lab\"] }\nunhealthy_conditions = [{ type = \"kubelet\", \
                  status = \"False\", timeout = \"1m\" }]\n",
            ),
            &repair,
            &machines,
        );
        assert!(ok.is_ok(), "{ok:?}");
        // Auto-repair off: nothing is needed from it.
        let ok = remediation_coverage(&rem("[auto_repair]\nenabled = false\n"), &repair, &machines);
        assert!(ok.is_ok(), "{ok:?}");
        // Reading sabakan: its states are sabakan's answer at each pass, which the line says
        // instead of a count of pairs it never looked at.
        let ok = remediation_coverage(
            &rem(
                "[auto_repair]\nsource = \"sabakan\"\nsabakan = { url = \"http://127.0.0.1:1/graphql\" }\n",
            ),
            &repair,
            &machines,
        )
        .unwrap();
        assert!(
            ok.contains("(0 type/operation pairs)")
                && ok.contains("auto-repair's operations come from sabakan's states"),
            "{ok}"
        );
    }

    #[test]
    fn the_fit_failures_are_listed_for_the_log_at_start() {
        let procedures = crate::repair::load::load_str(
            "repair:\n  repair_procedures:\n  - machine_types: [lab]\n    repair_operations:\n    \
             - operation: unhealthy\n      repair_steps:\n      - repair_command: [\"@power-cycle\"]\n      \
             health_check_command: [\"@agent-healthy\"]\n",
            Path::new("r.yml"),
        )
        .unwrap()
        .config;
        let machines = crate::inventory::parse_inventory(
            "[[machines]]\naddress = \"10.0.1.1\"\nhostname = \"a\"\nrack = \"r1\"\nmachine_type = \"lab\"\n",
            Path::new("m.toml"),
            RecordSource::Inventory,
        )
        .unwrap();
        let config = |extra: &str| {
            let text = format!(
                "listen = \"127.0.0.1:7443\"\ndatabase = \"/tmp/c.db\"\n[tls]\n\
                 ca = \"a\"\ncert = \"b\"\nkey = \"c\"\n{extra}"
            );
            Config::parse(&text, Path::new("c.toml")).unwrap()
        };
        let found = unfit(&config("[remediation]\n"), &procedures, Some(&machines));
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains("no [[gateways.targets]]"), "{found:#?}");
        assert!(
            found[1].contains("`unreachable` for type lab"),
            "{found:#?}"
        );
        let served = "[[gateways.targets]]\nname = \"g\"\naddress = \"127.0.0.1:1\"\n\
                      server_name = \"g\"\nracks = [\"r1\"]\n";
        assert!(unfit(&config(served), &procedures, Some(&machines)).is_empty());
    }
}
