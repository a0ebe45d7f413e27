#!/usr/bin/env bash
# A Slurm cluster on this machine for the Slurm executor's tests: munge, one
# slurmctld and two simulated nodes (`slurmd -N n1`, `slurmd -N n2`) that
# share this host, from Debian's packages (slurmctld slurmd slurm-client
# munge), started directly (no systemd).
#
#   scripts/slurm-local.sh up       start what is not running; wait until both nodes run a job
#   scripts/slurm-local.sh down     stop exactly the daemons `up` started (by their pid files)
#   scripts/slurm-local.sh status   what runs, and the nodes as Slurm sees them
#   scripts/slurm-local.sh env      the line to eval for the client commands (SLURM_CONF=...)
#
# Everything lives in a private state directory (0700):
# $SUBAGENTS_SLURM_DIR, default /var/tmp/subagents-slurm. Client commands
# find the cluster with SLURM_CONF=$dir/slurm.conf. Must run as root (the
# daemons run as root, munged as user munge).
#
# Process tracking is proctrack/cgroup (cgroup v1 here: CgroupPlugin=cgroup/v1;
# on a cgroup-v2 host without systemd IgnoreSystemd=yes is added), so that a
# job's end means its processes are gone. Set SUBAGENTS_SLURM_PROCTRACK=linuxproc
# only to try a host without usable cgroups: the executor refuses to submit to
# such a cluster unless SUBAGENTS_SLURM_ALLOW_LINUXPROC=1 (docs/cluster.md).
set -euo pipefail

dir=${SUBAGENTS_SLURM_DIR:-/var/tmp/subagents-slurm}
ctld_port=${SUBAGENTS_SLURM_CTLD_PORT:-6817}
node_ports=(${SUBAGENTS_SLURM_NODE_PORTS:-6818 6819})
nodes=(n1 n2)
proctrack=${SUBAGENTS_SLURM_PROCTRACK:-cgroup}
ready_deadline=${SUBAGENTS_SLURM_READY_SECONDS:-60}
host=$(hostname -s)
export SLURM_CONF="$dir/slurm.conf"

die() { echo "slurm-local: $*" >&2; exit 1; }
say() { echo "slurm-local: $*"; }

# The pid in FILE if it names a live process whose command is NAME (a
# recycled pid of another program is not ours).
live_pid() {
    local file=$1 name=$2 pid
    [ -f "$file" ] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [ -n "$pid" ] && [ "$pid" -gt 1 ] || return 1
    [ -r "/proc/$pid/comm" ] || return 1
    case "$(cat "/proc/$pid/comm")" in
        "$name"*) echo "$pid" ;;
        *) return 1 ;;
    esac
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if live_pid "$dir/munged.pid" munged >/dev/null; then return; fi
    if munge_works; then
        say "munge: a munged we did not start answers; using it"
        return
    fi
    [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key (is the munge package installed?)"
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    local deadline=$((SECONDS + 10))
    until munge_works; do
        [ $SECONDS -lt $deadline ] || die "munged did not answer within 10 s"
        sleep 0.1
    done
    # Our own copy: `down` stops it only if this file says we started it.
    cp /run/munge/munged.pid "$dir/munged.pid"
    say "munge: started (pid $(cat "$dir/munged.pid"))"
}

cgroup_conf() {
    if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
        printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n'
    else
        printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n'
    fi
    printf 'ConstrainCores=no\nConstrainRAMSpace=no\n'
}

