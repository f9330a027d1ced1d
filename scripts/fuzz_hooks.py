"""schemathesis hooks for scripts/fuzz_api.py (loaded through SCHEMATHESIS_HOOKS).

One: a lease request's ``wait_s`` (a long-poll of up to 60 s when no run is due) is cut to a
fraction of a second, so that the run's time goes to many requests rather than a few waits. Its
bounds are still fuzzed: a value outside them, or not a number, is sent as generated.
"""
from __future__ import annotations

import schemathesis

WAIT_S_MAX = 0.2


@schemathesis.hook
def map_case(context, case):
    body = getattr(case, "body", None)
    if case.method.upper() == "POST" and case.path.endswith("/lease") and isinstance(body, dict):
        w = body.get("wait_s")
        if isinstance(w, (int, float)) and not isinstance(w, bool) and WAIT_S_MAX < w <= 60:
            body["wait_s"] = WAIT_S_MAX
    return case
