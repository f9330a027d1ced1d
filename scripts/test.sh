#!/usr/bin/env bash
# Run the raftsched checks: scripts/test.sh [pytest args...]
#
# Sets up .venv (pip install -e '.[dev]') when it is missing or out of date, then
# runs each step in turn. A failing step does not stop the later ones; the script
# exits non-zero (the first failing step's status) if any step failed.
#
# To add a check, add one `step NAME COMMAND...` line at the bottom. Steps run from
# the repo root. Note that `set -e` does not apply inside a shell function used as a
# step, so such a function must return its own failure status.
#
# Environment: RAFTSCHED_PYTHON  interpreter used to create .venv (default python3)
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd -- "$ROOT"

VENV_PY=.venv/bin/python
# Playwright (the dev extra) drives Debian's chromium (ensure_chromium below): it must never
# download a browser of its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

# Prints what is missing from .venv (nothing if it is complete): the project
# itself (installed editable), its dependencies and its dev extra. Run with -I so
# that the source tree's raftsched.egg-info (cwd on sys.path) is not picked up.
# shellcheck disable=SC2016
CHECK_PY='
import importlib.metadata as md, json, re, sys, tomllib
try:
    from pip._vendor.packaging.requirements import Requirement
except Exception:
    Requirement = None
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
reqs = list(project.get("dependencies", []))
reqs += list(project.get("optional-dependencies", {}).get("dev", []))
missing = []
for r in reqs:
    spec = None
    if Requirement is not None:
        req = Requirement(r)
        if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
            continue
        name, spec = req.name, req.specifier
    else:
        name = re.match(r"[A-Za-z0-9._-]+", r).group(0)
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        missing.append(r)
        continue
    if spec is not None and not spec.contains(have, prereleases=True):
        missing.append("%s (have %s)" % (r, have))
try:
    direct = json.loads(md.distribution(project["name"]).read_text("direct_url.json") or "{}")
    if not direct.get("dir_info", {}).get("editable"):
        missing.append(project["name"] + " (not installed editable)")
except md.PackageNotFoundError:
    missing.append(project["name"])
print(", ".join(missing))
'

ensure_venv() {
  local missing=''
  if [[ -x .venv/bin/pytest && -x $VENV_PY ]]; then
    missing=$("$VENV_PY" -I -c "$CHECK_PY" 2>&1) || missing="(check failed: $missing)"
    [[ -n $missing ]] || return 0
    echo "test.sh: .venv is out of date: $missing"
  fi
  echo "test.sh: setting up .venv (pip install -e '.[dev]') ..."
  local log rc=0
  log=$(mktemp)
  {
    [[ -x $VENV_PY ]] || "${RAFTSCHED_PYTHON:-python3}" -m venv .venv
    "$VENV_PY" -m pip install -q --disable-pip-version-check -e '.[dev]'
  } >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$log" >&2
    rm -f "$log"
    echo "test.sh: failed to set up .venv" >&2
    exit 1
  fi
  rm -f "$log"
}

# The dashboard's browser test (tests/test_ui_browser.py) drives Debian's chromium: installed with
# apt-get when missing and running as root (as CI does); otherwise say so, and that test fails.
ensure_chromium() {
  [[ -x ${RAFTSCHED_CHROMIUM:-/usr/bin/chromium} ]] && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test.sh: installing chromium (apt-get) for tests/test_ui_browser.py ..."
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
      || echo "test.sh: apt-get could not install chromium: tests/test_ui_browser.py will fail" >&2
  else
    echo "test.sh: no chromium at /usr/bin/chromium: install Debian's chromium package, or tests/test_ui_browser.py fails" >&2
  fi
}

FAILED=()
FIRST_RC=0

# step NAME COMMAND...: run COMMAND, record a failure, carry on.
step() {
  local name=$1 rc=0 t0=$SECONDS
  shift
  echo
  echo "==> $name"
  "$@" || rc=$?
  if ((rc != 0)); then
    FAILED+=("$name (exit $rc)")
    ((FIRST_RC != 0)) || FIRST_RC=$rc
    echo "==> $name: FAILED (exit $rc, $((SECONDS - t0))s)"
  else
    echo "==> $name: ok ($((SECONDS - t0))s)"
  fi
}

# Both pytest steps spread their tests over two processes (pytest-xdist, one test file to a
# process, so a module's fixtures are made once): most tests wait on processes, elections or
# sockets, and the machine has two cores.
PYTEST_PAR=(-n 2 --dist loadfile)

