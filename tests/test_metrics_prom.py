"""/metrics as Prometheus accepts it (``promtool check metrics``), what it counts without a walk
of the runs (core/stats.py), and the alert rules of docs/operations.md (``promtool check rules``).
In-process (FakeRaft, FakeClock); a real node's /metrics is checked in tests/test_cluster.py.

promtool comes from Debian's prometheus package (raftsched/testing/promtool.py): when it cannot
be had, these tests are skipped only for a user who is not root (CI runs as root: it must be had).
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import re
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.core import queries
from raftsched.core.state import SchedulerState
from raftsched.core.stats import ApplyStats
from raftsched.node.http import FLEET
from raftsched.testing import promtool

from test_api import AUTH, SPEC, Env, put

REPO = Path(__file__).resolve().parent.parent


def promtool_check(args: list[str], stdin: str | None = None):
    path, why = promtool.fetch()
    if path is None:
        if os.geteuid() != 0:
            pytest.skip(why)
        pytest.fail(f"promtool is needed as root (CI): {why}")
    return promtool.run(args, stdin)


def check_metrics(text: str) -> None:
    """``promtool check metrics``: the format and its lint (names, units, _total, HELP)."""
    p = promtool_check(["check", "metrics"], text)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        f"promtool check metrics: {p.returncode}\n{p.stdout}\n{p.stderr}"


def sample(text: str, name: str, **labels) -> float | None:
    """The value of the series ``name{labels}`` in an exposition, or None."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if got == {k: str(v) for k, v in labels.items()}:
            return float(m.group(4))
    return None


def test_metrics_pass_promtool_and_count_records_starts_completions_requests_and_waits():
    """Slots a skip policy records, runs leased and completed, the oldest ready run, API requests
    by route template and status, proposals, the garbage collector: all in an exposition that
    promtool accepts."""
    async def main():
        env = Env(metrics=True)
        fleet_task = asyncio.create_task(env.app[FLEET].run())
        try:
            async with TestClient(TestServer(env.app, host="127.0.0.1"), headers=AUTH) as c:
                assert (await put(c, "a")).status == 201  # every 10 s, fire_all
                skip = dict(SPEC, misfire={"policy": "skip", "grace_s": 1})
                assert (await put(c, "s", skip)).status == 201
                late = dict(SPEC, queue="slow", deadline={"start_within_s": 5})
                assert (await put(c, "d", late)).status == 201  # its runs wait in a queue nobody leases
                env.clock.advance(35_000)
                await env.trigger.tick()  # a: slots 10, 20, 30 s queued; s: 10, 20 skipped, 30 late too
                env.clock.advance(10_000)
                await env.trigger.tick()  # d's slots missed their start deadline: judged by the sweep
                await env.trigger.tick()
                r = await c.post("/v1/workers/w1/lease", data=json.dumps(
                    {"slots": 1, "executors": ["shell"], "labels": {}, "queues": ["default"], "version": "1",
                     "instance": "i1", "max": 1, "wait_s": 0.2, "ttl_ms": 10_000}))
                grant = (await r.json())["runs"][0]
                env.clock.advance(2_000)
                r = await c.post("/v1/workers/w1/complete", data=json.dumps(
                    {"results": [{"run": grant["id"], "token": grant["token"], "success": True}]}))
                assert (await r.json())["results"][0]["ok"]
                assert (await c.get("/v1/jobs/nope")).status == 404
                assert (await c.get("/nowhere")).status == 404
                # the dashboard's redirect is raised, not returned: counted as a 500 (a walk)
                assert (await c.get("/ui", allow_redirects=False)).status == 308
                text = await (await c.get("/metrics")).text()
        finally:
            fleet_task.cancel()
            await asyncio.gather(fleet_task, return_exceptions=True)
        return env, grant, text

    env, grant, text = asyncio.run(main())
    check_metrics(text)
    assert sample(text, "raftsched_slots_recorded_total", state="skipped", reason="misfire") >= 2
    assert sample(text, "raftsched_slot_to_start_seconds_count") == 1
    # The process's start, which the alert rules read to leave out a node's counts re-applied at
    # its start (docs/operations.md), beside its CPU and memory.
    assert abs(sample(text, "process_start_time_seconds") - proc_start_time()) < 5
    assert sample(text, "process_resident_memory_bytes") > 0
    # The oldest run was leased first: its slot 10 s in, leased at 45 s, completed at 47 s.
    assert sample(text, "raftsched_slot_to_start_seconds_sum") == 35
    assert sample(text, "raftsched_slot_to_start_seconds_bucket", le="60.0") == 1
    assert sample(text, "raftsched_slot_to_start_seconds_bucket", le="30.0") == 0
    assert sample(text, "raftsched_slot_to_completion_seconds_sum") == 37
    assert (sample(text, "raftsched_deadlines_judged_total", outcome="missed", deadline="start_within_s",
                   cause="never_started") or 0) >= 3
    assert sample(text, "raftsched_runs_finished_total", state="succeeded") == 1
    assert sample(text, "raftsched_runs", state="queued") == 7  # a: 20, 30, 40 s; d: 10, 20, 30, 40 s
    # a's runs still queued (slots 20, 30, 40 s at 47 s): the oldest waited 27 s; d's since 10 s.
    assert sample(text, "raftsched_queue_oldest_ready_seconds", queue="default") == 27
    assert sample(text, "raftsched_queue_oldest_ready_seconds", queue="slow") == 37
    assert sample(text, "raftsched_api_requests_total", method="PUT", route="/v1/jobs/{name}", status=201) == 3
    assert sample(text, "raftsched_api_requests_total", method="GET", route="/v1/jobs/{name}", status=404) == 1
    assert sample(text, "raftsched_api_requests_total", method="GET", route="unmatched", status=404) == 1
    assert sample(text, "raftsched_api_requests_total", method="GET", route="/ui", status=308) == 1
    assert sample(text, "raftsched_api_requests_total", method="GET", route="/ui", status=500) is None
    assert sample(text, "raftsched_read_barrier_seconds_count") == 1
    # The collections are CPython's own count since the process started, never a stale 0.
    assert sample(text, "raftsched_gc_collections_total", generation=2) is None  # no GcPauses in this app
    assert gc.get_stats()[0]["collections"] > 0


