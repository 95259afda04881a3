//! What the demo writes for the programs it starts: the coordinator's repair procedures and
//! remediation settings, and the shell scripts standing in for systemd and a BMC.

/// The repair procedures of machine type `demo`: CKE's format, Fleetmend's built-ins.
pub(super) const REPAIR_YAML: &str = r#"repair:
  max_concurrent_repairs: 2
  repair_procedures:
    - machine_types: ["demo"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["@restart-unit", "kubelet"]
              command_timeout_seconds: 30
              watch_seconds: 30
          health_check_command: ["@agent-healthy"]
          command_timeout_seconds: 10
        - operation: "unreachable"
          repair_steps:
            - repair_command: ["@POWER_CYCLE@"]
              command_timeout_seconds: 30
              watch_seconds: 30
          health_check_command: ["@agent-healthy"]
          command_timeout_seconds: 10
"#;

/// Automatic remediation, with the production defaults except where the demo's compressed
/// time or its small fleet needs otherwise.
pub(super) const REMEDIATION: &str = r#"[remediation]
# A pass every 500 ms and Leases stale after 3 s: production's 10 s and 20 s, compressed.
interval = "500ms"
lease_stale = "3s"

[remediation.limits]
# One rack is half of this 8-machine fleet, and the machine that died a moment before still
# counts in a burst of silences for `window`: with the default 30 % a rack's power loss would
# be taken for the coordinator losing its network (self-isolation: 5 of 8 silent). 70 % keeps
# that rule for a real partition and lets correlated-failure name the rack. A silence settles
# in 1 s here (two reports), not 10 s.
self_isolation = { percent = 70, min_silent = 3, window = "1m", settle = "1s" }
"#;

/// Stand-in for `systemctl restart -- UNIT`: a restarted kubelet is healthy again.
/// Arguments: the kubelet's state file, the log of restarts, then the unit (appended by
/// the agent).
pub(super) const RESTART_UNIT: &str = r#"#!/bin/sh
# Demo stand-in for `systemctl restart -- $3`: fixes the fake kubelet by rewriting its state.
set -eu
state="$1"; log="$2"; unit="$3"
[ "$unit" = kubelet ] || { echo "no such unit: $unit" >&2; exit 5; }
sleep 0.5
echo ok > "$state"
echo "$(basename "$state" .kubelet) $unit" >> "$log"
echo "restarted $unit"
"#;

/// Stand-in for a BMC power cycle (the demo has no BMC): asks the demo's simulated hardware
/// to cut and restore the power of the machine at `$1` (the address the repair queue
/// appends), and waits until it is on.
pub(super) const POWER_CYCLE: &str = r#"#!/bin/sh
# Demo stand-in for a BMC power cycle of the machine at $1 (no BMC here): the demo program
# plays the hardware; this asks it to cut and restore power and waits for the power-on.
set -eu
power="@POWER@"
rm -f "$power/$1.on"
echo "power cycle" > "$power/$1.cycle"
i=0
while [ ! -e "$power/$1.on" ]; do
  [ -d "$power" ] || exit 1
  i=$((i + 1))
  if [ "$i" -gt 200 ]; then echo "no power-on of $1 within 20 s" >&2; exit 1; fi
  sleep 0.1
done
cat "$power/$1.on"
"#;
