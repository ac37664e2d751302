#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying and testing `--slurm` sweeps against a real scheduler.
#
#   eval "$(benchmark/slurm/local_cluster.sh start)"   # installs slurm + munge when missing, starts the daemons,
#                                                        # waits for the node; prints `export SLURM_CONF=...`
#   benchmark/ppo_atari.sh --slurm --games Pong --seeds 1 -- --total-timesteps 4096
#   squeue; sinfo
#   benchmark/slurm/local_cluster.sh stop              # cancels its jobs, stops exactly the daemons it started
#   benchmark/slurm/local_cluster.sh status
#   benchmark/slurm/local_cluster.sh install           # only install the packages (CI does this before the tests)
#
# The cluster lives in one directory (argument DIR or env LOCAL_SLURM_DIR, default ${TMPDIR:-/tmp}/gpu-rl-slurm):
# slurm.conf, a private munge key and socket, controller state, spool, pid files and daemon logs. It has one node,
# `localhost`, with the CPUs this process may use and no GPUs; no accounting database. Its own munged, slurmctld and
# slurmd listen on a free port pair from 16817/16818 up (env LOCAL_SLURM_PORT picks the controller port), so it
# never touches a real cluster's /etc/slurm or munge. It needs root (slurmd starts jobs as their user) and, to
# install the Debian packages slurmctld, slurmd, slurm-client and munge, apt-get.
#
# Everything except the `export` line goes to stderr, so `eval "$(... start)"` sets SLURM_CONF in your shell.

set -euo pipefail

ACTION="${1:-}"
DIR="${2:-${LOCAL_SLURM_DIR:-${TMPDIR:-/tmp}/gpu-rl-slurm}}"
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "[local-slurm] $*" >&2; }
die() {
  echo "error: $*" >&2
  exit 2
}

usage() {
  cat >&2 <<'EOF'
usage: benchmark/slurm/local_cluster.sh start|stop|status|install [DIR]
  start    install slurm + munge if missing (apt-get, root), start munged, slurmctld and slurmd from DIR,
           wait until the node is idle, print `export SLURM_CONF=DIR/slurm.conf`
  stop     cancel the cluster's jobs, stop the daemons started from DIR (by their pid files)
  status   say whether the daemons from DIR run, and show sinfo
  install  install slurmctld, slurmd, slurm-client and munge when missing (apt-get, root), start nothing
DIR defaults to $LOCAL_SLURM_DIR, else ${TMPDIR:-/tmp}/gpu-rl-slurm. LOCAL_SLURM_PORT sets the controller port.
EOF
}

case "$ACTION" in
  start | stop | status | install) ;;
  -h | --help | help)
    usage
    exit 0
    ;;
  *)
    usage
    die "unknown action '${ACTION}' (use start, stop, status or install)"
    ;;
esac
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
CONF="$DIR/slurm.conf"

