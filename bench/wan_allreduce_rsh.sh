#!/usr/bin/env bash
# mpirun's remote-shell agent on the shaped test bed (--mca plm_rsh_agent): a "host" is a site of
# bed $WAN_ALLREDUCE_BED, and the command runs inside that site's network namespace through
# `netbed.sh exec`, where ssh would run it on a remote machine. Set by bench_wan_allreduce.sh.
set -euo pipefail
: "${WAN_ALLREDUCE_NETBED:?set by bench_wan_allreduce.sh: path to scripts/netbed.sh}"
: "${WAN_ALLREDUCE_BED:?set by bench_wan_allreduce.sh: the bed name}"
# ssh-style options (Open MPI may pass -x) mean nothing here.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
[[ $# -ge 2 ]] || { echo "wan_allreduce_rsh: usage: $0 [-opts] SITE COMMAND..." >&2; exit 2; }
site=$1; shift
# Like ssh: the remaining words form one shell command line (Open MPI sends "PATH=...; orted ...").
exec "$WAN_ALLREDUCE_NETBED" exec --name "$WAN_ALLREDUCE_BED" --site "$site" -- /bin/sh -c "$*"
