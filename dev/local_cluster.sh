#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the SLURM tests and for trying `--slurm` sweeps (needs root).
#
#   dev/local_cluster.sh install                 # install slurmctld, slurmd, slurm-client and munge (apt-get)
#   eval "$(dev/local_cluster.sh start [DIR])"   # install if missing, start the daemons, wait for the node;
#                                                # prints `export SLURM_CONF=DIR/slurm.conf`
#   dev/local_cluster.sh stop [DIR]              # cancel its jobs, stop exactly the daemons it started
#
# The cluster lives in DIR (default ${TMPDIR:-/tmp}/gpu-rl-slurm): slurm.conf, its own munge key and socket, state,
# pid files and logs. One node, localhost, with the CPUs this process may use and no GPUs; its daemons listen on a
# free port pair from 16817 up, so it never touches a real cluster's /etc/slurm or munge. Everything but the export
# line goes to stderr.
set -euo pipefail

ACTION="${1:-}"
DIR="${2:-${TMPDIR:-/tmp}/gpu-rl-slurm}"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
CONF="$DIR/slurm.conf"
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "[local-slurm] $*" >&2; }
die() {
  echo "error: $*" >&2
  exit 2
}

# Whether the daemon of pid file $1, named $2, runs; and stopping it: TERM, then KILL after 15 s (start-stop-daemon,
# from Debian's dpkg).
daemon_alive() { start-stop-daemon --status --pidfile "$1" --name "$2" >/dev/null 2>&1; }
stop_daemon() {
  if daemon_alive "$1" "$2"; then
    start-stop-daemon --stop --quiet --pidfile "$1" --name "$2" --retry TERM/15/KILL/5 || true
    say "stopped $2"
  fi
  rm -f "$1"
}

install_packages() {
  local missing=() tool
  for tool in slurmctld slurmd sbatch munged; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  ((${#missing[@]})) || return 0
  ((EUID == 0)) && command -v apt-get >/dev/null 2>&1 ||
    die "missing ${missing[*]}; install them as root: apt-get install ${PACKAGES[*]}"
  say "installing ${PACKAGES[*]} (apt-get)"
  # keep the packages' own services (which would use /etc/slurm) from starting, for the length of the install
  local policy=/usr/sbin/policy-rc.d made=0 rc=0 log="${TMPDIR:-/tmp}/gpu-rl-slurm-apt.log"
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1
  fi
  local apt=(apt-get -q -o Acquire::Retries=1 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
  export DEBIAN_FRONTEND=noninteractive
  {
    "${apt[@]}" install -y --no-install-recommends "${PACKAGES[@]}" ||
      { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${PACKAGES[@]}"; }
  } >"$log" 2>&1 || rc=$?
  ((made)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install ${PACKAGES[*]} failed (rc=$rc); see $log"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_conf() {
  local cpus mem_mb
  cpus="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
  mem_mb=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 9 / 10 / 1024)) # 90% of the memory, in MiB
  cat >"$CONF" <<EOF
# a one-node test cluster written by dev/local_cluster.sh; state and logs in $DIR
ClusterName=gpurl-local
SlurmctldHost=localhost
SlurmctldPort=$1
SlurmdPort=$(($1 + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# seconds between the SIGTERM of scancel (or of a time limit) and the SIGKILL: a run finishes its iteration and
# writes its checkpoint in that time
KillWait=60
InactiveLimit=0
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

# Print the tails of the daemons' logs and stop what started, then fail with $1.
give_up() {
  local f
  for f in "$DIR/munge/munged.log" "$DIR/slurmctld.log" "$DIR/slurmd.log"; do
    [[ -s $f ]] && { echo "--- tail $f" && tail -n 15 "$f"; } >&2
  done
  stop_all
  die "$1"
}

start() {
  ((EUID == 0)) || die "the local cluster runs slurmd as root (it starts jobs as their user); run this as root"
  install_packages
  export SLURM_CONF="$CONF"
  if daemon_alive "$DIR/slurmctld.pid" slurmctld && daemon_alive "$DIR/slurmd.pid" slurmd; then
    say "already running from $DIR"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  stop_all
  local port="" p i state=""
  for p in 16817 16827 16837 16847 16857 16867 16877 16887 16897 16907; do
    if ! port_in_use "$p" && ! port_in_use $((p + 1)); then
      port=$p
      break
    fi
  done
  [[ -n $port ]] || die "no free port pair from 16817 to 16908"
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/munge" "$DIR"/*.log
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge" || die "cannot create $DIR"
  chmod 700 "$DIR/munge"
  write_conf "$port"
  # a private munge key and socket: the cluster authenticates only its own daemons and clients
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" ||
    give_up "munged did not start"
  slurmctld -f "$CONF" || give_up "slurmctld did not start"
  slurmd -f "$CONF" -N localhost || give_up "slurmd did not start"
  for ((i = 0; i < 600; i++)); do
    state="$(sinfo -h -N -n localhost -o '%t' 2>/dev/null || true)"
    [[ $state == idle ]] && break
    sleep 0.1
  done
  [[ $state == idle ]] || give_up "the node did not become idle in 60 s (state '${state:-none}')"
  say "cluster up from $DIR: node localhost idle, slurmctld port $port"
  echo "export SLURM_CONF=$CONF"
}

stop_all() {
  local i
  export SLURM_CONF="$CONF"
  if daemon_alive "$DIR/slurmctld.pid" slurmctld; then # cancel its jobs first: no job step outlives its slurmd
    squeue -h -o '%A' 2>/dev/null | sort -u | xargs -r scancel 2>/dev/null || true
    for ((i = 0; i < 900; i++)); do # KillWait (60 s) plus a margin
      [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] && break
      sleep 0.1
    done
  fi
  stop_daemon "$DIR/slurmd.pid" slurmd
  stop_daemon "$DIR/slurmctld.pid" slurmctld
  stop_daemon "$DIR/munge/munged.pid" munged
}

case "$ACTION" in
  install) install_packages ;;
  start) start ;;
  stop) stop_all ;;
  *) die "usage: dev/local_cluster.sh install|start|stop [DIR]" ;;
esac
