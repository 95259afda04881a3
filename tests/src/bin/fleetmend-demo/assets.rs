//! What the demo writes for the programs it starts: the coordinator's repair procedures and
//! remediation settings, the simulated BMCs' chassis control, and the shell scripts standing
//! in for systemd (and, without `ipmi_sim`, for a BMC).

/// The repair procedures of machine type `demo`: CKE's format, Fleetmend's built-ins.
pub(super) const REPAIR_YAML: &str = r#"repair:
  max_concurrent_repairs: 2
  repair_procedures:
    - machine_types: ["demo"]
      repair_operations:
        - operation: "unhealthy"
          repair_steps:
            - repair_command: ["@restart-unit", "kubelet"]
              command_timeout_seconds: 60
              watch_seconds: 30
          health_check_command: ["@agent-healthy"]
          command_timeout_seconds: 10
        - operation: "unreachable"
          repair_steps:
@DEAD_MACHINE_STEPS@
          health_check_command: ["@agent-healthy"]
          command_timeout_seconds: 10
"#;

/// The dead machine's repair steps through the bmc-gateway: each built-in with its
/// `watch_seconds` (how long the `@agent-healthy` check is polled after the step). `@fence`
/// runs the fence flow: power off, confirm off, release the workload with the
/// out-of-service taint, wait until its pods and VolumeAttachments are gone, power on, wait
/// for the node and its agent, remove the taint.
pub(super) const DEAD_MACHINE_BUILTINS: &[(&str, u32)] = &[("@fence", 60)];

/// The dead machine's repair steps in YAML: the built-ins through the gateway, or (`None`:
/// no `ipmi_sim`) the stand-in script at `stand_in`.
pub(super) fn dead_machine_steps(stand_in: Option<&str>) -> String {
    let step = |cmd: &str, watch: u32| {
        format!(
            "            - repair_command: [{cmd:?}]\n              command_timeout_seconds: 30\n              watch_seconds: {watch}\n"
        )
    };
    match stand_in {
        Some(script) => step(script, 30),
        None => DEAD_MACHINE_BUILTINS
            .iter()
            .map(|(b, watch)| step(b, *watch))
            .collect(),
    }
    .trim_end()
    .to_string()
}

/// Automatic remediation, with the production defaults except where the demo's compressed
/// time or its small fleet needs otherwise.
pub(super) const REMEDIATION: &str = r#"[remediation]
# A pass every 500 ms and Leases stale after 3 s: production's 10 s and 20 s, compressed.
interval = "500ms"
lease_stale = "3s"
# The demo machines report a loaded crash kernel, as real servers do; a silent one waits this
# long for its kdump initramfs to say "dumping" before it counts as dead (production: 1 min).
kdump_wait = "2s"

[remediation.auto_repair]
# A failing kubelet is repaired once it has failed for 2 s (production: 30 s, so that one
# slow healthz answer is not taken for a hung kubelet).
unhealthy_for = "2s"

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

/// `chassis_control` of every simulated BMC: `ipmi_sim` runs it as `SCRIPT 0x20 get|set
/// PARAM [VALUE]…`. It keeps the machine's power in `./power` and appends each change to
/// `./events` with its time, which the demo reads to stop or boot the machine.
pub(super) const CHASSIS_CONTROL: &str = r#"#!/bin/sh
# chassis_control for one demo BMC (ipmi_sim): "get power" prints power:0|1 from ./power;
# "set power V", "set reset V", "set shutdown V" change it and log "<unix time> <param> <value>"
# to ./events, where the demo program reads them and plays the machine's hardware.
dir=$(dirname "$0")
state="$dir/power"
[ -f "$state" ] || echo 1 > "$state"
shift
op=$1
shift
case "$op" in
get)
  for p in "$@"; do
    case "$p" in
      power) echo "power:$(cat "$state")" ;;
      boot) echo "boot:default" ;;
    esac
  done
  ;;
set)
  while [ $# -gt 1 ]; do
    p=$1; v=$2; shift 2
    case "$p" in
      power) echo "$v" > "$state" ;;
      shutdown) echo 0 > "$state" ;;
      reset) ;;
      *) continue ;;
    esac
    echo "$(date +%s.%N) $p $v" >> "$dir/events"
  done
  ;;
esac
exit 0
"#;

/// Stand-in for a BMC power cycle (used only without `ipmi_sim`): asks the demo's simulated hardware
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
