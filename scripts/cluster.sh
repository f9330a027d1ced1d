#!/usr/bin/env bash
# Run a local raftsched cluster on 127.0.0.1: three nodes, then as many as added.
#
# Usage: scripts/cluster.sh [start|stop|status|kill-leader|restart N|logs N|add|remove N]
#
# State lives in .raftsched/ at the repo root:
#   cluster-secret, token      shared secrets (mode 0600, generated once); token is the
#                              bootstrap admin API token (docs/security.md)
#   keys/                      the key ring job secrets are sealed with: k1.key, made once
#                              (the nodes' default --keys-dir; docs/operations.md, "Key files")
#   ports                      the base ports (and TLS mode) the cluster was started with
#   nodes                      the numbers of the member nodes, once 'add' or 'remove' changed
#                              them (absent: 1 2 3)
#   tls/                       with RAFTSCHED_TLS: a local CA and certificates (generated once)
#   node-N/                    data dir of node N, plus node.log and pid (a removed node's stays;
#                              'add' never reuses its number)
#
# Run as root, it creates the system user raftsched-run once (useradd --system): the nodes run
# the jobs' shell and python code as that user, who cannot read .raftsched/ (docs/security.md).
#
# Environment:
#   RAFTSCHED_API_PORT_BASE    API port base (default 8700); node N listens on base+N
#   RAFTSCHED_RAFT_PORT_BASE   Raft port base (default 9700); node N uses base+N
#                              Both, and RAFTSCHED_TLS, are recorded in ports at start; every later
#                              command uses the record, start too. Set at a start of a stopped
#                              cluster, they change it (the Raft base only while no member has
#                              Raft data: the members' Raft addresses are in their logs).
#   RAFTSCHED_NODE_CMD         TESTING HOOK: command prefix used to launch a node,
#                              split on whitespace (default ".venv/bin/raftsched node").
#                              When set, the venv is not created/installed by this script.
#   RAFTSCHED_CLI_CMD          TESTING HOOK: the raftsched CLI 'add' and 'remove' run and start's
#                              hint shows, split on whitespace (default: RAFTSCHED_NODE_CMD
#                              without its last word "node" when that is set, else
#                              ".venv/bin/raftsched")
#   RAFTSCHED_PYTHON           interpreter used to create .venv (default python3)
#   RAFTSCHED_RUN_UIDS         as root, each node runs each shell and python run as a uid of its
#                              own (--run-uids, 16 a node from 2000000000 + 16 x its API port);
#                              0 turns that off: every run is the user raftsched-run
#   RAFTSCHED_TLS              at start: 1 serves the API over TLS with a local CA made in
#                              .raftsched/tls (raftsched.testing.tls); mutual also requires a
#                              client certificate. Empty or 0: plain HTTP. Unset: as recorded.
set -euo pipefail

# Everything this script creates (secrets, data dirs, logs) is private to the user,
# and so is everything the nodes create, since they inherit this umask.
umask 077

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd -- "$ROOT"

PROG=scripts/cluster.sh
STATE=.raftsched
SECRET_FILE=$STATE/cluster-secret
TOKEN_FILE=$STATE/token
KEYS_DIR=$STATE/keys
PORTS_FILE=$STATE/ports
TLS_DIR=$STATE/tls
TLS_MODE=
HOST=127.0.0.1
NODES_FILE=$STATE/nodes
NODES=(1 2 3)
ADD_TIMEOUT=120      # seconds 'add' waits for the new node to catch up and become a voter
START_TIMEOUT=30     # seconds to wait for a leader after start/restart
FAILOVER_TIMEOUT=15  # seconds to wait for a new leader after kill-leader
STOP_TIMEOUT=        # seconds between SIGTERM and SIGKILL: a node's own stop limit (stop_timeout)
STOP_TIMEOUT_FALLBACK=90

DEFAULT_NODE_CMD=".venv/bin/raftsched node"
read -r -a NODE_CMD <<<"${RAFTSCHED_NODE_CMD:-$DEFAULT_NODE_CMD}"
# The CLI: RAFTSCHED_CLI_CMD, else the node command without its last word when that is "node"
# (a RAFTSCHED_NODE_CMD makes no .venv: "python -m raftsched node" -> "python -m raftsched"),
# else the venv's. 'add', 'remove' and the hint start prints all run this one.
if [[ -n ${RAFTSCHED_CLI_CMD:-} ]]; then
  read -r -a CLI_CMD <<<"$RAFTSCHED_CLI_CMD"