# The tests that never read the wall clock (tests/conftest.py marks the others `wallclock`: they
# run in the any-year step, below). pytest exits 5 when it collects no tests: a failure here,
# unless tests were named and all of them are wall-clock tests.
# shellcheck disable=SC2317  # invoked indirectly, through step
run_pytest() {
  local rc=0
  "$VENV_PY" -m pytest -q "${PYTEST_PAR[@]}" -m 'not wallclock' "$@" || rc=$?
  if ((rc == 5 && $# > 0)); then
    echo "test.sh: no test among those selected runs without the wall clock"
    return 0
  fi
  if ((rc == 5)); then
    echo "test.sh: pytest collected no tests" >&2
    return 1
  fi
  return "$rc"
}

finish() {
  echo
  if ((${#FAILED[@]} > 0)); then
    echo "test.sh: FAILED steps:"
    printf '  %s\n' "${FAILED[@]}"
    exit "$FIRST_RC"
  fi
  echo "test.sh: all steps passed"
  exit 0
}

trap 'echo; echo "test.sh: interrupted" >&2; exit 130' INT TERM

ensure_venv
ensure_chromium
echo "raftsched tests in $ROOT"
echo "$("$VENV_PY" --version 2>&1) ($VENV_PY), pytest $("$VENV_PY" -c 'import pytest; print(pytest.__version__)')"

# The boundaries a machine checks (docs/testing.md, "Linters"): the layers (import-linter's
# contracts in pyproject.toml), ruff over the tree, mypy over the core. Seconds each.
step lint-imports .venv/bin/lint-imports
step ruff .venv/bin/ruff check raftsched scripts tests jepsen-style examples
step mypy-core .venv/bin/mypy
# promtool (Prometheus's checker, for tests/test_metrics_prom.py): from Debian's prometheus package,
# only its binary extracted into .venv/bin (raftsched/testing/promtool.py); the service is never
# installed. Not a step: without it the tests that need it fail as root and skip otherwise.
"$VENV_PY" -m raftsched.testing.promtool || echo "test.sh: no promtool; see above" >&2
step pytest run_pytest "$@"
# The tests that read the wall clock (or start processes that do), run once, with it moved 7
# years and 123 days ahead (scripts/anyyear/wallclock_shift.c, LD_PRELOAD; monotonic clocks
# untouched): a test that passes only before some calendar date fails here, today, instead of in
# CI on that date.
# shellcheck disable=SC2317  # invoked indirectly, through step
any_year() {
  local so=.venv/wallclock_shift.so src=scripts/anyyear/wallclock_shift.c
  if [[ ! -f $so || $src -nt $so ]]; then
    cc -shared -fPIC -O2 -o "$so" "$src" -ldl || return 1
  fi
  local shift=$(((7 * 365 + 123) * 86400)) now
  now=$(date +%s)
  # The shim must really move the clock (a silently unloaded LD_PRELOAD would prove nothing).
  SHIFT_WALL_S=$shift LD_PRELOAD="$PWD/$so" "$VENV_PY" -c \
    "import sys, time; sys.exit(0 if time.time() >= $now + $shift else 'the wall clock did not move')" || return 1
  local rc=0
  SHIFT_WALL_S=$shift LD_PRELOAD="$PWD/$so" "$VENV_PY" -m pytest -q "${PYTEST_PAR[@]}" -m wallclock "$@" || rc=$?
  if ((rc == 5 && $# > 0)); then
    echo "test.sh: no wall-clock tests among those selected"
    return 0
  fi
  ((rc == 5)) && echo "test.sh: no test is marked wallclock (tests/conftest.py)" >&2
  return "$rc"
}
step any-year any_year "$@"
# Every measurement script the docs cite as the source of a figure (scripts/measure/), each at tiny
# sizes in its own process, one after the other (under a minute on 2 shared cores): fails if one
# exits non-zero or does not print what it measures, so a script that rots fails here.
step measure-smoke "$VENV_PY" scripts/measure smoke
# The benchmark's quick run (scripts/bench.py --quick, about two minutes on 2 shared cores): checks that every
# scenario ran (exit 0, every scenario in the JSON without an error, the scale scenario's in-process
# state-machine figures and journal sizes present), not how fast.
# shellcheck disable=SC2317  # invoked indirectly, through step
bench_quick() {
  local dir rc=0
  dir=$(mktemp -d)
  "$VENV_PY" scripts/bench.py --quick --out "$dir/bench.json" --plot "$dir/bench.png" >"$dir/bench.out" 2>&1 || rc=$?
  if ((rc == 0)); then
    "$VENV_PY" - "$dir/bench.json" <<'PY' || rc=$?
import json, sys
sys.path.insert(0, "scripts")
from bench import ALL_SCENARIOS
res = json.load(open(sys.argv[1]))
bad = [s for s in ALL_SCENARIOS if not isinstance(res.get(s), dict) or "error" in res[s]]
if bad or not res.get("ok"):
    sys.exit(f"bench-quick: scenarios missing or failed: {bad}; failed: {res.get('failed')}")
sc = res["scale"]
steps = sc.get("steps") or []
if not (sc.get("state_machine") or {}).get("steps") or not steps or not all((st.get("restart") or {}).get("journal") for st in steps):
    sys.exit("bench-quick: the scale scenario has no in-process state-machine figures or no journal sizes")
print(f"bench-quick: all {len(ALL_SCENARIOS)} scenarios ran in {res['elapsed_s']} s ({res['fire_log']['note']})")
PY
  fi
  if ((rc != 0)); then
    tail -n 60 "$dir/bench.out"
  fi
  rm -rf -- "$dir"
  return "$rc"
}
step bench-quick bench_quick
# schemathesis against a real node (scripts/fuzz_api.py; docs/testing.md, "schemathesis"): every
# operation of the OpenAPI document with an admin, a reader, a limited operator and a worker token,
# over 1 000 seeded requests in about a minute of CPU; fails on a 5xx or an answer the document does not
# describe. RAFTSCHED_FUZZ_PROFILE=long runs ten times as many; RAFTSCHED_FUZZ_SEED replays one.
step schemathesis "$VENV_PY" scripts/fuzz_api.py
# About 2.5 minutes of faults against three real nodes and two remote workers (docs/testing.md); fails on an invalid verdict.
step fault-injection "$VENV_PY" jepsen-style/run.py --profile ci ${JEPSEN_SEED:+--seed "$JEPSEN_SEED"}

finish