def test_apply_stats_are_a_counter_per_reason_and_buckets_outside_the_snapshot():
    """core/stats.py: records count their slots (a range counts each), queued runs skipped later
    count too; the counters are no part of a snapshot, so replicas stay byte-identical."""
    st = ApplyStats()
    st.on_entry({"state": "coalesced", "reason": "misfire", "count": 5})
    st.on_entry({"state": "skipped", "reason": "overlap"})
    st.on_entry({"state": "queued"})
    st.on_recorded("skipped", "paused")
    st.on_start({"kind": "scheduled", "slot": 1000}, 1030)
    st.on_start({"kind": "scheduled", "slot": 1000, "attempts": [{}]}, 9000)  # a retry: not a start
    st.on_start({"kind": "manual", "slot": 1000}, 9000)
    assert st.recorded == {("coalesced", "misfire"): 5, ("skipped", "overlap"): 1, ("skipped", "paused"): 1}
    assert sum(st.slot_to_start.counts) == 1 and st.slot_to_start.sum_ms == 30
    s = SchedulerState()
    before, digest = s.snapshot(), s.state_hash()
    s.stats.on_recorded("skipped", "misfire", 3)
    assert (s.snapshot(), s.state_hash()) == (before, digest)
    assert queries.apply_stats(s)["recorded"] == {("skipped", "misfire"): 3}


