#!/usr/bin/env bash
# A one-node Slurm cluster on loopback, to run desloc under Slurm on one machine (the Slurm
# test, and users trying the sbatch example before their cluster): munged, slurmctld and slurmd
# from Debian's packages (munge, slurmctld, slurmd, slurm-client), every file of theirs in DIR,
# nothing of the system's touched. Needs root (slurmd runs the jobs' tasks).
#
#   scripts/slurm_local.sh up DIR [--cpus N]   start it; then `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm_local.sh down DIR            stop what `up` started in DIR
#   scripts/slurm_local.sh status DIR          sinfo, or why not
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 2 ]] || { usage >&2; exit 2; }
cmd=$1
dir=$(realpath -m "$2")
shift 2
cpus=8
while [[ $# -gt 0 ]]; do
  case $1 in
    --cpus) cpus=$2; shift 2 ;;
    *) echo "slurm_local: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
node=desloc-local
# slurmctld runs only where SlurmctldHost names this host.
host=$(hostname -s)

stop() {  # pid file, name
  [[ -f $1 ]] || return 0
  local pid
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

case $cmd in
  up)
    for p in munged slurmctld slurmd srun sinfo; do
      command -v "$p" >/dev/null || [[ -x /usr/sbin/$p ]] ||
        { echo "slurm_local: $p not found; install munge slurmctld slurmd slurm-client" >&2; exit 1; }
    done
    [[ $(id -u) -eq 0 ]] || { echo "slurm_local: needs root (slurmd runs the tasks)" >&2; exit 1; }
    # slurmd puts Unix sockets in its spool directory, and a socket path has 108 bytes.
    if ((${#dir} > 60)); then
      echo "slurm_local: '$dir' is too long for slurmd's sockets; use a directory of at most 60 characters (e.g. mktemp -d /tmp/slurm.XXXXXX)" >&2
      exit 2
    fi
    mkdir -p "$dir"/{state,spool,log}
    chmod 755 "$dir"  # munged needs every client to reach its socket here
    # munge: a fresh key, its own socket (AuthInfo points Slurm at it).
    head -c 1024 /dev/urandom >"$dir/munge.key"
    chmod 400 "$dir/munge.key"
    # The daemons detach; none keeps the caller's output open.
    /usr/sbin/munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
      --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
      --seed-file="$dir/munge.seed" </dev/null >/dev/null 2>&1
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm_local.sh: one node on loopback.
ClusterName=desloc-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    export SLURM_CONF=$dir/slurm.conf
    /usr/sbin/slurmctld -i -f "$dir/slurm.conf" </dev/null >/dev/null 2>&1
    /usr/sbin/slurmd -f "$dir/slurm.conf" -N "$node" </dev/null >/dev/null 2>&1
    for _ in $(seq 1 60); do
      if timeout 3 sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "slurm_local: up in $dir; export SLURM_CONF=$dir/slurm.conf"
        exit 0
      fi
      sleep 0.2
    done
    echo "slurm_local: the node did not come up within 60 s; logs in $dir/log:" >&2
    tail -n 20 "$dir"/log/*.log >&2 || true
    "$0" down "$dir"
    exit 1
    ;;
  down)
    stop "$dir/slurmd.pid"
    stop "$dir/slurmctld.pid"
    stop "$dir/munged.pid"
    echo "slurm_local: stopped $dir"
    ;;
  status)
    SLURM_CONF=$dir/slurm.conf timeout 10 sinfo -N
    ;;
  *) usage >&2; exit 2 ;;
esac