elif [[ -n ${RAFTSCHED_NODE_CMD:-} && ${#NODE_CMD[@]} -gt 1 && ${NODE_CMD[-1]} == node ]]; then
  CLI_CMD=("${NODE_CMD[@]:0:${#NODE_CMD[@]}-1}")
else
  CLI_CMD=(.venv/bin/raftsched)
fi

usage() {
  cat <<EOF
Usage: $PROG [command]

Commands:
  start          start the member nodes (at first 1-3) and wait for a leader
  stop           stop all nodes (SIGTERM; SIGKILL only once a node's own stop limit has passed:
                 it writes a dump as it stops, up to 60s)
  status         show pid, role, leader, term and commit index of each node
  kill-leader    kill -9 the current leader and time the election of a new one
  restart N      start node N again on its data dir
  logs N         follow node N's log
  add            start a new node on the next ports, add it to the cluster (a learner until it
                 holds the log, then a voter) and print its number
  remove N       remove node N from the cluster, then stop it (it may be dead already)

Members: ${NODES[*]}
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }
warn() { echo "$PROG: $*" >&2; }

# load_nodes: NODES from $NODES_FILE (the members after 'add' and 'remove'), else 1 2 3.
load_nodes() {
  [[ -f $NODES_FILE ]] || return 0
  local list=() n
  read -r -a list <"$NODES_FILE" || true
  for n in "${list[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "$NODES_FILE: not a node number: '$n'"; done
  ((${#list[@]} > 0)) || die "$NODES_FILE lists no node"
  NODES=("${list[@]}")
}

write_nodes() {
  echo "${NODES[*]}" >"$NODES_FILE.tmp.$$"
  mv -f "$NODES_FILE.tmp.$$" "$NODES_FILE"
}

# max_node: the highest node number used so far, by a member or by a data dir left behind.
max_node() {
  local n max=0 d
  for n in "${NODES[@]}"; do ((n > max)) && max=$n; done
  for d in "$STATE"/node-*; do
    [[ -d $d ]] || continue
    n=${d##*/node-}
    [[ $n =~ ^[0-9]+$ ]] && ((n > max)) && max=$n
  done
  echo "$max"
}

now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
# elapsed START -> seconds since START with 2 decimals
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# before DEADLINE -> true while now < DEADLINE
before() { awk -v d="$1" -v n="$(now)" 'BEGIN { exit !(n < d) }'; }
deadline_in() { awk -v s="$1" -v n="$(now)" 'BEGIN { printf "%.3f", n + s }'; }

command -v curl >/dev/null 2>&1 || die "curl is required"

# Interpreter that asks the nodes for /v1/cluster (raftsched/testing/cluster.py, standard library
# only, run from the source tree with -E -S); resolved once, lazily, so that a freshly created
# .venv is picked up and slow shims (pyenv) are bypassed.
PROBE_PY=''
probe_python() {
  if [[ -z $PROBE_PY ]]; then
    if [[ -x .venv/bin/python ]]; then
      PROBE_PY=.venv/bin/python
    else
      PROBE_PY=$(python3 -c 'import sys; print(sys.executable)') || die "python3 is required"
    fi
  fi
}

# ---------------------------------------------------------------- setup

ensure_venv() {
  if [[ -n "${RAFTSCHED_NODE_CMD:-}" ]]; then
    return 0 # testing hook: the node command does not come from the venv
  fi
  if [[ -x .venv/bin/raftsched ]]; then
    # A venv made before a dependency was added lacks it (the node would fail to import):
    # the project's dependencies must each be installed (versions are scripts/test.sh's to check).
    local missing
    missing=$(.venv/bin/python -I -c '
import importlib.metadata as md, re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
out = []
for r in deps:
    try:
        md.version(re.match(r"[A-Za-z0-9._-]+", r).group(0))
    except md.PackageNotFoundError:
        out.append(r)
print(", ".join(out))' 2>&1) || missing="(check failed: $missing)"
    [[ -n $missing ]] || return 0
    echo ".venv lacks $missing"
  fi
  echo "Setting up .venv (pip install -e .) ..."
  local log
  log=$(mktemp)
  if ! { [[ -x .venv/bin/python ]] || "${RAFTSCHED_PYTHON:-python3}" -m venv .venv; } >"$log" 2>&1 ||
    ! .venv/bin/python -m pip install -q --disable-pip-version-check -e . >>"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    die "failed to set up .venv"
  fi
  rm -f "$log"
  [[ -x .venv/bin/raftsched ]] || die ".venv/bin/raftsched missing after pip install -e ."
}

# new_secret FILE: write a fresh random secret, 32 random bytes in base64url (what a key file
# holds too), to FILE (0600) unless it exists.
new_secret() {
  local file=$1 tmp
  [[ -s "$file" ]] && return 0
  tmp="$file.tmp.$$"
  # umask 077 is in effect: the file is 0600 from the moment it is created.
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_urlsafe(32))' >"$tmp"
  else
    openssl rand -base64 32 | tr '+/' '-_' | tr -d '\n=' >"$tmp"
  fi
  [[ -s "$tmp" ]] || { rm -f "$tmp"; die "could not generate $file"; }
  chmod 600 "$tmp"
  # A hard link creates FILE atomically and never replaces one that a concurrent
  # run created in the meantime.
  ln "$tmp" "$file" 2>/dev/null || true
  rm -f "$tmp"
  [[ -s "$file" ]] || die "could not create $file"
}

ensure_state() {
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  new_secret "$SECRET_FILE"
  new_secret "$TOKEN_FILE"
  chmod 600 "$SECRET_FILE" "$TOKEN_FILE"
  # Every node reads this one key ring; a node refuses it if others may read it.
  mkdir -p "$KEYS_DIR"
  chmod 700 "$KEYS_DIR"
  if ! compgen -G "$KEYS_DIR/*.key" >/dev/null; then
    # A new key for a cluster that has data would seal new secrets under a k1 that is not the
    # one the old ones are sealed with, and every run of a job with secrets would fail: a restore
    # into a fresh .raftsched/ forgot to bring the keys, or they were moved away.
    if compgen -G "$STATE/node-*/raft.*" >/dev/null; then
      die "$KEYS_DIR holds no key file, but the nodes hold data whose secrets are sealed with one: put the key files back (from where you keep them: docs/operations.md, \"Key files (secrets at rest)\") and start again; to start over with a new key instead (every secret stored so far becomes unreadable), make one: raftsched secrets new-key --keys-dir $KEYS_DIR"
    fi
    new_secret "$KEYS_DIR/k1.key"
  fi
}

# ensure_run_user: as root, the system user the nodes run jobs' code as (a node as root picks
# raftsched-run when it exists, else nobody; docs/security.md). Created once; idempotent, and
# safe against a concurrent start that creates it first.
RUN_USER=raftsched-run
ensure_run_user() {
  ((EUID == 0)) || return 0
  id -u "$RUN_USER" >/dev/null 2>&1 && return 0
  if ! command -v useradd >/dev/null 2>&1; then
    warn "useradd not found: the nodes run jobs as nobody (create the system user $RUN_USER to give them their own)"
    return 0
  fi
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin --user-group "$RUN_USER" \
    >/dev/null 2>&1 || true
  if id -u "$RUN_USER" >/dev/null 2>&1; then
    echo "created the system user $RUN_USER: the nodes run jobs' shell and python code as it"
  else
    warn "could not create the system user $RUN_USER: the nodes run jobs as nobody"
  fi
}

# ---------------------------------------------------------------- ports

API_BASE=
RAFT_BASE=

valid_base() { [[ "$1" =~ ^[0-9]+$ ]] && (("$1" >= 1 && "$1" + $(max_node) + 1 <= 65535)); }

# read_ports_file: sets REC_API/REC_RAFT from $PORTS_FILE; false if absent or invalid.
read_ports_file() {
  REC_API='' REC_RAFT='' REC_TLS=''
  [[ -f "$PORTS_FILE" ]] || return 1
  local key val
  while IFS='=' read -r key val; do
    case $key in
      RAFTSCHED_API_PORT_BASE) REC_API=$val ;;
      RAFTSCHED_RAFT_PORT_BASE) REC_RAFT=$val ;;
      RAFTSCHED_TLS) REC_TLS=$val ;;
    esac
  done <"$PORTS_FILE"
  valid_base "$REC_API" && valid_base "$REC_RAFT"
}

# tls_mode_of VALUE: sets TLS_ASKED to the mode RAFTSCHED_TLS=VALUE asks for.
tls_mode_of() {
  case $1 in
    '' | 0) TLS_ASKED= ;;
    1 | server) TLS_ASKED=server ;;
    mutual) TLS_ASKED=mutual ;;
    *) die "RAFTSCHED_TLS must be empty, 0, 1 (server) or mutual, not '$1'" ;;
  esac
}