def test_what_a_node_replays_at_its_start_is_not_counted_again():
    """SchedulerState.replaying (replication's replay of what the process before applied): the
    metrics read the counts held aside, the replay's go to a scratch copy and are dropped, and a
    worker's drains carry on through it (the dispatcher reads them as they move)."""
    s = SchedulerState()
    s.stats.on_recorded("skipped", "misfire", 2)
    s.stats.drains = 4
    s.replaying(True)
    s.stats.on_recorded("skipped", "misfire", 3)  # an entry applied again
    s.stats.on_finished("dead")
    s.stats.drains += 1
    assert queries.apply_stats(s)["recorded"] == {("skipped", "misfire"): 2}
    assert queries.apply_stats(s)["finished"] == {}
    assert queries.drains_count(s) == 5
    s.replaying(True)  # (twice: nothing more)
    s.replaying(False)
    s.replaying(False)
    s.stats.on_recorded("skipped", "misfire", 1)  # past the replay: counted
    assert queries.apply_stats(s)["recorded"] == {("skipped", "misfire"): 3}
    assert queries.apply_stats(s)["finished"] == {}
    assert queries.drains_count(s) == 5


def proc_start_time() -> float:
    """This process's start (s since the epoch), from /proc as the kernel counts it."""
    import os
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return btime + start_ticks / os.sysconf("SC_CLK_TCK")


def alert_rules() -> str:
    """The alert rules docs/operations.md shows (the yaml block after "Alert rules")."""
    text = (REPO / "docs" / "operations.md").read_text()
    m = re.search(r"<!-- alert-rules -->\s*```yaml\n(.*?)```", text, re.S)
    assert m, "docs/operations.md has no alert rules block (<!-- alert-rules --> then ```yaml)"
    return m.group(1)


def test_the_alert_rules_in_operations_md_pass_promtool_and_name_metrics_the_nodes_export(tmp_path):
    rules = alert_rules()
    f = tmp_path / "rules.yml"
    f.write_text(rules)
    p = promtool_check(["check", "rules", str(f)])
    assert p.returncode == 0, f"promtool check rules: {p.stdout}\n{p.stderr}"
    assert "SUCCESS" in p.stdout
    for name in ("NoLeader", "FireLag", "DeadLetterQueueGrowing", "DeadlineMisses", "NotificationsStuck",
                 "NotificationsDead"):
        assert f"alert: {name}" in rules
    # The scrape configuration beside them, with the rules file it names (the token file it reads
    # made here: promtool checks that it exists).
    text = (REPO / "docs" / "operations.md").read_text()
    m = re.search(r"```yaml\n(# prometheus.yml\n.*?)```", text, re.S)
    assert m, "docs/operations.md has no scrape configuration (```yaml then # prometheus.yml)"
    (tmp_path / "raftsched.token").write_text("rst_0000000000000000_x\n")
    conf = tmp_path / "prometheus.yml"
    conf.write_text(m.group(1).replace("/etc/prometheus/raftsched.token", str(tmp_path / "raftsched.token")))
    f.rename(tmp_path / "raftsched-rules.yml")
    p = promtool_check(["check", "config", str(conf)])
    assert p.returncode == 0, f"promtool check config: {p.stdout}\n{p.stderr}"
    # Every raftsched_ series a rule reads is one the code exports (a renamed metric breaks this).
    source = "\n".join(p.read_text() for p in (REPO / "raftsched").rglob("*.py"))
    for metric in set(re.findall(r"raftsched_[a-z_]+", rules)):
        base = re.sub(r"_(total|bucket|count|sum)$", "", metric)
        assert f'"{base}' in source, f"{metric} is read by an alert rule but no code exports it"