# True when the process in pid file $1 is alive and its command line mentions $2 (the daemon) and DIR.
daemon_alive() {
  local pidfile="$1" name="$2" pid cmd
  [[ -s "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline")"
  [[ "$cmd" == *"$name"* && "$cmd" == *"$DIR"* ]]
}

# Stop the daemon of pid file $1 (named $2) if it is ours: TERM, up to 15 s, then KILL.
stop_daemon() {
  local pidfile="$1" name="$2" pid i
  if ! daemon_alive "$pidfile" "$name"; then
    rm -f "$pidfile"
    return 0
  fi
  pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    [[ -d "/proc/$pid" ]] || break
    sleep 0.1
  done
  if [[ -d "/proc/$pid" ]]; then
    say "$name (pid $pid) did not stop on TERM in 15 s; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  say "stopped $name (pid $pid)"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cluster_running() {
  daemon_alive "$DIR/slurmctld.pid" slurmctld || daemon_alive "$DIR/slurmd.pid" slurmd ||
    daemon_alive "$DIR/munge/munged.pid" munged
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
  command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
  command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null 2>&1 ||
    die "missing ${missing[*]} and no apt-get to install them; install SLURM (slurmctld, slurmd, sbatch) and munge"
  ((EUID == 0)) || die "missing ${missing[*]}; install them as root: apt-get install ${PACKAGES[*]}"
  say "installing ${PACKAGES[*]} (apt-get)"
  # Keep the packages' own services from starting (they would use /etc/slurm): a policy-rc.d that says no,
  # only for the length of the install, and only if the machine has none.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  local log="${TMPDIR:-/tmp}/gpu-rl-slurm-apt.log" rc=0
  local apt=(apt-get -q -o Acquire::Retries=1 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
  {
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "${PACKAGES[@]}" ||
      { "${apt[@]}" update && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends \
        "${PACKAGES[@]}"; }
  } >"$log" 2>&1 || rc=$?
  ((made_policy)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install ${PACKAGES[*]} failed (rc=$rc); see $log"
}

# The CPUs this process may use (nproc without the OpenMP variables, which it would honour).
cpu_count() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

write_conf() {
  local ctl_port="$1" cpus mem_mb
  cpus="$(cpu_count)"
  mem_mb=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 9 / 10 / 1024)) # 90% of the memory, in MiB
  cat >"$CONF" <<EOF
# written by benchmark/slurm/local_cluster.sh: a one-node test cluster, state and logs in $DIR
ClusterName=gpurl-local
SlurmctldHost=localhost
SlurmctldPort=$ctl_port
SlurmdPort=$((ctl_port + 1))
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
SlurmctldDebug=info
SlurmdDebug=info
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

show_logs() {
  local f
  for f in "$DIR/munge/munged.log" "$DIR/slurmctld.log" "$DIR/slurmd.log"; do
    [[ -s "$f" ]] && { echo "--- tail $f" >&2 && tail -n 15 "$f" >&2; }
  done
  return 0
}

start() {
  ((EUID == 0)) || die "the local cluster runs slurmd as root (it starts jobs as their user); run this as root"
  install_packages
  export SLURM_CONF="$CONF"
  if cluster_running; then
    if daemon_alive "$DIR/slurmctld.pid" slurmctld && daemon_alive "$DIR/slurmd.pid" slurmd &&
      daemon_alive "$DIR/munge/munged.pid" munged; then
      say "already running from $DIR"
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    die "a partly started cluster runs from $DIR; stop it first: $0 stop $DIR"
  fi
  local port="${LOCAL_SLURM_PORT:-}"
  if [[ -n "$port" ]]; then
    if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1024 || port > 65534)); then
      die "LOCAL_SLURM_PORT=$port must be a port number between 1024 and 65534"
    fi
    if port_in_use "$port" || port_in_use $((port + 1)); then
      die "port $port or $((port + 1)) is in use; pick another LOCAL_SLURM_PORT"
    fi
  else
    local p
    for p in 16817 16827 16837 16847 16857 16867 16877 16887 16897 16907; do
      if ! port_in_use "$p" && ! port_in_use $((p + 1)); then
        port=$p
        break
      fi
    done
    [[ -n "$port" ]] || die "no free port pair from 16817 to 16908; set LOCAL_SLURM_PORT to a free port"
  fi

  rm -rf "$DIR/state" "$DIR/spool" "$DIR/munge"
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge" || die "cannot create $DIR"
  chmod 700 "$DIR/munge"
  rm -f "$DIR"/*.log
  write_conf "$port"

  # a private munge key and socket: the cluster authenticates only its own daemons and clients
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null ||
      dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  else
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" ||
    {
      show_logs
      die "munged did not start; see $DIR/munge/munged.log"
    }
  slurmctld -f "$CONF" || {
    show_logs
    stop_all quiet
    die "slurmctld did not start; see $DIR/slurmctld.log"
  }
  slurmd -f "$CONF" -N localhost || {
    show_logs
    stop_all quiet
    die "slurmd did not start; see $DIR/slurmd.log"
  }
  local i state=""
  for ((i = 0; i < 600; i++)); do
    state="$(sinfo -h -N -n localhost -o '%t' 2>/dev/null || true)"
    [[ "$state" == idle ]] && break
    sleep 0.1
  done
  if [[ "$state" != idle ]]; then
    show_logs
    stop_all quiet
    die "the node did not become idle in 60 s (state '${state:-none}'); daemon logs above"
  fi
  say "cluster up from $DIR: node localhost ($(cpu_count) CPUs) idle, slurmctld port $port"
  echo "export SLURM_CONF=$CONF"
}

stop_all() {
  export SLURM_CONF="$CONF"
  if daemon_alive "$DIR/slurmctld.pid" slurmctld; then
    # cancel the jobs of this private cluster first, so no job step outlives its slurmd
    local jobs i
    jobs="$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')"
    if [[ -n "${jobs// /}" ]]; then
      [[ "${1:-}" == quiet ]] || say "cancelling jobs: $jobs"
      # shellcheck disable=SC2086  # job ids, one word each
      scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 900; i++)); do # KillWait (60 s) plus margin
        [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] && break
        sleep 0.1
      done
    fi
  fi
  stop_daemon "$DIR/slurmd.pid" slurmd
  stop_daemon "$DIR/slurmctld.pid" slurmctld
  stop_daemon "$DIR/munge/munged.pid" munged
}

case "$ACTION" in
  start) start ;;
  install)
    install_packages
    say "installed: $(command -v slurmctld slurmd sbatch munged | tr '\n' ' ')"
    ;;
  stop)
    if ! cluster_running; then
      say "no daemons from $DIR are running"
      exit 0
    fi
    stop_all
    ;;
  status)
    for d in munge/munged slurmctld slurmd; do
      if daemon_alive "$DIR/$d.pid" "${d#munge/}"; then
        say "${d#munge/}: running (pid $(cat "$DIR/$d.pid"))"
      else
        say "${d#munge/}: not running"
      fi
    done
    if daemon_alive "$DIR/slurmctld.pid" slurmctld; then
      SLURM_CONF="$CONF" sinfo >&2 || true
      echo "export SLURM_CONF=$CONF"
    fi
    ;;
esac
