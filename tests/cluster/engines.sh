#!/usr/bin/env bash
# Real cluster engines for the cluster suite (tests/cluster): a SLURM cluster of two nodes on this one host, plus
# Open MPI and MPICH, every daemon bound to 127.0.0.1. No systemd: the daemons are started directly.
#
#   tests/cluster/engines.sh install   # Debian packages (root): slurmctld slurmd slurm-client munge openmpi-bin mpich
#   tests/cluster/engines.sh start     # munged, slurmctld and one slurmd per node; waits (bounded) until jobs run.
#                                      # Prints "started" (stdout) when it started them, "running" when SLURM was
#                                      # ready already (then it changes nothing: other users' jobs keep running)
#   tests/cluster/engines.sh stop      # cancels the cluster's jobs, stops the SLURM daemons this script started
#                                      # (by their pid files) and munged only when this script started it
#   tests/cluster/engines.sh status    # prints "ready" and exits 0 when a one-task-per-node srun succeeds
#
# start and stop hold a lock (/tmp/trainplan-engines.lock), so two callers never start or stop the daemons at once.
#
# Settings (environment): ENGINES_DIR (state, logs, pid files; default /tmp/trainplan-engines), ENGINES_CPUS (CPUs per
# node, default 4: more than this machine has, accepted through config_overrides), ENGINES_TASK_PLUGIN (task/affinity,
# so CPU binding is real; task/none to switch it off).
#
# With task/affinity and more CPUs than the host has, a step whose allocation lands on CPUs the host lacks (other jobs
# hold the low ones) can fail to launch: "Unable to layout tasks on given cpus" ("only 1 bits in avail_map for 2
# tasks" in slurmd's log). Nothing of the job has run then; the cluster suite starts such a scenario again.
#
# Two nodes on one host need two names that resolve to 127.0.0.1 (Debian's slurmd is built without
# --enable-multiple-slurmd, so each node has its own NodeHostname, its own port, and `slurmd -N name`). The names are
# tpnode1 and tpnode2; `install` adds them to /etc/hosts when they do not resolve.
set -euo pipefail

DIR=${ENGINES_DIR:-/tmp/trainplan-engines}
CPUS=${ENGINES_CPUS:-4}
TASK_PLUGIN=${ENGINES_TASK_PLUGIN:-task/affinity}
NODES=(tpnode1 tpnode2)
PORTS=(16818 16819)
CTLD_PORT=16817
CONF=/etc/slurm/slurm.conf

log() { printf 'engines: %s\n' "$*" >&2; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v srun >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    command -v mpirun.openmpi >/dev/null || missing+=(openmpi-bin)
    command -v mpiexec.hydra >/dev/null || missing+=(mpich)
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        timeout 600 apt-get update -q >/dev/null
        timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    fi
    for node in "${NODES[@]}"; do
        if ! getent hosts "$node" >/dev/null; then
            echo "127.0.0.1 $node" >>/etc/hosts
        fi
    done
}

write_config() {
    mkdir -p "$DIR/ctld" "$DIR/log" /etc/slurm
    local node port i
    for i in "${!NODES[@]}"; do mkdir -p "$DIR/${NODES[$i]}"; done
    chown -R slurm:slurm "$DIR/ctld" 2>/dev/null || true
    {
        echo "# Written by tests/cluster/engines.sh: two nodes on one host, loopback only."
        echo "ClusterName=trainplan"
        echo "SlurmctldHost=localhost(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
        echo "AuthType=auth/munge"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$DIR/ctld"
        echo "SlurmdSpoolDir=$DIR/%n"
        echo "SlurmctldPidFile=$DIR/slurmctld.pid"
        echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
        echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
        echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=$TASK_PLUGIN"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SlurmdParameters=config_overrides"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/backfill"
        echo "JobCompType=jobcomp/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "InactiveLimit=0"
        echo "KillWait=5"
        echo "MinJobAge=60"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=30"
        echo "Waittime=0"
        echo "KillOnBadExit=0"
        for i in "${!NODES[@]}"; do
            node=${NODES[$i]}
            port=${PORTS[$i]}
            echo "NodeName=$node NodeHostname=$node NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    } >"$CONF"
}

munge_running() {
    local pid
    [ -S /run/munge/munge.socket.2 ] && [ -s /run/munge/munged.pid ] || return 1
    pid=$(cat /run/munge/munged.pid)
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]
}