def test_paused_jobs_are_counted_as_they_change_not_walked_at_a_scrape():
    """raftsched_jobs_paused comes from a count jobs.py keeps (a pause twice counts once; resume,
    delete, a replace and a restore keep it true), checked against a walk of the jobs."""
    from raftsched.clock import FakeClock
    from raftsched.node.service import Service

    from fakes import FakeRaft

    def walk(s):
        return sum(1 for j in s.jobs.values() if j["paused"])

    async def main():
        s = SchedulerState()
        svc = Service(FakeRaft(s), FakeClock(), "n1")
        for n in ("a", "b", "c"):
            await svc.put_job(n, SPEC, None)
        steps = [svc.pause_job("a", None), svc.pause_job("a", None), svc.pause_job("b", None),
                 svc.put_job("b", dict(SPEC, history=5), None), svc.resume_job("a", None, False),
                 svc.pause_job("c", None), svc.delete_job("c", None)]
        for step in steps:
            await step
            assert queries.gauges(s)["jobs_paused"] == walk(s)
        assert walk(s) == 1  # b: paused, replaced (a replace keeps the pause)
        restored = SchedulerState()
        restored.restore(s.snapshot())
        assert queries.gauges(restored)["jobs_paused"] == 1
    asyncio.run(main())


def test_the_series_the_alert_rules_read_exist_at_zero_before_their_first_event():
    """An SRE's walk: raftsched_deadlines_judged_total and raftsched_dlq_runs had no series
    until their first event, and a series that first appears at 1 has no increase() or delta()
    in PromQL: DeadlineMisses and DeadLetterQueueGrowing never fired for the first miss or the
    first dead run after a node started. Every series they read is there from the first scrape."""
    async def main():
        env = Env(metrics=True)
        async with TestClient(TestServer(env.app, host="127.0.0.1"), headers=AUTH) as c:
            assert (await put(c, "a", dict(SPEC, queue="reports"))).status == 201
            return await (await c.get("/metrics")).text()
    text = asyncio.run(main())
    check_metrics(text)
    from raftsched.core import deadlines
    for which in deadlines.FIELDS:
        for cause in deadlines.CAUSES:
            assert sample(text, "raftsched_deadlines_judged_total", outcome="missed", deadline=which, cause=cause) == 0
    for which in deadlines.WHICH:
        assert sample(text, "raftsched_deadlines_judged_total", outcome="late", deadline=which, cause="none") == 0
    for state in ("succeeded", "failed", "dead"):
        assert sample(text, "raftsched_runs_finished_total", state=state) == 0
    from raftsched.node.metrics import RECORDED_ALERTED
    for state, reason in RECORDED_ALERTED:  # (SlotsMissed's: a walk found no series before the first)
        assert sample(text, "raftsched_slots_recorded_total", state=state, reason=reason) == 0, (state, reason)
    assert sample(text, "raftsched_dlq_runs", queue="reports") == 0, "a queue a job names, not declared"
    # (a re-walk: what repeat_every_s holds back had no series until its first)
    for kind in ("deadline.missed", "slot.missed", "run.dead"):
        assert sample(text, "raftsched_events_held_back_total", kind=kind) == 0, kind
    assert sample(text, "raftsched_events_held_back_total", kind="worker.lost") is None  # (no route holds one back)


def _promtool_test(tmp_path, series: list[str], tests: str) -> None:
    """``promtool test rules`` of docs/operations.md's alert rules on ``series`` (lines of
    ``- series: ... values: ...``) and ``tests`` (alert_rule_test items), one sample a minute."""
    (tmp_path / "rules.yml").write_text(alert_rules())
    (tmp_path / "test.yml").write_text(f"""rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{chr(10).join(series)}
    alert_rule_test:
{tests}""")
    p = promtool_check(["test", "rules", str(tmp_path / "test.yml")])
    assert p.returncode == 0, f"promtool test rules: {p.stdout}\n{p.stderr}"


def _missed(n: int, values: str) -> str:
    return (f"""      - series: 'raftsched_deadlines_judged_total{{job="raftsched",instance="n{n}",outcome="missed","""
            f"""deadline="start_within_s",cause="never_started"}}'\n        values: '{values}'""")


_MISS_ALERT = """        exp_alerts:
          - exp_labels: {severity: ticket, deadline: start_within_s, cause: never_started}
            exp_annotations:
              summary: "slots missed their start_within_s (never_started)"
              description: "GET /v1/deadlines?state=missed lists them with why; raftsched_queue_oldest_ready_seconds shows runs waiting for a worker."
"""


