#!/usr/bin/env bash
# Run jepsen-style/run.py over many seeds for as long as asked (docs/testing.md).
#
#   jepsen-style/soak.sh [-d SECONDS] [-p ci|soak] [-t TIME_LIMIT] [-s FIRST_SEED] [-n NEMESIS] [-- run.py args]
#
# -d  total wall time to keep starting runs (default 3600); a run started before the end finishes
# -p  profile (default soak); -t  each run's time limit (default: the profile's)
# -s  first seed (default: random); seeds then count up, so a soak is replayable seed by seed
# -n  nemesis list (default: all eight, the remote workers', the power cut and the membership's
#     included: kill,pause,partition,clock,restart-all,worker,power,membership)
# Prints one line per run (seed, verdict, store directory) and a summary to store/soak-<time>.txt.
# Exits 1 if any run was invalid, 2 if a run failed to run, else 0.
set -uo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd -- "$ROOT" || exit 2
PY=${RAFTSCHED_PYTHON_VENV:-.venv/bin/python}
DURATION=3600 PROFILE=soak LIMIT='' SEED=$((RANDOM * 32768 + RANDOM)) NEMESIS=kill,pause,partition,clock,restart-all,worker,power,membership
while getopts "d:p:t:s:n:" opt; do
  case $opt in
    d) DURATION=$OPTARG ;; p) PROFILE=$OPTARG ;; t) LIMIT=$OPTARG ;; s) SEED=$OPTARG ;; n) NEMESIS=$OPTARG ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
mkdir -p store
SUMMARY=store/soak-$(date +%Y%m%dT%H%M%S).txt
END=$((SECONDS + DURATION))
worst=0 runs=0
trap 'echo "soak: interrupted after $runs run(s); summary in $SUMMARY"; exit 130' INT TERM
while ((SECONDS < END)); do
  log=$(mktemp)
  rc=0
  "$PY" jepsen-style/run.py --profile "$PROFILE" --seed "$SEED" --nemesis "$NEMESIS" \
    ${LIMIT:+--time-limit "$LIMIT"} --no-plot "$@" >"$log" 2>&1 || rc=$?
  verdict=$(grep -m1 '^OVERALL:' "$log" | awk '{print $2}')
  store=$(grep -m1 '^store:' "$log" | awk '{print $2}')
  line="seed $SEED: ${verdict:-ERROR} (exit $rc) $store"
  echo "$line" | tee -a "$SUMMARY"
  if ((rc == 1)) && ((worst < 1)); then worst=1; fi
  if ((rc >= 2)); then worst=2; tail -20 "$log"; fi
  rm -f "$log"
  runs=$((runs + 1))
  SEED=$((SEED + 1))
done
echo "soak: $runs run(s) in $SECONDS s; summary in $SUMMARY"
exit $worst