start_munge() {
    if munge_running; then return; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    runuser -u munge -- munged 9>&-  # the daemons never hold the start/stop lock (fd 9)
    echo munged >>"$DIR/started"  # stop ends munged only when this script started it
}

ready() {
    # Every node responding (idle, or running jobs: mix, alloc, completing; a trailing * means not responding), and
    # a step on every node launches (slurmctld may report the states it saved before a restart). A step that
    # task/affinity cannot lay out ("Unable to layout tasks on given cpus": other jobs hold CPUs 0-1 and this one
    # got CPUs this host does not have, see ENGINES_CPUS) still proves the daemons answer.
    local nodes=${#NODES[@]} said
    [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc|comp)$')" = "$nodes" ] || return 1
    said=$(timeout 20 srun --oversubscribe -N"$nodes" --ntasks-per-node=1 true 2>&1) && return 0
    grep -q 'Unable to layout tasks' <<<"$said"
}

daemons_alive() {  # slurmctld or a slurmd of this script's pid files is running
    local pidfile
    for pidfile in "$DIR"/slurmctld.pid "$DIR"/slurmd-*.pid; do
        [ -f "$pidfile" ] && alive "$(cat "$pidfile")" && return 0
    done
    return 1
}

lock() {
    exec 9>/tmp/trainplan-engines.lock
    flock -w 180 9 || { log "another engines.sh start/stop held the lock for 180 s"; exit 1; }
}

start() {
    install_packages
    lock
    if ready; then
        log "SLURM is ready already: nothing started"
        echo running
        return
    fi
    if daemons_alive; then
        # Someone's daemons (other users may share them): never restarted under them. Wait for them, bounded.
        local waited=$((SECONDS + 60))
        until ready; do
            if ((SECONDS > waited)); then
                log "the SLURM daemons run but are not ready after 60 s; not restarting them (engines.sh stop first)"
                sinfo -N >&2 || true
                exit 1
            fi
            sleep 0.5
        done
        log "SLURM daemons were running: nothing started"
        echo running
        return
    fi
    stop_daemons >/dev/null 2>&1 || true
    write_config
    start_munge
    slurmctld -c -i 9>&-
    local node
    for node in "${NODES[@]}"; do slurmd -N "$node" 9>&-; done
    local deadline=$((SECONDS + 60))
    until ready; do
        if ((SECONDS > deadline)); then
            log "SLURM did not become ready within 60 s; logs in $DIR/log"
            sinfo -N >&2 || true
            tail -n 20 "$DIR"/log/*.log >&2 || true
            exit 1
        fi
        sleep 0.3
    done
    echo slurm >>"$DIR/started"
    log "SLURM ready: ${NODES[*]} (slurmctld on 127.0.0.1:$CTLD_PORT)"
    echo started
}

alive() {  # any of these pids still running
    local pid
    for pid in "$@"; do [ -d "/proc/$pid" ] && return 0; done
    return 1
}

stop_daemons() {
    # The cluster's jobs first (their slurmstepd end with them), bounded; then the daemons of the pid files.
    if [ -f "$DIR/slurmctld.pid" ] && alive "$(cat "$DIR/slurmctld.pid")"; then
        timeout 10 scancel --quiet --partition=debug 2>/dev/null || true
        local deadline=$((SECONDS + 15))
        while [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && ((SECONDS < deadline)); do sleep 0.3; done
    fi
    local pidfile pids=()
    for pidfile in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do
        [ -f "$pidfile" ] || continue
        pids+=("$(cat "$pidfile")")
    done
    if ((${#pids[@]})); then
        kill "${pids[@]}" 2>/dev/null || true
        local deadline=$((SECONDS + 15))
        while alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.2; done
        local pid
        for pid in "${pids[@]}"; do
            if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
        done
    fi
    if grep -qx munged "$DIR/started" 2>/dev/null && [ -s /run/munge/munged.pid ]; then
        kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    fi
    rm -rf "$DIR"
}

stop() {
    lock
    stop_daemons
}

case "${1:-}" in
    install) install_packages ;;
    start) start ;;
    stop) stop ;;
    status) if ready; then echo ready; else echo "not ready"; exit 1; fi ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