write_config() {
    local cpus i
    cpus=$(nproc)
    {
        echo "ClusterName=subagents-local"
        echo "SlurmctldHost=$host"
        echo "SlurmctldPort=$ctld_port"
        echo "SlurmUser=root"
        echo "AuthType=auth/munge"
        echo "StateSaveLocation=$dir/state"
        echo "SlurmdSpoolDir=$dir/spool/%n"
        echo "SlurmctldPidFile=$dir/slurmctld.pid"
        echo "SlurmdPidFile=$dir/slurmd-%n.pid"
        echo "SlurmctldLogFile=$dir/log/slurmctld.log"
        echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/$proctrack"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "ReturnToService=2"
        echo "JobCompType=jobcomp/filetxt"
        echo "JobCompLoc=$dir/jobcomp.txt"
        echo "AccountingStorageType=accounting_storage/none"
        echo "MinJobAge=300"
        echo "KillWait=5"
        echo "SlurmdTimeout=30"
        for i in "${!nodes[@]}"; do
            echo "NodeName=${nodes[$i]} NodeHostname=$host Port=${node_ports[$i]} CPUs=$cpus RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$dir/slurm.conf.new"
    mv "$dir/slurm.conf.new" "$dir/slurm.conf"
    cgroup_conf >"$dir/cgroup.conf.new"
    mv "$dir/cgroup.conf.new" "$dir/cgroup.conf"
    chmod 0644 "$dir/slurm.conf" "$dir/cgroup.conf"
}

start_daemons() {
    local n
    if live_pid "$dir/slurmctld.pid" slurmctld >/dev/null; then
        say "slurmctld: running"
    else
        /usr/sbin/slurmctld -f "$SLURM_CONF"
        say "slurmctld: started"
    fi
    for n in "${nodes[@]}"; do
        mkdir -p "$dir/spool/$n"
        if live_pid "$dir/slurmd-$n.pid" slurmd >/dev/null; then
            say "slurmd $n: running"
        else
            /usr/sbin/slurmd -f "$SLURM_CONF" -N "$n"
            say "slurmd $n: started"
        fi
    done
}

# Both nodes idle and each has run a job (sinfo alone may show a state
# restored from disk).
wait_ready() {
    local deadline=$((SECONDS + ready_deadline)) n states
    while :; do
        states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
        if [ "$(echo "$states" | grep -c ' idle$' || true)" -eq "${#nodes[@]}" ]; then break; fi
        [ $SECONDS -lt $deadline ] || die "nodes not idle within ${ready_deadline} s: $(echo $states)"
        # A node restored DOWN from an earlier state comes back on request.
        for n in "${nodes[@]}"; do
            if echo "$states" | grep -Eq "^$n (down|drain|unk)"; then
                scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
            fi
        done
        sleep 0.2
    done
    for n in "${nodes[@]}"; do
        timeout $((deadline - SECONDS > 5 ? deadline - SECONDS : 5)) \
            srun -w "$n" -N1 -n1 -t 1 true || die "node $n did not run a job"
    done
    say "ready: ${nodes[*]} (SLURM_CONF=$SLURM_CONF)"
}

up() {
    [ "$(id -u)" -eq 0 ] || die "must run as root"
    command -v slurmctld >/dev/null || die "slurmctld is not installed (apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge)"
    install -d -m 0700 "$dir"
    install -d -m 0700 "$dir/state" "$dir/spool" "$dir/log"
    start_munge
    write_config
    start_daemons
    wait_ready
}

# TERM, then KILL after a deadline, the process named by FILE (if ours).
stop_pidfile() {
    local file=$1 name=$2 pid deadline
    if ! pid=$(live_pid "$file" "$name"); then
        rm -f "$file"
        return
    fi
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while [ -d "/proc/$pid" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if [ -d "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$file"
    say "$name: stopped (pid $pid)"
}

down() {
    [ -d "$dir" ] || { say "nothing to stop ($dir does not exist)"; return; }
    local n
    for n in "${nodes[@]}"; do stop_pidfile "$dir/slurmd-$n.pid" slurmd; done
    stop_pidfile "$dir/slurmctld.pid" slurmctld
    stop_pidfile "$dir/munged.pid" munged
}

status() {
    local n pid
    for f in slurmctld:slurmctld slurmd:slurmd-n1 slurmd:slurmd-n2 munged:munged; do
        name=${f%%:*}
        file=$dir/${f#*:}.pid
        if pid=$(live_pid "$file" "$name"); then
            echo "${f#*:}: running (pid $pid)"
        else
            echo "${f#*:}: not running"
        fi
    done
    if [ -f "$SLURM_CONF" ]; then
        sinfo -h -N -o '%N %t' 2>/dev/null || echo "sinfo: no answer"
        grep '^ProctrackType' "$SLURM_CONF"
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
