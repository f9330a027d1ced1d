"""Three real node processes on free loopback ports (docs/design.md I2, I8, I9, I10)."""
from __future__ import annotations

import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from procs import Cluster, http, running_cluster, wait_for

pytestmark = pytest.mark.cluster

EVERY_S = {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]}, "history": 1000}


def runs_of(c: Cluster, i: int, job: str) -> list[dict]:
    s, b = c.get(i, f"/v1/jobs/{job}/runs?limit=5000&consistent=true")
    assert s == 200, b
    return b["runs"]


def assert_slots_accounted(runs: list[dict], every_ms: int, policy: str) -> None:
    """No slot is two runs; every slot between the first and the last is a run or inside a
    record whose state the policy allows."""
    ids = [r["id"] for r in runs]
    assert len(ids) == len(set(ids)), "I2: a run id appears twice"
    scheduled = [r for r in runs if r["kind"] == "scheduled"]
    slots = [r["slot_ms"] for r in scheduled]
    assert len(slots) == len(set(slots)), "I2: a slot became two runs"
    covered = set(slots)
    allowed = {"fire_all": {"skipped"}, "fire_once": {"coalesced"}, "skip": {"skipped"}}[policy]
    recs = [r for r in runs if r["state"] in ("skipped", "coalesced")]
    for r in recs:
        assert r["state"] in allowed, r
        lo = r["slot_ms"]
        hi = lo if "slot_to" not in r else None
        if hi is None:
            # slot_to is ISO; recompute from count for intervals
            hi = lo + (r["count"] - 1) * every_ms
        for s in range(lo, hi + 1, every_ms):
            assert s not in covered, f"slot {s} is both a run and recorded"
            covered.add(s)
    if not covered:
        return
    lo, hi = min(covered), max(covered)
    missing = [s for s in range(lo, hi + 1, every_ms) if s not in covered]
    assert not missing, f"slots neither run nor recorded: {missing[:5]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("cluster"))


def test_one_leader_agreed_by_all(cluster):
    i = cluster.wait_leader(30)
    sts = [cluster.status(j) for j in range(3)]
    assert [s["role"] for s in sts].count("leader") == 1
    assert {s["leader"] for s in sts} == {cluster.raft_addr(i)}
    assert all(sorted(s["members"]) == sorted(cluster.raft_addr(j) for j in range(3)) for s in sts)


def test_job_registered_on_follower_gets_runs_on_time(cluster):
    leader = cluster.wait_leader(30)
    follower = (leader + 1) % 3
    s, b = cluster.call(follower, "PUT", "/v1/jobs/tick", dict(EVERY_S, misfire={"policy": "skip", "grace_s": 2}))
    assert s in (200, 201), b
    wait_for(lambda: len([r for r in runs_of(cluster, follower, "tick") if r["kind"] == "scheduled"]) >= 3, 20, "three runs")
    runs = runs_of(cluster, (leader + 2) % 3, "tick")
    assert all(r["kind"] == "scheduled" for r in runs), "no slot was recorded as missed with a healthy leader"
    assert all(r["fire_lag_ms"] < 2000 for r in runs), [r["fire_lag_ms"] for r in runs]
    assert_slots_accounted(runs, 1000, "skip")


