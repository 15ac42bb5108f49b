#!/usr/bin/env bash
# netbed: many shaped "sites" on one machine. One network namespace per site, all joined by a
# bridge namespace, with per-destination bandwidth shaping on each site's egress (htb + u32, or
# tbf for a single link). Design and measured goodput: docs/netbed.md.
set -Eeuo pipefail

readonly kPrefix=nb                 # every namespace is nb-<bed>-..., every device nb-<bed>-...
readonly kDefaultSubnet=10.77.0     # a /24 that exists only inside the bed's namespaces
readonly kHtbQuantum=60000          # bytes; DESIGN.md "Facts measured on this machine kind"
readonly kBurst=64k                 # bytes (tc "k" = 1024 bytes)
readonly kTbfLatency=100ms          # tbf queue bound at the configured rate
readonly kMaxSites=99               # device names carry the site index in two digits

prog=$(basename "$0")

usage() {
  cat <<EOF
usage:
  $prog up     --name BED --sites A,B[,C...] [--rate A-B=100mbit,A>C=1gbit,...]
               [--default-rate 1gbit] [--shaper htb|tbf] [--subnet 10.77.0.0/24]
               [--rtt A-B=40ms,A>C=10ms,...] [--jitter A-B=1ms,...] [--loss A-B=0.1%,...]
               [--tcp-buffer BYTES] [--no-slow-start-after-idle] [--congestion CC]
  $prog rate   --name BED --rate A-B=10mbit,A>C=1gbit,...
  $prog down   --name BED
  $prog status [--name BED]
  $prog env    --name BED --site A
  $prog exec   --name BED --site A -- CMD [ARGS...]

  BED    1-8 chars [a-z0-9], starting with a letter (names nb-BED-*, fits IFNAMSIZ 15).
  SITE   1-16 chars [A-Za-z0-9_], starting with a letter; at most $kMaxSites sites.
  --rate A-B=R shapes both directions of the pair, A>B=R only A to B. Pairs left out get
         --default-rate (default 1gbit). R is a tc rate: <number>(bit|kbit|mbit|gbit).
  --shaper htb (default): one htb class per destination, u32 filter on the destination IP.
           tbf: one token bucket per site egress; needs every site's destinations at one rate
           (e.g. two sites: a single link).
  --rtt A-B=T adds a round trip T to the pair, half in each direction; A>B=T delays only A to B
         by T (one way). --jitter A-B=T adds normal noise of sigma T to each direction's delay
         (packets are never reordered); --loss A-B=P drops P (e.g. 0.1%) of each direction's
         packets. T: <number>(us|ms|s). The delays are held by desloc-netdelay (built with the
         project; \$NETBED_NETDELAY, else build/src/, else PATH) at the receiving site's INPUT
         hook through an iptables NFQUEUE rule, one queue per sending site (docs/netbed.md).
  --tcp-buffer BYTES sets the largest TCP send and receive buffer of every site (the third field
         of net.ipv4.tcp_wmem and tcp_rmem in its namespace); without it a site has Linux's
         defaults (send 4 MiB here), which cap a link's throughput at BYTES / round trip.
  --no-slow-start-after-idle sets net.ipv4.tcp_slow_start_after_idle=0 in every site: a
         connection idle for a retransmission timeout keeps its congestion window instead of
         restarting from the initial one (Linux's default is 1; docs/transport.md).
  --congestion CC sets net.ipv4.tcp_congestion_control=CC (e.g. cubic, bbr) in every site;
         without it a site inherits the host's. A namespace may only choose what the host lists
         in net.ipv4.tcp_allowed_congestion_control (docs/transport.md: bbr's ProbeRTT).
  rate changes the given links' rates while the bed is up (and jobs run on it): a live
         throttle or its restoration. htb beds only.
Runs as root. 'up' removes everything it made if it fails; 'down' is idempotent and also
terminates processes still running inside the bed's namespaces.
EOF
}

die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }

# ---- names ----------------------------------------------------------------------------------
ns_bridge() { echo "$kPrefix-$1-bridge"; }       # $1 = bed
ns_site() { echo "$kPrefix-$1-s-$2"; }           # $1 = bed, $2 = site
dev_site() { echo "$kPrefix-$1-s$2"; }           # site end of the veth; $2 = site index
dev_bridge() { echo "$kPrefix-$1-b$2"; }         # bridge end of the veth

valid_bed() { [[ $1 =~ ^[a-z][a-z0-9]{0,7}$ ]]; }
valid_site() { [[ $1 =~ ^[A-Za-z][A-Za-z0-9_]{0,15}$ ]]; }
valid_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]]; }