tls_name() { echo "${1:-off (plain HTTP)}"; }

# has_raft_data N: node N's data dir holds Raft files (its log, its vote, its identity).
has_raft_data() { compgen -G "$(node_dir "$1")/raft.*" >/dev/null; }

# load_ports MODE: the port bases and TLS mode. Every command but start uses the recorded ones
# (the environment's only when nothing is recorded). start uses them too: a variable set in the
# environment (RAFTSCHED_API_PORT_BASE, RAFTSCHED_RAFT_PORT_BASE, RAFTSCHED_TLS, even empty)
# asks for another value, which start takes only with every node stopped, and for the Raft base
# only while no member has a log (the members' Raft addresses are in their logs and dumps).
load_ports() {
  local mode=$1 env_api=${RAFTSCHED_API_PORT_BASE:-} env_raft=${RAFTSCHED_RAFT_PORT_BASE:-}
  local have_rec=0
  read_ports_file && have_rec=1
  if ((have_rec == 0)); then
    [[ $mode != start && -f $PORTS_FILE ]] && warn "$PORTS_FILE is unreadable; using the environment's ports"
    API_BASE=${env_api:-8700} RAFT_BASE=${env_raft:-9700}
    tls_mode_of "${RAFTSCHED_TLS:-}"
    TLS_MODE=$TLS_ASKED
  elif [[ $mode != start ]]; then
    API_BASE=$REC_API RAFT_BASE=$REC_RAFT TLS_MODE=$REC_TLS
  else
    API_BASE=${env_api:-$REC_API} RAFT_BASE=${env_raft:-$REC_RAFT} TLS_MODE=$REC_TLS
    if [[ -n ${RAFTSCHED_TLS+set} ]]; then
      tls_mode_of "$RAFTSCHED_TLS"
      TLS_MODE=$TLS_ASKED
    fi
    local rec="API base $REC_API, Raft base $REC_RAFT, TLS $(tls_name "$REC_TLS")"
    if [[ $API_BASE == "$REC_API" && $RAFT_BASE == "$REC_RAFT" && $TLS_MODE == "$REC_TLS" ]]; then
      echo "Using the settings recorded in $PORTS_FILE: $rec"
    else
      local asked="API base $API_BASE, Raft base $RAFT_BASE, TLS $(tls_name "$TLS_MODE")"
      if any_alive; then
        die "a cluster is already running with $rec; run '$PROG stop' first to change them (asked: $asked)"
      fi
      if [[ $RAFT_BASE != "$REC_RAFT" ]]; then
        local n with=()
        for n in "${NODES[@]}"; do has_raft_data "$n" && with+=("node-$n"); done
        ((${#with[@]} == 0)) ||
          die "refusing Raft base $RAFT_BASE: the members' Raft addresses ($(raft_base_addrs "$REC_RAFT")) are recorded in their logs and dumps (${with[*]}), so on other Raft ports they would not find each other and elect no leader. Start with the recorded Raft base $REC_RAFT (unset RAFTSCHED_RAFT_PORT_BASE or set it to $REC_RAFT); other Raft ports need a new cluster (another .raftsched/). The API base and TLS may change on a stopped cluster"
      fi
      echo "Changing the settings recorded in $PORTS_FILE ($rec) to what the environment asks: $asked"
    fi
  fi
  valid_base "$API_BASE" || die "invalid API port base: $API_BASE"
  valid_base "$RAFT_BASE" || die "invalid Raft port base: $RAFT_BASE"
}

# raft_base_addrs BASE: the members' Raft addresses on BASE, comma separated.
raft_base_addrs() {
  local n out=()
  for n in "${NODES[@]}"; do out+=("$HOST:$(($1 + n))"); done
  local IFS=,
  echo "${out[*]}"
}

write_ports_file() {
  printf 'RAFTSCHED_API_PORT_BASE=%s\nRAFTSCHED_RAFT_PORT_BASE=%s\nRAFTSCHED_TLS=%s\n' \
    "$API_BASE" "$RAFT_BASE" "$TLS_MODE" >"$PORTS_FILE.tmp.$$"
  mv -f "$PORTS_FILE.tmp.$$" "$PORTS_FILE"
}

api_port() { echo $((API_BASE + $1)); }
raft_addr() { echo "$HOST:$((RAFT_BASE + $1))"; }
api_url() { if [[ -n $TLS_MODE ]]; then echo "https://$HOST:$(api_port "$1")"; else echo "http://$HOST:$(api_port "$1")"; fi; }

# ensure_tls: with TLS, make the local CA and certificates once (raftsched.testing.tls, with the
# venv's cryptography: no openssl needed).
ensure_tls() {
  [[ -n $TLS_MODE ]] || return 0
  [[ -s $TLS_DIR/ca.pem && -s $TLS_DIR/node.pem && -s $TLS_DIR/client.pem ]] && return 0
  local py=python3
  [[ -x .venv/bin/python ]] && py=.venv/bin/python
  "$py" -m raftsched.testing.tls "$TLS_DIR" --hosts "$HOST,localhost" >/dev/null ||
    die "could not generate TLS certificates in $TLS_DIR"
}

# run_uids_args N: set UID_ARGS to node N's --run-uids, as root: each shell and python run a
# user of its own, so runs (of different tenants) cannot read each other's environment and
# secrets through /proc, nor signal each other (docs/security.md, "Per-run users"). Sixteen uids
# a node (its --slots is 4), from 2000000000 + 16 x its API port: a port is one node's on a host
# at a time, so the ranges of every cluster.sh node of the host are apart. RAFTSCHED_RUN_UIDS=0
# turns it off (every run then shares the run user raftsched-run).
run_uids_args() {
  UID_ARGS=()
  ((EUID == 0)) || return 0
  [[ "${RAFTSCHED_RUN_UIDS:-1}" == 0 ]] && return 0
  local lo=$((2000000000 + $(api_port "$1") * 16))
  UID_ARGS=(--run-uids "$lo-$((lo + 15))")
}

# tls_node_args / tls_probe_args: set TLS_ARGS to the flags a node or the probe gets.
tls_node_args() {
  TLS_ARGS=()
  [[ -n $TLS_MODE ]] || return 0
  TLS_ARGS=(--tls-cert "$TLS_DIR/node.pem" --tls-key "$TLS_DIR/node-key.pem")
  [[ $TLS_MODE != mutual ]] || TLS_ARGS+=(--tls-client-ca "$TLS_DIR/ca.pem")
}
tls_probe_args() {
  TLS_ARGS=()
  [[ -n $TLS_MODE ]] || return 0
  TLS_ARGS=(--ca-file "$TLS_DIR/ca.pem")
  [[ $TLS_MODE != mutual ]] || TLS_ARGS+=(--client-cert "$TLS_DIR/client.pem" --client-key "$TLS_DIR/client-key.pem")
}

# ---------------------------------------------------------------- processes

node_dir() { echo "$STATE/node-$1"; }
pid_file() { echo "$STATE/node-$1/pid"; }
log_file() { echo "$STATE/node-$1/node.log"; }

# cmdline_of PID: the process's command line, space separated.
cmdline_of() {
  if [[ -r /proc/$1/cmdline ]]; then
    tr '\0' ' ' <"/proc/$1/cmdline"
  else
    ps -o args= -p "$1" 2>/dev/null || true
  fi
}

# pid_is_node PID N: PID is alive and is raftsched node N (guards against pid reuse).
pid_is_node() {
  local pid=$1 n=$2 cmd
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  cmd=$(cmdline_of "$pid")
  [[ $cmd == *raftsched* && $cmd == *"node-$n"* ]]
}

# node_pid N: prints the pid recorded for node N if that process is alive.
node_pid() {
  local f pid
  f=$(pid_file "$1")
  [[ -f "$f" ]] || return 1
  pid=$(<"$f")
  pid_is_node "$pid" "$1" || return 1
  echo "$pid"
}

is_alive() { node_pid "$1" >/dev/null; }

any_alive() {
  local n
  for n in "${NODES[@]}"; do is_alive "$n" && return 0; done
  return 1
}

peers_of() {
  local n=$1 m peers=()
  for m in "${NODES[@]}"; do
    [[ $m == "$n" ]] || peers+=("$(raft_addr "$m")")
  done
  local IFS=,
  echo "${peers[*]}"
}

# start_node N: launch node N in its own session, detached from this shell. A node numbered
# above 3 was added ('add'): it joins (--join) the others; once a member, its log says who the
# members are, whatever --peers says.
start_node() {
  local n=$1 dir pidf log join=()
  ((n > 3)) && join=(--join)
  dir=$(node_dir "$n") pidf=$(pid_file "$n") log=$(log_file "$n")
  mkdir -p "$dir"
  rm -f "$pidf"
  printf '=== %s %s: starting node-%s (api %s:%s, raft %s)\n' \
    "$(date '+%Y-%m-%d %H:%M:%S')" "$PROG" "$n" "$HOST" "$(api_port "$n")" "$(raft_addr "$n")" >>"$log"
  # The inner bash records its own pid and then execs the node, so the pid file
  # holds the node's pid even if setsid has to fork.
  local detach=()
  command -v setsid >/dev/null 2>&1 && detach=(setsid)
  tls_node_args
  run_uids_args "$n"
  # shellcheck disable=SC2016  # $$, $0 and $@ are expanded by the inner bash
  "${detach[@]}" nohup bash -c 'echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"' "$pidf" \
    "${NODE_CMD[@]}" \
    --id "node-$n" \
    --api "$HOST:$(api_port "$n")" \
    --raft "$(raft_addr "$n")" \
    --peers "$(peers_of "$n")" \
    ${join[@]+"${join[@]}"} \
    --data-dir "$dir" \
    --cluster-secret-file "$SECRET_FILE" \
    --token-file "$TOKEN_FILE" \
    --log-file "$log" \
    ${TLS_ARGS[@]+"${TLS_ARGS[@]}"} \
    ${UID_ARGS[@]+"${UID_ARGS[@]}"} \
    </dev/null >>"$log" 2>&1 &
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -s "$pidf" ]] && return 0
    sleep 0.1
  done
  die "node-$n did not record its pid in $pidf"
}

# tail_logs N...: to stderr, the last lines of each node's log written since
# its most recent start.
tail_logs() {
  local n log from
  for n in "$@"; do
    log=$(log_file "$n")
    echo "----- node-$n: $log (last 30 lines of the latest run) -----" >&2
    if [[ -f "$log" ]]; then
      from=$(grep -n "^=== .* starting node-$n " "$log" | tail -n 1 | cut -d: -f1) || true
      tail -n "+${from:-1}" "$log" | tail -n 30 >&2
    else
      echo "(no log)" >&2
    fi
  done
}

# ---------------------------------------------------------------- /v1/cluster

# probe N...: ask the listed nodes for /v1/cluster, all at once, and find the agreed leader by
# the rule the tests and the fault harness use (raftsched/testing/cluster.py, docs/testing.md):
# the node that says it leads, named as leader by every listed node and by a majority of the
# cluster. A port that answers as another node counts as no answer. Sets, per node number N,
# P_OK[N] (1 if it answered) with P_ROLE[N] P_LEADER[N] P_TERM[N] P_COMMIT[N] P_PID[N] ("-" for
# null), or P_ERR[N] (why it did not); LEADER_NODE (its number), LEADER_ADDR, LEADER_TERM and
# LEADER_PID, empty without an agreed leader; and MAJORITY_NODE, MAJORITY_ADDR, MAJORITY_TERM:
# the leader a majority of the cluster names, even if not every listed node does (for status).
# True if there is an agreed leader.
probe() {
  local out kind n st a b c d e
  P_OK=() P_ROLE=() P_LEADER=() P_TERM=() P_COMMIT=() P_PID=() P_ERR=()
  LEADER_NODE='' LEADER_ADDR='' LEADER_TERM='' LEADER_PID=''
  MAJORITY_NODE='' MAJORITY_ADDR='' MAJORITY_TERM='' P_VOTERS='' P_LEARNERS=''
  (($# > 0)) || return 1
  probe_python
  tls_probe_args
  # The token travels in a file the probe reads, never in argv.
  local members
  members=$(printf '%s,' "${NODES[@]}")
  out=$("$PROBE_PY" -E -S -m raftsched.testing.cluster probe --host "$HOST" --api-base "$API_BASE" \
    --raft-base "$RAFT_BASE" --members "$members" --token-file "$TOKEN_FILE" \
    ${TLS_ARGS[@]+"${TLS_ARGS[@]}"} "$@") ||
    die "could not ask the nodes for /v1/cluster ($PROBE_PY -m raftsched.testing.cluster failed)"
  while IFS=$'\t' read -r kind n st a b c d e; do
    case $kind in
      node)
        if [[ $st == ok ]]; then
          P_OK[n]=1 P_ROLE[n]=$a P_LEADER[n]=$b P_TERM[n]=$c P_COMMIT[n]=$d P_PID[n]=$e
        else
          P_ERR[n]=$a
        fi
        ;;
      leader)
        [[ $n == - ]] || LEADER_NODE=$n LEADER_ADDR=$st LEADER_TERM=$a LEADER_PID=$b
        ;;
      majority)
        [[ $n == - ]] || MAJORITY_NODE=$n MAJORITY_ADDR=$st MAJORITY_TERM=$a
        ;;
      members)
        [[ $n == - ]] || P_VOTERS=$n P_LEARNERS=${st#-}
        ;;
    esac
  done <<<"$out"
  [[ -n $LEADER_NODE ]]
}

