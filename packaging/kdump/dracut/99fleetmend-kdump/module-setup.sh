#!/bin/bash
# dracut module "fleetmend-kdump": puts node-agent, its TLS files, the settings in
# /etc/fleetmend/kdump-notify.env and the fleetmend-kdump-notify programs into an
# initramfs, for kexec-tools' kdump_pre/kdump_post (see packaging/kdump/README.md).
# Only included when asked for: `dracut_args --add fleetmend-kdump` in /etc/kdump.conf.

FLEETMEND_ENV=${FLEETMEND_KDUMP_ENV:-/etc/fleetmend/kdump-notify.env}
FLEETMEND_LIB=/usr/lib/fleetmend/kdump

# called by dracut
check() {
    require_binaries /usr/bin/node-agent || return 1
    [[ -r $FLEETMEND_ENV ]] || {
        derror "fleetmend-kdump: $FLEETMEND_ENV is missing (see kdump-notify.env.example)"
        return 1
    }
    # Only when asked for.
    return 255
}

# called by dracut: the notice needs the network up in the kdump environment.
depends() {
    echo network
    return 0
}

# called by dracut
install() {
    local FLEETMEND_AGENT_COORDINATOR FLEETMEND_AGENT_SERVER_NAME FLEETMEND_KDUMP_TIMEOUT
    local FLEETMEND_AGENT_CA FLEETMEND_AGENT_CERT FLEETMEND_AGENT_KEY f
    # shellcheck disable=SC1090
    . "$FLEETMEND_ENV"
    inst_binary /usr/bin/node-agent
    inst_simple "$FLEETMEND_ENV"
    for f in "$FLEETMEND_AGENT_CA" "$FLEETMEND_AGENT_CERT" "$FLEETMEND_AGENT_KEY"; do
        if [[ ! -r $f ]]; then
            dfatal "fleetmend-kdump: $f (named in $FLEETMEND_ENV) is not readable"
            return 1
        fi
        inst_simple "$f"
    done
    inst_script "$FLEETMEND_LIB/fleetmend-kdump-notify" "$FLEETMEND_LIB/fleetmend-kdump-notify"
    inst_script "$FLEETMEND_LIB/fleetmend-kdump-start" "$FLEETMEND_LIB/fleetmend-kdump-start"
    inst_script "$FLEETMEND_LIB/fleetmend-kdump-done" "$FLEETMEND_LIB/fleetmend-kdump-done"
    # The dump kernel's network comes up only when something needs it.
    mkdir -p "${initdir}/etc/cmdline.d"
    echo "rd.neednet=1" >"${initdir}/etc/cmdline.d/90fleetmend-kdump.conf"
}