# tc rate -> bit/s (integer), for the tbf check and for status.
rate_bits() {
  local r=$1 num unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([a-z]+)$ ]] || die "bad rate '$r'"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  case $unit in
    bit) awk -v n="$num" 'BEGIN { printf "%.0f", n }' ;;
    kbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e3 }' ;;
    mbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e6 }' ;;
    gbit) awk -v n="$num" 'BEGIN { printf "%.0f", n * 1e9 }' ;;
    *) die "bad rate unit in '$r'" ;;
  esac
}

valid_duration() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]]; }
valid_loss() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?%$ ]] && awk -v p="${1%\%}" 'BEGIN { exit !(p < 100) }'; }

# A duration -> microseconds (a decimal), times $2 (default 1).
duration_us() {
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "bad duration '$1'"
  local scale=1
  case ${BASH_REMATCH[3]} in ms) scale=1000 ;; s) scale=1000000 ;; esac
  awk -v n="${BASH_REMATCH[1]}" -v s="$scale" -v f="${2:-1}" 'BEGIN { printf "%.3f", n * s * f }'
}

# Parses a pair list "A-B=V,A>C=V" of option $1 (text $2) into the associative array named $5,
# keyed "src>dst": A-B sets both directions, A>B one. $3 validates a value, $4 describes one;
# $6 "halve" stores V/2 for an A-B pair (a round trip split over its two directions) and V for
# A>B, in microseconds. Uses the caller's sites_csv and index[].
# shellcheck disable=SC2034  # out is a nameref: the caller reads what is stored through it
parse_pairs() {
  local opt=$1 csv=$2 check=$3 want=$4 how=$6 item lhs v one both
  local -a items
  local -n out=$5
  local -A seen=()
  [[ -n $csv ]] || return 0
  IFS=, read -r -a items <<<"$csv"
  for item in "${items[@]}"; do
    [[ $item =~ ^([^=]+)=(.*)$ ]] || die "up: bad $opt entry '$item' (want A-B=V or A>B=V)"
    lhs=${BASH_REMATCH[1]}; v=${BASH_REMATCH[2]}
    "$check" "$v" || die "up: bad ${opt#--} '$v' in '$item' (want $want)"
    [[ $lhs =~ ^([^->]+)([->])([^->]+)$ ]] || die "up: bad pair '$lhs' in $opt '$item' (want A-B or A>B)"
    local a=${BASH_REMATCH[1]} sep=${BASH_REMATCH[2]} b=${BASH_REMATCH[3]}
    [[ -n ${index[$a]:-} ]] || die "up: unknown site '$a' in $opt '$item' (sites: $sites_csv)"
    [[ -n ${index[$b]:-} ]] || die "up: unknown site '$b' in $opt '$item' (sites: $sites_csv)"
    [[ $a != "$b" ]] || die "up: $opt '$item' links a site to itself"
    one=$v; both=$v
    if [[ $how == halve ]]; then one=$(duration_us "$v"); both=$(duration_us "$v" 0.5); fi
    [[ -z ${seen[$a>$b]:-} ]] || die "up: $opt for $a>$b given twice"
    seen[$a>$b]=1
    if [[ $sep == - ]]; then
      [[ -z ${seen[$b>$a]:-} ]] || die "up: $opt for $b>$a given twice"
      seen[$b>$a]=1
      out["$a>$b"]=$both; out["$b>$a"]=$both
    else
      out["$a>$b"]=$one
    fi
  done
}