# check_leader N...: true if the listed nodes agree on one leader (probe). Sets LEADER_NODE,
# LEADER_ADDR, LEADER_TERM and LEADER_PID.
check_leader() { probe "$@"; }

# alive_nodes: sets the array ALIVE to the numbers of the nodes that are running.
alive_nodes() {
  local n
  ALIVE=()
  for n in "${NODES[@]}"; do
    if is_alive "$n"; then ALIVE+=("$n"); fi
  done
}

# wait_for_leader TIMEOUT REQUIRED...: poll every 0.2 s until the nodes that are
# alive agree on one leader. Nodes listed in REQUIRED must stay alive and be part
# of the agreement (with PROBE_REQUIRED_ONLY set, only they are asked: restart).
# Returns 1 on timeout, 2 if a required node died (after printing its log).
wait_for_leader() {
  local timeout=$1 deadline n
  shift
  local required=("$@")
  deadline=$(deadline_in "$timeout")
  while before "$deadline"; do
    for n in "${required[@]}"; do
      if ! is_alive "$n"; then
        warn "node-$n exited while waiting for a leader"
        tail_logs "$n"
        return 2
      fi
    done
    if [[ -n ${PROBE_REQUIRED_ONLY:-} ]]; then
      # Only the required node is asked: it is enough that it follows (or is) a leader of a
      # member's address in a term (the leader itself may refuse this token file).
      local r=${required[0]} addr
      probe "$r" || true
      addr=${P_LEADER[r]:-}
      if [[ -n ${P_OK[r]:-} && -n $addr && $addr != - && ${addr%:*} == "$HOST" ]]; then
        LEADER_ADDR=$addr LEADER_TERM=${P_TERM[r]} LEADER_NODE=$((${addr##*:} - RAFT_BASE))
        return 0
      fi
      sleep 0.2
      continue
    fi
    alive_nodes
    if check_leader "${ALIVE[@]}"; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# print_token_help: how to reach the cluster: a current member (the leader), and absolute paths,
# so that the lines work from any directory.
print_token_help() {
  local curl_tls= tls=$ROOT/$TLS_DIR
  if [[ -n $TLS_MODE ]]; then
    curl_tls="--cacert $tls/ca.pem "
    [[ $TLS_MODE != mutual ]] || curl_tls+="--cert $tls/client.pem --key $tls/client-key.pem "
  fi
  cat <<EOF

API token (the bootstrap admin token; every request needs a token): $TOKEN_FILE
  export RAFTSCHED_TOKEN=\$(cat $ROOT/$TOKEN_FILE)
  curl ${curl_tls}-H "Authorization: Bearer \$RAFTSCHED_TOKEN" $(api_url "${LEADER_NODE:-${NODES[0]}}")/v1/jobs
  ${CLI_CMD[*]} jobs    # from here (or below), the CLI finds this cluster, its ports and token
EOF
  if [[ -n $TLS_MODE ]]; then
    echo "  export RAFTSCHED_CA_FILE=$tls/ca.pem    # for the raftsched CLI run elsewhere with --url"
    [[ $TLS_MODE != mutual ]] ||
      echo "  export RAFTSCHED_CLIENT_CERT=$tls/client.pem RAFTSCHED_CLIENT_KEY=$tls/client-key.pem"
  fi
}

print_nodes() {
  local n pid mark
  for n in "${NODES[@]}"; do
    pid=$(node_pid "$n") || pid="(not running)"
    mark=
    [[ $n == "${LEADER_NODE:-}" ]] && mark="  <- leader (term $LEADER_TERM)"
    printf '  node-%s  %-24s raft %-16s pid %s%s\n' "$n" "$(api_url "$n")" "$(raft_addr "$n")" "$pid" "$mark"
  done
}

# ---------------------------------------------------------------- commands

# empty_member_msg N: why member N, whose data dir holds no Raft data, is not started, and what
# to do instead (restart and start say the same).
empty_member_msg() {
  echo "node-$1 has no Raft data in $(node_dir "$1") (lost, or moved away): a member started empty has forgotten its log and its vote; take it out and add a new node instead: '$PROG remove $1', then '$PROG add'"
}

cmd_start() {
  ensure_venv
  ensure_state
  ensure_run_user
  load_ports start
  ensure_tls
  write_ports_file
  # A member on an empty data directory has forgotten its log and its vote (docs/operations.md,
  # "Data directory"): not started, unless no node has any data yet (a new cluster).
  local n pid started=() refused=()
  if compgen -G "$STATE/node-*/raft.*" >/dev/null; then
    for n in "${NODES[@]}"; do
      is_alive "$n" || has_raft_data "$n" || refused+=("$n")
    done
  fi
  if ((${#refused[@]} > 0)); then
    for n in "${refused[@]}"; do warn "not starting node-$n: $(empty_member_msg "$n")"; done
    ((2 * ${#refused[@]} < ${#NODES[@]})) ||
      die "not starting any node: no majority of the members (${NODES[*]}) holds its data, so none could be elected without risking acknowledged writes; restore the data directories (docs/operations.md, \"Data directory\") or start a new cluster"
  fi
  for n in "${NODES[@]}"; do
    if pid=$(node_pid "$n"); then
      echo "node-$n is already running (pid $pid); not starting it again"
    elif [[ " ${refused[*]} " != *" $n "* ]]; then
      start_node "$n"
      started+=("$n")
      echo "started node-$n (pid $(<"$(pid_file "$n")"), log $(log_file "$n"))"
    fi
  done
  echo "Waiting up to ${START_TIMEOUT}s for a leader ..."
  local t0
  t0=$(now)
  local rc=0
  wait_for_leader "$START_TIMEOUT" ${started[@]+"${started[@]}"} || rc=$?
  if ((rc == 1)); then
    warn "no leader elected within ${START_TIMEOUT}s"
    alive_nodes
    report_state "${ALIVE[@]}" >&2
    tail_logs "${NODES[@]}"
  fi
  if ((rc != 0)); then
    alive_nodes
    ((${#ALIVE[@]} == 0)) || warn "nodes still running:$(printf ' node-%s' "${ALIVE[@]}"); '$PROG stop' stops them"
    exit 1
  fi
  echo "Leader elected after $(elapsed "$t0")s: node-$LEADER_NODE ($LEADER_ADDR)"
  echo
  echo "Cluster:"
  print_nodes
  print_run_warnings
  print_token_help
  if ((${#refused[@]} > 0)); then
    echo >&2
    for n in "${refused[@]}"; do warn "node-$n was not started: $(empty_member_msg "$n")"; done
    exit 1
  fi
}

# print_run_warnings: what the nodes' workers warned at start about where jobs run (the run
# user cannot read the Python library, jobs run as root, ...), from this start's part of each
# node's log, once each: said here, not only in node.log.
print_run_warnings() {
  local n log lines=()
  for n in "${NODES[@]}"; do
    log=$(log_file "$n")
    [[ -f $log ]] || continue
    while IFS= read -r line; do
      lines+=("$line")
    done < <(awk '/^=== / { delete seen; k = 0; next } / warning raftsched\.sandbox: / { sub(/^.* warning raftsched\.sandbox: /, ""); w[++k] = $0 } END { for (i = 1; i <= k; i++) print w[i] }' "$log")
  done
  ((${#lines[@]} == 0)) && return 0
  echo
  echo "Warnings about where jobs run (docs/security.md, \"What a job can reach\"):"
  printf '%s\n' "${lines[@]}" | sort -u | sed 's/^/  /'
}

# report_state N...: one line per node with what /v1/cluster says.
report_state() {
  local n
  probe "$@" || true
  for n in "$@"; do
    if [[ -n ${P_OK[n]:-} ]]; then
      printf '  node-%s: role %s, leader %s, term %s, commit index %s\n' "$n" "${P_ROLE[n]}" "${P_LEADER[n]}" \
        "${P_TERM[n]}" "${P_COMMIT[n]}"
    else
      printf '  node-%s: %s\n' "$n" "${P_ERR[n]:-no response}"
    fi
  done
}

# stop_timeout: sets STOP_TIMEOUT to the longest a node's graceful stop may take, from its limits
# (raftsched/node/limits.py, worker/limits.py, run from the source tree as the probe is): the
# worker's runs killed and reported (kill grace + report grace), the API's requests (twice
# api_stop_grace_s), the dump of what it applied (dump_on_stop_timeout_s), and 10 s for the Raft
# thread's end (replication RaftNode.stop: 5 s) and the process's exit.
stop_timeout() {
  [[ -z $STOP_TIMEOUT ]] || return 0
  probe_python
  STOP_TIMEOUT=$("$PROBE_PY" -E -S -c '
import math
from raftsched.node import limits as n
from raftsched.worker import limits as w
print(math.ceil(w.kill_grace_s_default + w.stop_report_grace_s + 2 * n.api_stop_grace_s
                + n.dump_on_stop_timeout_s + 10))' 2>/dev/null) || STOP_TIMEOUT=
  [[ $STOP_TIMEOUT =~ ^[0-9]+$ ]] || {
    warn "could not read the nodes' stop limits from raftsched/node/limits.py; waiting up to ${STOP_TIMEOUT_FALLBACK}s"
    STOP_TIMEOUT=$STOP_TIMEOUT_FALLBACK
  }
}

cmd_stop() {
  load_ports other
  local n pid pids=() names=()
  for n in "${NODES[@]}"; do
    if pid=$(node_pid "$n"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid") names+=("$n")
      echo "node-$n: sent SIGTERM to pid $pid"
    else
      echo "node-$n: not running"
      rm -f "$(pid_file "$n")"
    fi
  done
  ((${#pids[@]} > 0)) || return 0
  stop_timeout
  echo "Waiting up to ${STOP_TIMEOUT}s for the nodes to stop: each writes a dump of its state as it stops (docs/operations.md, \"Upgrading\")"
  local deadline i remaining t0 said=0 waited
  t0=$(now)
  deadline=$(deadline_in "$STOP_TIMEOUT")
  while ((${#pids[@]} > 0)); do
    remaining=()
    for i in "${!pids[@]}"; do
      if pid_is_node "${pids[i]}" "${names[i]}"; then
        remaining+=("$i")
      else
        echo "node-${names[i]}: stopped after $(elapsed "$t0")s"
        rm -f "$(pid_file "${names[i]}")"
        unset 'pids[i]' 'names[i]'
      fi
    done
    ((${#remaining[@]} > 0)) || break
    if ! before "$deadline"; then
      for i in "${remaining[@]}"; do
        echo "node-${names[i]}: still running after ${STOP_TIMEOUT}s, sending SIGKILL to pid ${pids[i]}"
        kill_hard "${pids[i]}"
        rm -f "$(pid_file "${names[i]}")"
      done
      break
    fi
    waited=$(elapsed "$t0")
    if ((${waited%.*} >= said + 10)); then
      said=$((${waited%.*} / 10 * 10))
      echo "still waiting for$(for i in "${remaining[@]}"; do printf ' node-%s' "${names[i]}"; done) (${said}s of ${STOP_TIMEOUT}s)"
    fi
    sleep 0.2
  done
}

# kill_hard PID: SIGKILL the node and, if it leads its own process group (it
# was started with setsid), everything else in that group too (e.g. job runs).
kill_hard() {
  local pid=$1 pgid
  pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') || true
  if [[ $pgid == "$pid" ]]; then
    kill -KILL -- "-$pid" 2>/dev/null || true
  else
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

cmd_status() {
  load_ports other
  echo "Ports: API base $API_BASE, Raft base $RAFT_BASE"
  local n pid rec
  alive_nodes
  probe "${ALIVE[@]}" || true
  for n in "${NODES[@]}"; do
    if pid=$(node_pid "$n"); then
      if [[ -n ${P_OK[n]:-} ]]; then
        rec=
        [[ ${P_PID[n]} == "$pid" ]] || rec=" (WARNING: /v1/cluster reports pid ${P_PID[n]})"
        printf 'node-%s  %-24s pid %s alive%s\n         role %s, leader %s, term %s, commit index %s\n' \
          "$n" "$(api_url "$n")" "$pid" "$rec" "${P_ROLE[n]}" "${P_LEADER[n]}" "${P_TERM[n]}" "${P_COMMIT[n]}"
        [[ ${P_ROLE[n]} != NOT-A-MEMBER ]] ||
          printf '         removed from the cluster (or not added yet): stop it; "%s remove %s" records a removal made through the API\n' \
            "$PROG" "$n"
      else
        printf 'node-%s  %-24s pid %s alive\n         %s\n' "$n" "$(api_url "$n")" "$pid" "${P_ERR[n]:-no response}"
      fi
    else
      printf 'node-%s  %-24s not running\n' "$n" "$(api_url "$n")"
    fi
  done
  if [[ -n $LEADER_NODE ]]; then
    echo "Leader: node-$LEADER_NODE ($LEADER_ADDR, term $LEADER_TERM), agreed by every running node"
  elif [[ -n $MAJORITY_NODE ]]; then
    echo "Leader: node-$MAJORITY_NODE ($MAJORITY_ADDR, term $MAJORITY_TERM), agreed by a majority but not by every running node"
  elif ((${#ALIVE[@]} > 0)); then
    echo "Leader: none agreed by a majority of the nodes"
  fi
  # The leader's members (Raft addresses): a change made through the API, a learner catching up.
  if [[ -n $P_VOTERS ]]; then
    echo "Members (the leader's): voters ${P_VOTERS//,/, }${P_LEARNERS:+; learners catching up: ${P_LEARNERS//,/, }}"
  fi
}

cmd_kill_leader() {
  load_ports other
  alive_nodes
  check_leader "${ALIVE[@]}" || {
    report_state "${ALIVE[@]}" >&2
    die "no agreed leader among the running nodes; nothing killed"
  }
  local n=$LEADER_NODE pid
  pid=$(node_pid "$n") || die "node-$n is the leader but its pid file names no live raftsched process"
  [[ $LEADER_PID == "$pid" ]] ||
    die "node-$n: /v1/cluster reports pid $LEADER_PID but $(pid_file "$n") says $pid; refusing to kill"
  kill -KILL "$pid"
  local t0 i
  t0=$(now)
  echo "Killed leader node-$n (pid $pid, term $LEADER_TERM) with SIGKILL"
  for ((i = 0; i < 50; i++)); do
    pid_is_node "$pid" "$n" || break
    sleep 0.1
  done
  rm -f "$(pid_file "$n")"
  alive_nodes
  local survivors=("${ALIVE[@]}")
  ((${#survivors[@]} > 0)) || die "no surviving nodes"
  echo "Waiting up to ${FAILOVER_TIMEOUT}s for a new leader among:$(printf ' node-%s' "${survivors[@]}")"
  local rc=0
  wait_for_leader "$FAILOVER_TIMEOUT" "${survivors[@]}" || rc=$?
  if ((rc == 0)); then
    echo "New leader: node-$LEADER_NODE ($LEADER_ADDR, term $LEADER_TERM) elected $(elapsed "$t0")s after the kill"
  elif ((rc == 2)); then
    exit 1
  else
    warn "TIMEOUT: no new leader among the survivors within ${FAILOVER_TIMEOUT}s of killing node-$n"
    report_state "${survivors[@]}" >&2
    exit 1
  fi
}

# node_arg VALUE: validate a node number argument: one of the members.
node_arg() {
  local n
  for n in "${NODES[@]}"; do [[ ${1:-} == "$n" ]] && return 0; done
  echo "$PROG: node ${1:-?} is not a member (members: ${NODES[*]})" >&2
  exit 2
}

# cli_client_args: set CLI_ARGS to the flags the raftsched CLI needs to reach the running
# members (their URLs; with TLS, the CA and client certificate). The token it reads from
# .raftsched/token (it runs here, at the repo root).
cli_client_args() {
  local n urls
  alive_nodes
  ((${#ALIVE[@]} > 0)) || die "no member node is running"
  urls=$(for n in "${ALIVE[@]}"; do api_url "$n"; done | paste -sd, -)
  CLI_ARGS=(--url "$urls")
  if [[ -n $TLS_MODE ]]; then
    CLI_ARGS+=(--ca-file "$TLS_DIR/ca.pem")
    [[ $TLS_MODE != mutual ]] || CLI_ARGS+=(--client-cert "$TLS_DIR/client.pem" --client-key "$TLS_DIR/client-key.pem")
  fi
}

cmd_add() {
  ensure_venv
  load_ports other
  [[ -s $SECRET_FILE && -s $TOKEN_FILE ]] || die "no cluster secrets in $STATE; run '$PROG start' first"
  alive_nodes
  check_leader "${ALIVE[@]}" || {
    report_state "${ALIVE[@]}" >&2
    die "no agreed leader among the running nodes; nothing added"
  }
  local n members=("${NODES[@]}")
  n=$(($(max_node) + 1))
  { valid_base "$API_BASE" && valid_base "$RAFT_BASE"; } || die "node-$n's ports would pass 65535"
  cli_client_args
  start_node "$n"
  echo "started node-$n (pid $(<"$(pid_file "$n")"), api $(api_url "$n"), raft $(raft_addr "$n"), log $(log_file "$n")); adding it" >&2
  NODES+=("$n")
  write_nodes
  if ! "${CLI_CMD[@]}" members add "$(raft_addr "$n")" --wait-s "$ADD_TIMEOUT" "${CLI_ARGS[@]}" >&2; then
    warn "node-$n runs but is not a voter (see above); '$PROG remove $n' takes it out"
    tail_logs "$n"
    exit 1
  fi
  echo "node-$n is a voter; members: ${NODES[*]} (were ${members[*]})" >&2
  echo "$n"
}

cmd_remove() {
  local n=$1 pid
  ensure_venv
  load_ports other
  ((${#NODES[@]} > 1)) || die "node-$n is the only member: a cluster needs one"
  cli_client_args
  # (the CLI prints a refusal's body on stdout: kept, and shown when the remove fails)
  local said
  said=$("${CLI_CMD[@]}" members remove "$(raft_addr "$n")" "${CLI_ARGS[@]}") || {
    printf '%s\n' "$said" >&2
    die "node-$n was not removed (the answer is above)"
  }
  local rest=() m
  for m in "${NODES[@]}"; do [[ $m == "$n" ]] || rest+=("$m"); done
  NODES=("${rest[@]}")
  write_nodes
  if pid=$(node_pid "$n"); then
    kill -TERM "$pid" 2>/dev/null || true
    stop_timeout
    echo "node-$n removed; waiting up to ${STOP_TIMEOUT}s for it to stop (it writes a dump as it stops)"
    local deadline
    deadline=$(deadline_in "$STOP_TIMEOUT")
    while pid_is_node "$pid" "$n" && before "$deadline"; do sleep 0.2; done
    if pid_is_node "$pid" "$n"; then kill_hard "$pid"; fi
    rm -f "$(pid_file "$n")"
    echo "node-$n removed and stopped; its data stays in $(node_dir "$n"); members: ${NODES[*]}"
  else
    echo "node-$n removed (it was not running); members: ${NODES[*]}"
  fi
}

cmd_restart() {
  local n=$1 pid
  ensure_venv
  load_ports other
  [[ -s $SECRET_FILE && -s $TOKEN_FILE ]] || die "no cluster secrets in $STATE; run '$PROG start' first"
  if pid=$(node_pid "$n"); then
    echo "node-$n is already running (pid $pid); not starting it again"
  else
    # A member on an empty data directory has forgotten its log and its vote: it could help
    # elect a second leader of a term it voted in (docs/operations.md, "Changing the members").
    compgen -G "$(node_dir "$n")/raft.*" >/dev/null ||
      die "$(empty_member_msg "$n")"
    start_node "$n"
    echo "started node-$n (pid $(<"$(pid_file "$n")"), log $(log_file "$n"))"
  fi
  echo "Waiting up to ${START_TIMEOUT}s for node-$n to report a leader ..."
  local t0
  t0=$(now)
  local rc=0
  # Node n's own view only: the others may be refusing this token file already (a rotation,
  # docs/security.md: each node restarted in turn), and their 401s would trip the nodes'
  # refused-token limiter for every client of this address.
  PROBE_REQUIRED_ONLY=1 wait_for_leader "$START_TIMEOUT" "$n" || rc=$?
  if ((rc == 1)); then
    warn "node-$n did not join an agreed leader within ${START_TIMEOUT}s"
    alive_nodes
    report_state "${ALIVE[@]}" >&2
    tail_logs "$n"
  fi
  ((rc == 0)) || exit 1
  echo "node-$n sees leader node-$LEADER_NODE ($LEADER_ADDR, term $LEADER_TERM) after $(elapsed "$t0")s"
  print_nodes
}

cmd_logs() {
  local log
  log=$(log_file "$1")
  [[ -f $log ]] || die "no log at $log"
  exec tail -n 50 -F "$log"
}

main() {
  local cmd=${1:-start}
  (($# == 0)) || shift
  load_nodes
  case $cmd in
    start) (($# == 0)) || { usage >&2; exit 2; }; cmd_start ;;
    stop) (($# == 0)) || { usage >&2; exit 2; }; cmd_stop ;;
    status) (($# == 0)) || { usage >&2; exit 2; }; cmd_status ;;
    kill-leader) (($# == 0)) || { usage >&2; exit 2; }; cmd_kill_leader ;;
    restart) (($# == 1)) || { usage >&2; exit 2; }; node_arg "$1"; cmd_restart "$1" ;;
    logs) { [[ ${1:-} =~ ^[1-9][0-9]*$ ]] && (($# == 1)); } || { usage >&2; exit 2; }; cmd_logs "$1" ;;
    add) (($# == 0)) || { usage >&2; exit 2; }; cmd_add ;;
    remove) (($# == 1)) || { usage >&2; exit 2; }; node_arg "$1"; cmd_remove "$1" ;;
    -h | --help | help) usage ;;
    *) echo "$PROG: unknown command: $cmd" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