def test_batch_registration_through_a_follower_reaches_every_replica(cluster):
    """POST /v1/jobs:batch: 800 jobs (several put_jobs commands, pipelined) sent to a follower are
    on every replica; the same body with the same key again applies nothing; an invalid job
    makes the whole batch 422 and changes nothing."""
    leader = cluster.wait_leader(30)
    follower = (leader + 1) % 3
    spec = {"schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
            "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    jobs = {f"bulk-{k:04d}": spec for k in range(800)}
    key = {"Idempotency-Key": "bulk-import-1"}
    s, b = cluster.call(follower, "POST", "/v1/jobs:batch", {"jobs": jobs}, headers=key, timeout=60)
    assert s == 200, b
    assert b["created"] == 800 and b["commands"] > 1
    gens = {n: r["gen"] for n, r in b["jobs"].items()}

    def bulk_jobs(i):
        s, page = cluster.get(i, "/v1/jobs?limit=1000&after=bulk-&consistent=true")
        assert s == 200, page
        return {j["name"]: j["state"]["generation"] for j in page["jobs"] if j["name"].startswith("bulk-")}
    for i in range(3):
        assert bulk_jobs(i) == gens, f"node-{i + 1}"
    s, again = cluster.call(leader, "POST", "/v1/jobs:batch", {"jobs": jobs}, headers=key, timeout=60)
    assert s == 200 and again.get("duplicate") is True, again
    assert {n: r["gen"] for n, r in again["jobs"].items()} == gens
    bad = dict(jobs, **{"bulk-zz-new": spec, "bulk-zz-bad": dict(spec, misfire={"policy": "sometimes"})})
    s, b = cluster.call(follower, "POST", "/v1/jobs:batch", {"jobs": bad}, timeout=60)
    assert s == 422 and (b["error"]["job"], b["error"]["field"]) == ("bulk-zz-bad", "misfire.policy"), b
    assert bulk_jobs(follower) == gens


def test_a_heartbeat_job_pinged_over_http_meets_its_deadline_and_misses_it_when_not_pinged(cluster):
    """A dead-man's switch (docs/notifications.md, "Deadlines"): a heartbeat job's slot is pinged
    by a plain HTTP POST with a ping token bound to it, as curl would, and meets its deadline; the
    next slots, not pinged, miss theirs (never_started), judged by the leader's sweep."""
    leader = cluster.wait_leader(30)
    s, tok = cluster.call(leader, "POST", "/v1/tokens", {"role": "ping", "jobs": ["hb"]})
    assert s == 201, tok
    spec = {"schedule": {"every_s": 3}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
            "deadline": {"succeed_within_s": 2}}
    s, b = cluster.call(leader, "PUT", "/v1/jobs/hb", spec)
    assert s == 201, b
    follower = (leader + 1) % 3
    url = f"{cluster.url(follower)}/v1/jobs/hb/ping"

    def waiting():
        return [r for r in runs_of(cluster, follower, "hb") if r["state"] == "waiting"]
    wait_for(waiting, 15, "a slot of the heartbeat job waiting for its ping")
    s, b = http("POST", url, {"status": "success"}, token=tok["token"])
    assert s == 200 and b["state"] == "succeeded", b
    s, run = cluster.get(follower, f"/v1/runs/{b['run']}?consistent=true")
    assert s == 200 and run["deadline"]["state"] == "met", run
    # Not pinged from now on: the next slot misses its deadline.

    def missed():
        s, d = cluster.get(follower, "/v1/deadlines?state=missed&job=hb&consistent=true")
        assert s == 200, d
        return [x for x in d["deadlines"] if x["slot_ms"] > run["slot_ms"]]
    got = wait_for(missed, 15, "a missed deadline")
    assert got[0]["cause"] == "never_started" and got[0]["deadline"] == "succeed_within_s", got
    s, b = http("POST", f"{cluster.url(follower)}/v1/jobs/tick/ping", {"status": "start"}, token=tok["token"])
    assert s == 403 and b["error"]["field"] == "name", b
    s, b = cluster.call(leader, "DELETE", "/v1/jobs/hb")
    assert s == 200, b


@pytest.mark.parametrize("policy", ["fire_once", "skip"])
def test_kill_leader_schedule_carries_on(cluster, policy):
    """kill -9 of the leader: a new leader, the job keeps getting runs, no slot has two runs,
    slots missed while leaderless follow the policy (grace 1 s so a fail-over can miss some)."""
    name = f"failover-{policy.replace('_', '-')}"
    leader = cluster.wait_leader(30)
    s, b = cluster.call(leader, "PUT", f"/v1/jobs/{name}", dict(EVERY_S, misfire={"policy": policy, "grace_s": 1}))
    assert s in (200, 201), b
    wait_for(lambda: len(runs_of(cluster, leader, name)) >= 2, 20, "first runs")
    cluster.kill(leader, signal.SIGKILL)
    survivors = [j for j in range(3) if j != leader]
    new = cluster.wait_leader(30, among=survivors)
    assert new != leader
    before = len(runs_of(cluster, new, name))
    wait_for(lambda: len(runs_of(cluster, new, name)) >= before + 3, 20, "runs after fail-over")
    for j in survivors:
        assert_slots_accounted(runs_of(cluster, j, name), 1000, policy)
    # Bring the old leader back on its data: it catches up and agrees.
    cluster.start(leader)
    cluster.wait_leader(30)
    wait_for(lambda: len(runs_of(cluster, leader, name)) >= before + 3, 30, "restarted node catches up")
    assert_slots_accounted(runs_of(cluster, leader, name), 1000, policy)


def test_a_follower_left_alone_says_it_has_no_leader(tmp_path):
    """A walk: the leader and one follower killed, the follower left answered /healthz 200
    naming the dead leader, and reported no cluster.no_leader, for good (pysyncobj forgets a
    leader only when it stands for election, which it does only while connected to a peer).
    docs/operations.md, "Two nodes down": 503, and the condition after 3 s."""
    c = Cluster(tmp_path, n=3)
    c.start()
    try:
        leader = c.wait_leader(30)
        other = next(j for j in range(3) if j != leader)
        alone = next(j for j in range(3) if j not in (leader, other))
        c.kill(leader, signal.SIGKILL)
        c.kill(other, signal.SIGKILL)
        wait_for(lambda: c.get(alone, "/healthz")[0] == 503, 15, "the survivor's /healthz 503")
        wait_for(lambda: any(x.get("type") == "cluster.no_leader" for x in c.get(alone, "/v1/cluster")[1]
                             .get("conditions", ())), 15, "cluster.no_leader on the survivor")
        assert c.get(alone, "/v1/cluster")[1]["leader"] is None
    finally:
        c.stop()


def test_whole_cluster_restart_keeps_jobs_and_history(tmp_path):
    c = Cluster(tmp_path)
    c.start()
    try:
        leader = c.wait_leader(30)
        for k in range(5):
            s, b = c.call(leader, "PUT", f"/v1/jobs/keep-{k}", dict(EVERY_S, misfire={"policy": "fire_all"}))
            assert s in (200, 201), b
        wait_for(lambda: len(runs_of(c, leader, "keep-0")) >= 3, 20, "runs")
        s, jobs_before = c.get(leader, "/v1/jobs?consistent=true")
        history_before = runs_of(c, leader, "keep-0")
        for j in range(3):
            c.kill(j, signal.SIGKILL)
        c.start()
        leader = c.wait_leader(30)
        s, jobs_after = c.get(leader, "/v1/jobs?consistent=true")
        assert s == 200
        assert sorted(j["name"] for j in jobs_after["jobs"]) == [f"keep-{k}" for k in range(5)]
        after = {r["id"]: r for r in runs_of(c, leader, "keep-0")}
        for r in history_before:
            assert r["id"] in after, f"run {r['id']} lost across a full restart"
        wait_for(lambda: len(runs_of(c, leader, "keep-0")) > len(after), 20, "firing resumes")
        assert_slots_accounted(runs_of(c, leader, "keep-0"), 1000, "fire_all")
    finally:
        c.stop()


def test_a_node_stopped_by_sigterm_writes_its_dump_first(tmp_path):
    """A graceful stop dumps what the node applied (docs/operations.md, Upgrading); before, a
    node wrote one only after 5 000 entries or 5 minutes."""
    c = Cluster(tmp_path)
    c.start()
    try:
        leader = c.wait_leader(30)
        s, b = c.call(leader, "PUT", "/v1/jobs/dumped", dict(EVERY_S, misfire={"policy": "fire_all"}))
        assert s in (200, 201), b
        wait_for(lambda: len(runs_of(c, leader, "dumped")) >= 2, 20, "runs")
        i = (leader + 1) % 3
        dump = c.data_dir(i) / "raft.dump"
        assert not dump.exists()
        c.children.stop(i)  # SIGTERM, by its PID, and waits for it to exit
        assert c.procs[i].returncode == 0, c.log_tail(i)
        assert dump.exists(), c.log_tail(i)
        assert "replication.dumped_on_stop" in c.log_path(i).read_text(), c.log_tail(i)
    finally:
        c.stop()


def test_a_leader_stopped_by_sigterm_hands_its_leadership_over_first(tmp_path):
    """A walk's rolling restart: stopping the leader was ~1.5 s of 503 on every node, until the
    others' election timeout elected one. It hands its leadership to a caught-up voter first
    (replication.handed_over), and another node leads before it is gone; a lone node, with
    nobody to hand over to, just stops."""
    c = Cluster(tmp_path)
    c.start()
    try:
        leader = c.wait_leader(30)
        c.children.stop(leader)  # SIGTERM, by its PID, and waits for it to exit
        assert c.procs[leader].returncode == 0, c.log_tail(leader)
        text = c.log_path(leader).read_text()
        assert "replication.handed_over" in text and "hand_over_timeout" not in text, c.log_tail(leader)
        assert c.wait_leader(30, among=[j for j in range(3) if j != leader]) != leader
    finally:
        c.stop()


def test_node_without_secret_refuses_to_start(tmp_path):
    c = Cluster(tmp_path, n=1, secret=None)
    argv = [a for a in c.argv(0)]
    k = argv.index("--cluster-secret-file")
    del argv[k:k + 2]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "cluster-secret-file is required" in p.stderr


def test_node_with_world_readable_secret_refuses(tmp_path):
    c = Cluster(tmp_path, n=1)
    c.secret_file.chmod(0o644)
    p = subprocess.run(c.argv(0), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "readable by others" in p.stderr


def test_mutation_without_token_is_refused(cluster):
    s, b = http("PUT", cluster.url(0) + "/v1/jobs/nope", dict(EVERY_S, misfire={"policy": "skip"}))
    assert s == 401
    assert b["error"]["code"] == "unauthorized"
    s, b = http("PUT", cluster.url(0) + "/v1/jobs/nope", dict(EVERY_S, misfire={"policy": "skip"}), token="wrong" * 8)
    assert s == 401
    s, b = cluster.get(0, "/v1/jobs/nope")
    assert s == 404


def test_a_token_made_on_one_node_works_on_every_node_until_revoked_on_another(cluster):
    """Tokens live in the replicated state: every node checks them against its replica, and a
    revocation committed through one node is refused by every node once it has applied it."""
    alive = [i for i in cluster.alive()]
    assert len(alive) >= 2
    s, made = cluster.call(alive[0], "POST", "/v1/tokens", {"role": "reader"})
    assert s == 201, made
    tok = made["token"]

    def statuses():
        return [http("GET", cluster.url(i) + "/v1/jobs?limit=1", token=tok)[0] for i in alive]
    wait_for(lambda: statuses() == [200] * len(alive), 10, "every node to accept the new token")
    s, b = cluster.call(alive[-1], "DELETE", f"/v1/tokens/{made['id']}")
    assert s == 200, b
    assert http("GET", cluster.url(alive[-1]) + "/v1/jobs?limit=1", token=tok)[0] == 401, "at once where revoked"
    wait_for(lambda: statuses() == [401] * len(alive), 10, "every node to refuse the revoked token")


def test_one_node_cluster_works_without_peers(tmp_path):
    c = Cluster(tmp_path, n=1)
    c.start()
    try:
        c.wait_leader(30)
        s, b = c.call(0, "PUT", "/v1/jobs/solo", dict(EVERY_S, misfire={"policy": "skip"}))
        assert s == 201, b
        wait_for(lambda: len(runs_of(c, 0, "solo")) >= 2, 20, "runs on a one-node cluster")
    finally:
        c.stop()


def test_a_write_acknowledged_by_one_node_is_read_by_the_next_get_on_another(cluster):
    """Reads are linearizable by default (node/reads.py): a job created through one node is there
    for a GET on another node sent as soon as the create was answered, every time (before the
    read barrier, a follower that had not yet heard of the commit answered 404). A burst of
    concurrent reads costs a few barrier rounds, not one each."""
    leader = cluster.wait_leader(30)
    pairs = [(leader, (leader + 1) % 3), ((leader + 1) % 3, (leader + 2) % 3)]
    spec = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    missed = []
    for k in range(20):
        writer, reader = pairs[k % 2]
        s, b = cluster.call(writer, "PUT", f"/v1/jobs/ryw-{k}", spec)
        assert s == 201, b
        s, b = cluster.get(reader, f"/v1/jobs/ryw-{k}")
        if s != 200:
            missed.append((k, s))
    assert not missed, f"GETs that did not see the write just acknowledged: {missed}"
    s, b = cluster.get(pairs[0][1], "/v1/jobs/ryw-0?stale=true")
    assert s == 200

    def rounds(i):
        s, text = cluster.get(i, "/metrics")
        assert s == 200
        line = next(x for x in text.splitlines() if x.startswith("raftsched_read_barrier_rounds_total "))
        return float(line.split()[1])
    reader = pairs[0][1]
    before = rounds(reader)
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda k: cluster.get(reader, f"/v1/jobs/ryw-{k % 20}")[0], range(64)))
    assert answers == [200] * 64
    spent = rounds(reader) - before  # /metrics itself waits for no round
    assert spent <= 16, f"64 concurrent reads cost {spent} barrier rounds"