def test_deadline_misses_fires_for_a_miss_right_after_a_whole_cluster_restart(tmp_path):
    """DeadlineMisses as docs/operations.md writes it: three nodes that all restarted (their
    counters back at 0, as a restart leaves them now that a replay is not counted again) count a
    miss two minutes later, and the alert fires. The rule left out nodes younger than its window,
    so it stayed silent for 15 minutes after a power cut; and it does not fire across the restarts
    alone."""
    _promtool_test(tmp_path, [_missed(n, "4x9 0 0 1x10") for n in (1, 2, 3)], f"""      - eval_time: 11m
        alertname: DeadlineMisses
        exp_alerts: []
      - eval_time: 13m
        alertname: DeadlineMisses
{_MISS_ALERT}""")


def test_deadline_misses_fires_for_what_a_cluster_back_from_a_long_outage_judged_before_its_first_scrape(tmp_path):
    """An on-call walk: the cluster away 30 minutes judges the outage's misses within a second of
    its start, before any scrape: the first sample holds them, and increase() shows nothing. The
    rule fires for them while no node was scraped 15 minutes before; a single node back from as
    long an absence, catching up on what the others told already, does not fire it."""
    _promtool_test(tmp_path, [_missed(n, "2x9 _x30 3x20") for n in (1, 2, 3)], f"""      - eval_time: 41m
        alertname: DeadlineMisses
{_MISS_ALERT}      - eval_time: 58m
        alertname: DeadlineMisses
        exp_alerts: []
""")
    _promtool_test(tmp_path, [_missed(1, "2x60"), _missed(2, "2x60"), _missed(3, "2x9 _x30 5x20")], """      - eval_time: 41m
        alertname: DeadlineMisses
        exp_alerts: []
      - eval_time: 50m
        alertname: DeadlineMisses
        exp_alerts: []
""")


def _fires_then_ends(tmp_path, series: str, alert: str, quiet: int, fires: int, ended: int, labels: str,
                     annotations: tuple[str, str]) -> None:
    """``promtool test rules`` of one alert on one series (``- series`` line and its ``values``):
    silent at minute ``quiet``, firing with ``labels`` and ``annotations`` (summary, description)
    at ``fires``, ended at ``ended``."""
    _promtool_test(tmp_path, [series], f"""      - eval_time: {quiet}m
        alertname: {alert}
        exp_alerts: []
      - eval_time: {fires}m
        alertname: {alert}
        exp_alerts:
          - exp_labels: {{{labels}}}
            exp_annotations:
              summary: "{annotations[0]}"
              description: "{annotations[1]}"
      - eval_time: {ended}m
        alertname: {alert}
        exp_alerts: []
""")


def test_slots_missed_fires_for_slots_an_outage_made_miss_and_not_for_a_pause(tmp_path):
    """A walk: no shipped rule said a slot did not run, the product's promise. SlotsMissed fires
    for slots recorded misfire (an outage), and not for those a pause recorded."""
    _fires_then_ends(tmp_path, """      - series: 'raftsched_slots_recorded_total{job="raftsched",instance="n1",state="skipped",reason="misfire"}'
        values: '0x9 3x60'
      - series: 'raftsched_slots_recorded_total{job="raftsched",instance="n1",state="skipped",reason="paused"}'
        values: '0x40 5x60'""", "SlotsMissed", 9, 12, 45, "severity: ticket, reason: misfire",
                     ("slots did not run (misfire)", "GET /v1/runs?state=skipped (or a job's runs) lists each record "
                      "with its reason and range; an outage's are misfire, decided by each job's misfire policy "
                      "(docs/misfire.md)."))