# The delay program: $NETBED_NETDELAY, the build next to this script, or PATH.
find_netdelay() {
  local here candidate
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  for candidate in "${NETBED_NETDELAY:-}" "$here/../build/src/desloc-netdelay" "$(command -v desloc-netdelay || true)"; do
    if [[ -n $candidate && -x $candidate ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

require_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN); uid is $(id -u)"
}

require_netns() {
  command -v ip >/dev/null 2>&1 || die "'ip' (iproute2) not found; install iproute2"
  ip netns list >/dev/null 2>&1 || die "'ip netns' is unavailable here (no network namespace support?)"
}

bed_namespaces() {  # every namespace of bed $1, one per line
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$kPrefix-$1-(bridge|s-.+)$" || true
}

# Sites of bed $1 as "index site address device" lines, sorted by index; read from the live
# namespaces so there is no state file to go stale.
bed_sites() {
  local bed=$1 ns site dev addr
  while read -r ns; do
    [[ $ns == "$kPrefix-$bed-s-"* ]] || continue
    site=${ns#"$kPrefix-$bed-s-"}
    read -r dev addr < <(ip -n "$ns" -o -4 addr show 2>/dev/null |
      awk -v p="$kPrefix-$bed-s" 'index($2, p) == 1 { sub(/\/.*/, "", $4); print $2, $4; exit }') || true
    [[ -n ${dev:-} ]] || continue
    echo "${dev#"$kPrefix-$bed-s"} $site ${addr:-?} $dev"
    dev=; addr=
  done < <(bed_namespaces "$bed") | sort -n
}

# ---- up -------------------------------------------------------------------------------------
up_done=0
up_bed=
up_cleanup() {
  local rc=$?
  if [[ $up_done -ne 1 && -n $up_bed ]]; then
    say "'up' failed (exit $rc); removing everything bed '$up_bed' made"
    do_down "$up_bed" >/dev/null 2>&1 || true
    if [[ -n $(bed_namespaces "$up_bed") ]]; then
      say "warning: could not remove all of bed '$up_bed'; run: $prog down --name $up_bed"
    fi
  fi
  exit "$rc"
}

fail_point() {  # test hook: NETBED_FAIL_AT=<point> makes 'up' fail there (tests/netbed/)
  if [[ ${NETBED_FAIL_AT:-} == "$1" ]]; then
    say "NETBED_FAIL_AT=$1: failing on purpose"
    return 1
  fi
}

cmd_up() {
  local bed='' sites_csv='' rates_csv='' default_rate=1gbit shaper=htb subnet=$kDefaultSubnet
  local rtt_csv='' jitter_csv='' loss_csv='' tcp_buffer='' ssai=1 congestion=''
  while [[ $# -gt 0 ]]; do
    case $1 in
      --name) bed=${2:-}; shift 2 ;;
      --sites) sites_csv=${2:-}; shift 2 ;;
      --rate) rates_csv=${2:-}; shift 2 ;;
      --rtt) rtt_csv=${2:-}; shift 2 ;;
      --jitter) jitter_csv=${2:-}; shift 2 ;;
      --loss) loss_csv=${2:-}; shift 2 ;;
      --tcp-buffer) tcp_buffer=${2:-}; shift 2 ;;
      --no-slow-start-after-idle) ssai=0; shift ;;
      --congestion) congestion=${2:-}; shift 2 ;;
      --default-rate) default_rate=${2:-}; shift 2 ;;
      --shaper) shaper=${2:-}; shift 2 ;;
      --subnet)
        subnet=${2:-}
        [[ $subnet =~ ^(10\.[0-9]{1,3}\.[0-9]{1,3}|192\.168\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])\.[0-9]{1,3})(\.0/24)?$ ]] ||
          die "--subnet must be a private /24 such as 10.77.0.0/24, got '$subnet'"
        subnet=${BASH_REMATCH[1]}; shift 2 ;;
      *) die "up: unknown argument '$1' (see $prog --help)" ;;
    esac
  done

  # Validate everything before touching the system.
  valid_bed "$bed" || die "up: --name must be 1-8 chars [a-z0-9] starting with a letter, got '$bed'"
  [[ -n $sites_csv ]] || die "up: --sites is required"
  valid_rate "$default_rate" || die "up: bad --default-rate '$default_rate' (want e.g. 100mbit, 1gbit)"
  [[ -z $tcp_buffer || ($tcp_buffer =~ ^[0-9]+$ && $tcp_buffer -ge 65536 && $tcp_buffer -le 1073741824) ]] ||
    die "up: --tcp-buffer must be a byte count from 65536 to 1073741824, got '$tcp_buffer'"
  [[ $shaper == htb || $shaper == tbf ]] || die "up: --shaper must be htb or tbf, got '$shaper'"
  if [[ -n $congestion ]]; then
    local allowed
    allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null || true)
    [[ " $allowed " == *" $congestion "* ]] ||
      die "up: --congestion $congestion: a namespace may only choose what the host allows" \
        "(net.ipv4.tcp_allowed_congestion_control = '$allowed'; available:" \
        "'$(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null)'); allow it with:" \
        "sysctl -w net.ipv4.tcp_allowed_congestion_control='$allowed $congestion'"
  fi

  local -a sites
  local -A index=()
  IFS=, read -r -a sites <<<"$sites_csv"
  [[ ${#sites[@]} -ge 2 ]] || die "up: need at least 2 sites, got '$sites_csv'"
  [[ ${#sites[@]} -le $kMaxSites ]] || die "up: at most $kMaxSites sites"
  local i=0 s
  for s in "${sites[@]}"; do
    valid_site "$s" || die "up: bad site name '$s' (1-16 chars [A-Za-z0-9_], starting with a letter)"
    [[ -z ${index[$s]:-} ]] || die "up: site '$s' listed twice"
    i=$((i + 1)); index[$s]=$i
  done

  # rate[src>dst] for every ordered pair: explicit entries first, then the default.
  local -A rate=() delay=() jitter=() loss=()
  local a b r
  parse_pairs --rate "$rates_csv" valid_rate "<number>(bit|kbit|mbit|gbit), e.g. 300mbit" rate same
  parse_pairs --rtt "$rtt_csv" valid_duration "<number>(us|ms|s), e.g. 40ms" delay halve
  parse_pairs --jitter "$jitter_csv" valid_duration "<number>(us|ms|s), e.g. 1ms" jitter same
  parse_pairs --loss "$loss_csv" valid_loss "a percentage below 100, e.g. 0.1%" loss same
  for a in "${sites[@]}"; do
    for b in "${sites[@]}"; do
      [[ $a == "$b" ]] && continue
      [[ -n ${rate[$a>$b]:-} ]] || rate[$a>$b]=$default_rate
    done
  done
  if [[ $shaper == tbf ]]; then
    local first
    for a in "${sites[@]}"; do
      first=
      for b in "${sites[@]}"; do
        [[ $a == "$b" ]] && continue
        r=$(rate_bits "${rate[$a>$b]}")
        [[ -z $first || $first == "$r" ]] ||
          die "up: --shaper tbf shapes a site's whole egress, but $a has different rates per destination; use --shaper htb"
        first=$r
      done
    done
  fi

  require_root
  require_netns
  command -v tc >/dev/null 2>&1 || die "'tc' (iproute2) not found; install iproute2"
  local netdelay=''
  if [[ ${#delay[@]} -gt 0 || ${#jitter[@]} -gt 0 || ${#loss[@]} -gt 0 ]]; then
    netdelay=$(find_netdelay) ||
      die "up: --rtt, --jitter and --loss need desloc-netdelay: build the project (cmake --build build), or set NETBED_NETDELAY to its path"
    command -v iptables >/dev/null 2>&1 || die "up: --rtt, --jitter and --loss need iptables (Debian package iptables)"
  fi
  [[ -z $(bed_namespaces "$bed") ]] || die "up: bed '$bed' already exists; run: $prog down --name $bed"

  # From here on, anything that fails removes the whole bed.
  up_bed=$bed
  trap up_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'say "failed (line $LINENO): $BASH_COMMAND"' ERR

  local br s_ns dev bdev j
  br=$(ns_bridge "$bed")
  ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up

  for s in "${sites[@]}"; do
    i=${index[$s]}
    s_ns=$(ns_site "$bed" "$s"); dev=$(dev_site "$bed" "$i"); bdev=$(dev_bridge "$bed" "$i")
    ip netns add "$s_ns"
    ip -n "$s_ns" link set lo up
    # IPv6 off: no DAD or router solicitations on the shaped links, only the traffic under test.
    ip netns exec "$s_ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    if [[ -n $tcp_buffer ]]; then
      ip netns exec "$s_ns" sysctl -qw "net.ipv4.tcp_wmem=4096 16384 $tcp_buffer" "net.ipv4.tcp_rmem=4096 131072 $tcp_buffer"
    fi
    ip netns exec "$s_ns" sysctl -qw "net.ipv4.tcp_slow_start_after_idle=$ssai"
    if [[ -n $congestion ]]; then
      ip netns exec "$s_ns" sysctl -qw "net.ipv4.tcp_congestion_control=$congestion"
    fi
    ip link add name "$dev" netns "$s_ns" type veth peer name "$bdev" netns "$br"
    ip -n "$br" link set "$bdev" master br0 up
    ip -n "$s_ns" addr add "$subnet.$i/24" dev "$dev"
    ip -n "$s_ns" link set "$dev" alias "netbed $bed site $s"
    ip -n "$s_ns" link set "$dev" up
  done
  fail_point after-veth

  for a in "${sites[@]}"; do
    i=${index[$a]}
    s_ns=$(ns_site "$bed" "$a"); dev=$(dev_site "$bed" "$i")
    if [[ $shaper == tbf ]]; then
      for b in "${sites[@]}"; do
        if [[ $a != "$b" ]]; then r=${rate[$a>$b]}; fi
      done
      tc -n "$s_ns" qdisc add dev "$dev" root handle 1: tbf rate "$r" burst "$kBurst" latency "$kTbfLatency"
      continue
    fi
    # Unclassified traffic (ARP) goes to 1:ffff at the default rate; 1:<hex j> carries a->j.
    tc -n "$s_ns" qdisc add dev "$dev" root handle 1: htb default ffff
    tc -n "$s_ns" class add dev "$dev" parent 1: classid 1:ffff htb rate "$default_rate" ceil "$default_rate" \
      burst "$kBurst" cburst "$kBurst" quantum "$kHtbQuantum"
    for b in "${sites[@]}"; do
      [[ $a == "$b" ]] && continue
      j=${index[$b]}
      r=${rate[$a>$b]}
      tc -n "$s_ns" class add dev "$dev" parent 1: classid "1:$(printf %x "$j")" htb rate "$r" ceil "$r" \
        burst "$kBurst" cburst "$kBurst" quantum "$kHtbQuantum"
      tc -n "$s_ns" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
        match ip dst "$subnet.$j/32" flowid "1:$(printf %x "$j")"
    done
  done
  fail_point after-shaping

  # Delays, jitter and loss: at each receiving site b, one NFQUEUE per sending site a (queue
  # number = a's index), held by one desloc-netdelay in b's namespace. The program binds its
  # queues before the rules send packets to them, so no packet meets an unbound queue.
  local -a queues
  local log_dir="/run/netbed-$bed"
  for b in "${sites[@]}"; do
    queues=()
    for a in "${sites[@]}"; do
      [[ $a == "$b" ]] && continue
      [[ -n ${delay[$a>$b]:-}${jitter[$a>$b]:-}${loss[$a>$b]:-} ]] || continue
      queues+=("--queue" "${index[$a]}=${delay[$a>$b]:-0}us/${jitter[$a>$b]:-0}/${loss[$a>$b]:-0%}")
    done
    [[ ${#queues[@]} -gt 0 ]] || continue
    s_ns=$(ns_site "$bed" "$b")
    mkdir -p "$log_dir"
    setsid ip netns exec "$s_ns" "$netdelay" "${queues[@]}" </dev/null >>"$log_dir/$b.netdelay.log" 2>&1 &
    for _ in $(seq 100); do
      grep -q "ready" "$log_dir/$b.netdelay.log" 2>/dev/null && break
      grep -q "error" "$log_dir/$b.netdelay.log" 2>/dev/null && break
      sleep 0.05
    done
    grep -q "ready" "$log_dir/$b.netdelay.log" ||
      die "up: desloc-netdelay did not start in site $b: $(cat "$log_dir/$b.netdelay.log")"
    for a in "${sites[@]}"; do
      [[ $a == "$b" ]] && continue
      [[ -n ${delay[$a>$b]:-}${jitter[$a>$b]:-}${loss[$a>$b]:-} ]] || continue
      ip netns exec "$s_ns" iptables -w 5 -A INPUT -s "$subnet.${index[$a]}" -j NFQUEUE --queue-num "${index[$a]}"
    done
  done
  fail_point after-delays

  up_done=1
  trap - EXIT INT TERM ERR

  echo "netbed '$bed': ${#sites[@]} sites on $subnet.0/24, shaper $shaper, bridge namespace $br${tcp_buffer:+, TCP buffers up to $tcp_buffer bytes}$([[ $ssai -eq 1 ]] || echo ", no slow start after idle")${congestion:+, congestion control $congestion}"
  printf '%-16s %-24s %-15s %-15s %s\n' SITE NAMESPACE DEVICE ADDRESS "EGRESS RATE TO (one-way delay/jitter/loss)"
  for a in "${sites[@]}"; do
    i=${index[$a]}
    local to=""
    for b in "${sites[@]}"; do
      [[ $a == "$b" ]] && continue
      to+="$b=${rate[$a>$b]}"
      if [[ -n ${delay[$a>$b]:-}${jitter[$a>$b]:-}${loss[$a>$b]:-} ]]; then
        to+="($(awk -v u="${delay[$a>$b]:-0}" 'BEGIN { printf "%gms", u / 1000 }')/${jitter[$a>$b]:-0}/${loss[$a>$b]:-0%})"
      fi
      to+=" "
    done
    printf '%-16s %-24s %-15s %-15s %s\n' "$a" "$(ns_site "$bed" "$a")" "$(dev_site "$bed" "$i")" "$subnet.$i" "$to"
  done
}

# ---- down -----------------------------------------------------------------------------------
do_down() {
  local bed=$1 ns pid pids=() link idx site addr dev
  local -a nss
  local -A site_of=()
  mapfile -t nss < <(bed_namespaces "$bed")
  while read -r idx site addr dev; do site_of[$idx]=$site; done < <(bed_sites "$bed")
  # Processes still inside the bed would keep its namespaces (and veths) alive after
  # 'ip netns del'; terminate them first, by pid.
  for ns in "${nss[@]}"; do
    while read -r pid; do [[ -n $pid ]] && pids+=("$pid"); done < <(ip netns pids "$ns" 2>/dev/null || true)
  done
  if [[ ${#pids[@]} -gt 0 ]]; then
    say "terminating ${#pids[@]} process(es) still in bed '$bed': ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "${pids[@]}" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  # What the delay lines did (desloc-netdelay prints it when terminated), then their logs go.
  local log_dir="/run/netbed-$bed" log q rest
  if [[ -d $log_dir ]]; then
    for log in "$log_dir"/*.netdelay.log; do
      [[ -e $log ]] || continue
      site=$(basename "$log" .netdelay.log)
      while read -r q rest; do
        say "delays into $site from ${site_of[$q]:-queue $q}: $rest"
      done < <(sed -nE 's/^desloc-netdelay: queue ([0-9]+) (.*)$/\1 \2/p' "$log")
      grep -E "overflowed|error" "$log" | sed "s/^/$prog: $site: /" >&2 || true
    done
    rm -rf "$log_dir"
  fi
  # A namespace whose last process just died can still be pinned for a moment by that
  # process's mount namespace ('ip netns exec' makes one), so deletion is retried briefly.
  local try
  for ns in "${nss[@]}"; do
    for try in $(seq 25); do
      ip netns del "$ns" 2>/dev/null || true
      [[ ! -e /run/netns/$ns ]] && break
      sleep 0.2
    done
    [[ ! -e /run/netns/$ns ]] || say "warning: could not delete namespace $ns (tried $try times)"
  done
  # Devices are created inside the namespaces, but sweep the root namespace in case a
  # half-finished 'ip link add' left one there.
  while read -r link; do
    if [[ -n $link ]]; then ip link del "$link" 2>/dev/null || true; fi
  done < <(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep -E "^$kPrefix-$bed-[sb][0-9]+$" || true)
  if [[ ${#nss[@]} -gt 0 ]]; then
    echo "netbed '$bed': removed ${#nss[@]} namespace(s)"
  else
    echo "netbed '$bed': nothing to remove"
  fi
}

cmd_down() {
  local bed=
  while [[ $# -gt 0 ]]; do
    case $1 in
      --name) bed=${2:-}; shift 2 ;;
      *) die "down: unknown argument '$1'" ;;
    esac
  done
  valid_bed "$bed" || die "down: --name must be 1-8 chars [a-z0-9] starting with a letter, got '$bed'"
  require_root
  require_netns
  do_down "$bed"
  [[ -z $(bed_namespaces "$bed") ]] || die "down: namespaces of bed '$bed' remain: $(bed_namespaces "$bed" | tr '\n' ' ')"
}

# ---- status / env / exec --------------------------------------------------------------------
cmd_status() {
  local bed=
  while [[ $# -gt 0 ]]; do
    case $1 in
      --name) bed=${2:-}; shift 2 ;;
      *) die "status: unknown argument '$1'" ;;
    esac
  done
  require_root
  require_netns
  if [[ -z $bed ]]; then
    local beds
    beds=$(ip netns list 2>/dev/null | awk '{ print $1 }' | sed -nE "s/^$kPrefix-([a-z][a-z0-9]{0,7})-bridge$/\1/p")
    [[ -n $beds ]] || { echo "no netbed beds"; return 0; }
    local b; for b in $beds; do cmd_status --name "$b"; echo; done
    return 0
  fi
  valid_bed "$bed" || die "status: bad --name '$bed'"
  if [[ -z $(bed_namespaces "$bed") ]]; then
    echo "netbed '$bed': nothing exists"
    return 1
  fi
  echo "netbed '$bed': namespaces $(bed_namespaces "$bed" | tr '\n' ' ')"
  local idx site addr dev ns shaping cls kind minor r
  local -A site_of=()
  while read -r idx site addr dev; do site_of[$idx]=$site; done < <(bed_sites "$bed")
  printf '%-16s %-15s %-15s %s\n' SITE DEVICE ADDRESS "EGRESS SHAPING (from tc)"
  while read -r idx site addr dev; do
    ns=$(ns_site "$bed" "$site")
    shaping=""
    while read -r kind cls r; do
      if [[ $kind == tbf ]]; then
        shaping+="tbf $r (all destinations) "
      elif [[ $cls == 1:ffff ]]; then
        shaping+="other=$r "
      else
        minor=$((16#${cls#1:}))
        shaping+="${site_of[$minor]:-1:$minor}=$r "
      fi
    done < <({ tc -n "$ns" class show dev "$dev"; tc -n "$ns" qdisc show dev "$dev" root; } 2>/dev/null |
      awk '{ for (i = 1; i < NF; i++) if ($i == "rate") { print $2, $3, $(i + 1); break } }' |
      awk '$1 == "htb" || $1 == "tbf"')
    printf '%-16s %-15s %-15s %s\n' "$site" "$dev" "$addr" "${shaping:-none}"
  done < <(bed_sites "$bed")
  # The largest TCP buffers each site may use (they bound a link at buffer / round trip).
  local bufs=""
  while read -r idx site addr dev; do
    # shellcheck disable=SC2016  # expanded inside the site's namespace
    bufs+="$site=$(ip netns exec "$(ns_site "$bed" "$site")" sh -c \
      'echo "$(cut -f3 /proc/sys/net/ipv4/tcp_wmem)/$(cut -f3 /proc/sys/net/ipv4/tcp_rmem)"' 2>/dev/null) "
  done < <(bed_sites "$bed")
  echo "largest TCP send/receive buffers (bytes): $bufs"
  local ssai=""
  while read -r idx site addr dev; do
    ssai+="$site=$(ip netns exec "$(ns_site "$bed" "$site")" cat /proc/sys/net/ipv4/tcp_slow_start_after_idle 2>/dev/null) "
  done < <(bed_sites "$bed")
  echo "tcp_slow_start_after_idle: $ssai"
  local cc=""
  while read -r idx site addr dev; do
    cc+="$site=$(ip netns exec "$(ns_site "$bed" "$site")" cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null) "
  done < <(bed_sites "$bed")
  echo "tcp_congestion_control: $cc"
  # The delay lines, read off the running desloc-netdelay processes' command lines.
  local pid arg q spec delays any=''
  while read -r idx site addr dev; do
    ns=$(ns_site "$bed" "$site")
    delays=""
    while read -r pid; do
      [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == desloc-netdela* ]] || continue
      while read -r arg; do
        [[ $arg =~ ^([0-9]+)=([^/]+)us/([^/]+)/(.+)$ ]] || continue
        q=${BASH_REMATCH[1]}
        spec="$(awk -v u="${BASH_REMATCH[2]}" 'BEGIN { printf "%gms", u / 1000 }')/${BASH_REMATCH[3]}/${BASH_REMATCH[4]}"
        delays+="${site_of[$q]:-queue $q}=$spec "
      done < <(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)
    done < <(ip netns pids "$ns" 2>/dev/null || true)
    if [[ -n $delays ]]; then
      [[ -n $any ]] || printf '%-16s %s\n' SITE "DELAY/JITTER/LOSS OF PACKETS ARRIVING FROM (desloc-netdelay)"
      any=1
      printf '%-16s %s\n' "$site" "$delays"
    fi
  done < <(bed_sites "$bed")
}

# ---- rate: change links' shaping live ----------------------------------------------------------
cmd_rate() {
  local bed='' rates_csv='' item pair r a b idx site addr dev
  while [[ $# -gt 0 ]]; do
    case $1 in
      --name) bed=${2:-}; shift 2 ;;
      --rate) rates_csv=${2:-}; shift 2 ;;
      *) die "rate: unknown argument '$1'" ;;
    esac
  done
  valid_bed "$bed" || die "rate: bad or missing --name '$bed'"
  [[ -n $rates_csv ]] || die "rate: --rate A-B=R[,A>C=R...] is required"
  require_root
  require_netns
  local -A index_of=() dev_of=()
  while read -r idx site addr dev; do index_of[$site]=$idx; dev_of[$site]=$dev; : "$addr"; done < <(bed_sites "$bed")
  [[ ${#index_of[@]} -gt 0 ]] || die "rate: bed '$bed' is not up"
  local -a changes=()
  IFS=',' read -ra items <<<"$rates_csv"
  for item in "${items[@]}"; do
    [[ $item == *=* ]] || die "rate: '$item' is not A-B=RATE or A>B=RATE"
    pair=${item%%=*}; r=${item#*=}
    valid_rate "$r" || die "rate: '$r' in '$item' is not a tc rate (e.g. 100mbit)"
    if [[ $pair == *-* ]]; then a=${pair%%-*}; b=${pair#*-}; changes+=("$a $b $r" "$b $a $r")
    elif [[ $pair == *'>'* ]]; then a=${pair%%>*}; b=${pair#*>}; changes+=("$a $b $r")
    else die "rate: '$pair' is not A-B or A>B"; fi
    for site in "$a" "$b"; do
      [[ -n ${index_of[$site]:-} ]] || die "rate: no site '$site' in bed '$bed' (sites: ${!index_of[*]})"
    done
    [[ $a != "$b" ]] || die "rate: '$pair' names one site twice"
  done
  local change ns cls
  for change in "${changes[@]}"; do
    read -r a b r <<<"$change"
    ns=$(ns_site "$bed" "$a")
    cls="1:$(printf %x "${index_of[$b]}")"
    tc -n "$ns" class show dev "${dev_of[$a]}" classid "$cls" 2>/dev/null | grep -q htb ||
      die "rate: $a has no htb class for $b (a tbf bed cannot change one link)"
    tc -n "$ns" class change dev "${dev_of[$a]}" parent 1: classid "$cls" htb rate "$r" ceil "$r" \
      burst "$kBurst" cburst "$kBurst" quantum "$kHtbQuantum"
    say "rate: $a -> $b now $r"
  done
}

site_env() {  # prints KEY=VALUE lines for site $2 of bed $1
  local bed=$1 want=$2 idx site addr dev found='' all=''
  while read -r idx site addr dev; do
    all+="${all:+,}$site=$addr"
    if [[ $site == "$want" ]]; then found="$addr $dev"; fi
    : "$idx"
  done < <(bed_sites "$bed")
  [[ -n $found ]] || die "no site '$want' in bed '$bed' (sites: ${all:-none}; is it up?)"
  read -r addr dev <<<"$found"
  cat <<EOF
NETBED_NAME=$bed
NETBED_SITE=$want
NETBED_NETNS=$(ns_site "$bed" "$want")
NETBED_SITES=$all
DESLOC_SITE_ADDR=$addr
UCX_TLS=tcp
UCX_NET_DEVICES=$dev
GLOO_SOCKET_IFNAME=$dev
OMPI_MCA_btl_tcp_if_include=$dev
EOF
}

parse_site_args() {  # sets bed, site; leaves the rest in rest[]
  bed=; site=; rest=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --name) bed=${2:-}; shift 2 ;;
      --site) site=${2:-}; shift 2 ;;
      --) shift; rest=("$@"); break ;;
      *) die "unknown argument '$1' (command goes after --)" ;;
    esac
  done
  valid_bed "$bed" || die "bad or missing --name '$bed'"
  valid_site "$site" || die "bad or missing --site '$site'"
}

cmd_env() {
  local bed site; local -a rest
  parse_site_args "$@"
  [[ ${#rest[@]} -eq 0 ]] || die "env: unexpected arguments: ${rest[*]}"
  require_root
  require_netns
  site_env "$bed" "$site"
}

cmd_exec() {
  local bed site; local -a rest
  parse_site_args "$@"
  [[ ${#rest[@]} -gt 0 ]] || die "exec: missing command after --"
  require_root
  require_netns
  local -a envs
  mapfile -t envs < <(site_env "$bed" "$site")
  [[ ${#envs[@]} -gt 0 ]] || exit 1
  exec ip netns exec "$(ns_site "$bed" "$site")" env "${envs[@]}" "${rest[@]}"
}

main() {
  [[ $# -gt 0 ]] || { usage >&2; exit 2; }
  local cmd=$1; shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    rate) cmd_rate "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    exec) cmd_exec "$@" ;;
    -h|--help|help) usage ;;
    *) usage >&2; die "unknown command '$cmd'" ;;
  esac
}

main "$@"