def test_a_nodes_metrics_pass_promtool_and_its_elections_say_why(cluster):
    """The leader's /metrics passes ``promtool check metrics`` (tests/test_metrics_prom.py for
    what the series count); the leader counts the leadership it gained with its cause, and its
    log says why its role changed."""
    from test_metrics_prom import check_metrics, sample
    leader = cluster.wait_leader(30)
    causes = {"election_timeout", "transfer", "higher_term", "leader_seen", "quorum_lost", "clock_step_down"}
    for i in cluster.alive():
        s, text = cluster.get(i, "/metrics")
        assert s == 200
        if i == leader:  # the most series (each follower's lag); promtool costs a second or more a run
            check_metrics(text)
        assert (sample(text, "raftsched_gc_collections_total", generation=0) or 0) > 0, "CPython has collected"
        assert (sample(text, "raftsched_proposals_total", outcome="ok") or 0) > 0
        got = [(d["change"], d["cause"]) for d in (dict(re.findall(r'(\w+)="(\w+)"', labels)) for labels in
               re.findall(r"^raftsched_raft_leadership_changes_total\{([^}]*)\}", text, re.M))]
        assert {c for _, c in got} <= causes, got
        if i == leader:
            assert any(ch == "gained" for ch, _ in got), text
    log = cluster.log_path(leader).read_text(errors="replace")
    assert re.search(r"replication\.role .*role=leader .*cause=(election_timeout|transfer) \(", log), \
        "the leader's log says why it became leader"