def test_dead_letter_queue_growing_fires_for_one_dead_run_and_ends(tmp_path):
    """An on-call walk: with "for: 30m" over a 30-minute delta, a single dead run (a nightly job's)
    kept the expression true for less than its "for", and the alert never fired."""
    _fires_then_ends(tmp_path, """      - series: 'raftsched_dlq_runs{job="raftsched",instance="n1",queue="default"}'
        values: '0x9 1x60'""", "DeadLetterQueueGrowing", 9, 12, 45, "severity: ticket, queue: default",
                     ("dead-letter queue default grew", "Runs of default ended dead in the last 30 minutes: GET "
                      "/v1/dlq?queue=default shows each attempt's error."))


def test_notifications_stuck_pages_from_any_node_across_a_fail_over(tmp_path):
    """An on-call walk: a sink down for minutes showed no condition, and the only gauge of it
    lived on the leader and started again at each fail-over. The oldest pending event's age is
    the replicated state's, so any node's sample pages at 15 minutes, whichever node leads, and
    the page ends once the sink was sent it."""
    series = []
    for n in (1, 2):  # one node's samples stop at 10 m (killed); the other's go on
        ages = "0 60+60x17 0x5" if n == 2 else "0 60+60x9"
        series.append(f"""      - series: 'raftsched_sink_oldest_pending_seconds{{job="raftsched",instance="n{n}",sink="ops"}}'
        values: '{ages}'""")
    _promtool_test(tmp_path, series, """      - eval_time: 14m
        alertname: NotificationsStuck
        exp_alerts: []
      - eval_time: 18m
        alertname: NotificationsStuck
        exp_alerts:
          - exp_labels: {severity: page, sink: ops}
            exp_annotations:
              summary: "sink ops has not been sent an event for 18m 0s"
              description: "raftsched sinks get ops shows behind; the leader's log says why (sink ... cannot be reached / refused). Alerts routed only to it are not reaching anyone."
      - eval_time: 22m
        alertname: NotificationsStuck
        exp_alerts: []
""")
    # A lagging replica (or a removed node still scraped) that sees an old event pending while
    # the others have sent it does not page.
    lag = ["""      - series: 'raftsched_sink_oldest_pending_seconds{job="raftsched",instance="n1",sink="ops"}'
        values: '0 60+60x30'""", """      - series: 'raftsched_sink_oldest_pending_seconds{job="raftsched",instance="n2",sink="ops"}'
        values: '0x31'"""]
    _promtool_test(tmp_path, lag, """      - eval_time: 25m
        alertname: NotificationsStuck
        exp_alerts: []
""")


def test_notifications_dead_fires_past_a_full_dead_list(tmp_path):
    """A review: the dead list is bounded (1 000), so its length stopped moving once full and a
    delta() of it said nothing of the events still going dead. The rule reads a counter."""
    _fires_then_ends(tmp_path, """      - series: 'raftsched_sink_events_given_up_total{job="raftsched",instance="n1",sink="ops"}'
        values: '1000x9 1005x40'""", "NotificationsDead", 8, 12, 45, "severity: ticket, sink: ops",
                     ("sink ops gave up on events", "raftsched sinks dead ops shows them with the last error; "
                      "raftsched sinks requeue ops sends them again."))


def test_dead_letter_queue_growing_fires_for_a_dead_run_that_left_the_gauge_as_it_was(tmp_path):
    """A walk: a dead run beside one purged from its dead-letter queue left raftsched_dlq_runs
    14 -> 13 -> 14, a delta of 0, and the alert stayed silent (so would a full queue, or a
    re-drive whose runs died again). The count of dead runs fires it, queue "(any)"."""
    _fires_then_ends(tmp_path, """      - series: 'raftsched_dlq_runs{job="raftsched",instance="n1",queue="walk"}'
        values: '14x8 13 14x60'
      - series: 'raftsched_runs_finished_total{job="raftsched",instance="n1",state="dead"}'
        values: '24x9 25x60'""", "DeadLetterQueueGrowing", 8, 12, 45, 'severity: ticket, queue: "(any)"',
                     ("dead-letter queue (any) grew", "Runs of (any) ended dead in the last 30 minutes: GET "
                      "/v1/dlq shows each attempt's error."))
