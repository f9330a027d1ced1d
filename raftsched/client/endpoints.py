"""Every endpoint of the API as a function from a client method's arguments to the
:class:`~raftsched.client.core.Request` it sends, written once: the method, the path, the query,
the body, the idempotency key, the per-call timeouts and how an error is recovered.

:class:`raftsched.client.Client` and :class:`raftsched.AsyncClient` each have one method per
function here, with the same name and parameters, whose body hands the description to its
transport (``return self._send(endpoints.put_job(name, spec, create_only))``);
tests/test_client_layout.py checks that, and tests/test_client_coverage.py that every route of
the API has one. No I/O here: a function only describes (``put_jobs`` refuses a batch that is too
large before anything is sent).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..core import limits
from ..core.records import cut_by
from .core import LockHeld, LockLost, Request, conflict_as, none_if_not_found, quote as _q

#: ``limit`` of a page of jobs, runs or dead runs when none is given (the API's own default).
PAGE_LIMIT_DEFAULT = 100
#: Slots a preview answers when no ``count`` is given.
PREVIEW_COUNT_DEFAULT = 10


class _Unset:
    """The default of an argument whose None is a value (a payload may be null)."""

    def __repr__(self) -> str:
        return "UNSET"


#: "not given", for arguments whose None is a value (a payload may be null).
UNSET: Any = _Unset()

#: Every endpoint function, by name (the clients' endpoint methods have these names).
ENDPOINTS: dict[str, Callable[..., Request]] = {}


def endpoint(fn: Callable[..., Request]) -> Callable[..., Request]:
    ENDPOINTS[fn.__name__] = fn
    return fn


def _consistent(consistent: bool) -> str | None:
    """``?consistent=true``: what reads are by default now (docs/api.md, "Consistent reads");
    still sent when asked, for /v1/cluster, the one read that is stale by default."""
    return "true" if consistent else None


def _stale(stale: bool) -> str | None:
    """``?stale=true``: read the answering node's replica as it is, with no read barrier."""
    return "true" if stale else None


def _given(**fields: Any) -> dict:
    """The fields whose value is not None."""
    return {k: v for k, v in fields.items() if v is not None}


# ------------------------------------------------------------------ cluster and jobs
@endpoint
def cluster(consistent: bool = False) -> Request:
    """``GET /v1/cluster``: the answering node, its role, the leader, members, indexes."""
    return Request("GET", "/v1/cluster", {"consistent": _consistent(consistent)})


@endpoint
def whoami() -> Request:
    """``GET /v1/whoami``: the token's ``{"id", "role", "tenants", "scopes"}``."""
    return Request("GET", "/v1/whoami")


@endpoint
def add_member(addr: str) -> Request:
    """``POST /v1/cluster/members``: add the node at Raft address ``addr`` (started with
    ``raftsched node --join``). ``{"addr", "state", "changed", "members"}``: ``state`` is
    ``learner`` until it holds the log, when the leader makes it a ``voter`` (``cluster()``
    shows it in ``members``). Asking again is safe: a member already changes nothing.
    :raises Conflict: it cannot be made safely now (another change in progress, a full cluster)."""
    return Request("POST", "/v1/cluster/members", body={"addr": addr})


@endpoint
def fencing(consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/cluster/fencing``: ``{"fencing_token"}``, the highest fencing token granted."""
    return Request("GET", "/v1/cluster/fencing", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def raise_fencing(at_least: int) -> Request:
    """``POST /v1/cluster/fencing``: the fencing counter raised to ``at_least`` when below, never
    lowered (``{"fencing_token", "raised"}``): after a restore from copies, above every token
    granted before (docs/fencing.md)."""
    return Request("POST", "/v1/cluster/fencing", body={"at_least": at_least})


@endpoint
def remove_member(addr: str) -> Request:
    """``DELETE /v1/cluster/members/{addr}``: remove the node at Raft address ``addr``; the
    leader removing itself hands its leadership over first. ``{"addr", "state": "removed",
    "changed", "members"}``; not a member changes nothing.
    :raises Conflict: the voters left would have no quorum of answering nodes, or another
        change is in progress."""
    return Request("DELETE", f"/v1/cluster/members/{_q(addr)}")


@endpoint
def put_job(name: str, spec: dict, create_only: bool = False, *, paused: bool = False) -> Request:
    """``PUT /v1/jobs/{name}``: create or replace a job; ``create_only`` sends
    ``If-None-Match: *`` (409 if it exists); ``paused``: paused by the same command (created
    paused, it fires nothing until resumed)."""
    return Request("PUT", f"/v1/jobs/{_q(name)}", {"paused": "true" if paused else None}, body=spec,
                   headers={"If-None-Match": "*"} if create_only else None)


#: What a batch of jobs' JSON may take of a request's body (limits.batch_request_bytes_max),
#: leaving room for the envelope and the encoder's differences.
BATCH_BODY_BYTES = limits.batch_request_bytes_max - 256 * 1024


def job_batches(names: list[str], specs: dict[str, dict]) -> list[list[str]]:
    """``names`` (in their order) cut into runs of jobs that each fit one ``POST /v1/jobs:batch``:
    at most ``limits.batch_jobs_max`` jobs and ``BATCH_BODY_BYTES`` of JSON (a node refuses a
    larger body with 413, whatever the count). A job too large alone is sent alone (the node
    then says why it refuses it)."""
    return cut_by(names, lambda n: len(json.dumps({n: specs[n]}).encode()) + 2, limits.batch_jobs_max,
                  BATCH_BODY_BYTES)


@endpoint
def put_jobs(jobs: dict[str, dict], create_only: bool = False, *, idempotency_key: str | None = None,
             deadline_s: float | None = None, paused: bool = False, dry_run: bool = False) -> Request:
    """Create or replace up to ``limits.batch_jobs_max`` (10 000) jobs in one request,
    ``POST /v1/jobs:batch``: ``{"jobs": {name: result}, "created", "replaced", "conflicts",
    "commands"}``. A result is ``{"created", "gen", "next_slot"}``, or with ``create_only``
    and an existing job, ``{"error": {"code": "conflict", ...}}``.

    Every job is validated before anything changes. The call is retried like every other
    (503 on the next node, 504 or a lost connection with the same Idempotency-Key), and a
    retry of the same jobs with the same key applies each of the node's commands at most
    once, so a failure part-way is finished by the retry. A batch of thousands of jobs
    can take seconds: give the client a ``timeout_s`` to match (core.BATCH_TIMEOUT_S).

    ``dry_run``: change nothing; answer what the batch would do to each job, ``{"dry_run": true,
    "jobs": {name: {"action": "create" | "replace" | "unchanged" | "conflict", "changes": [...],
    "next_slot", ...}}, "create", "replace", "unchanged", "conflicts"}``, after the same checks.

    :raises ValueError: more than ``limits.batch_jobs_max`` jobs (nothing is sent).
    :raises InvalidSpec: a job is invalid; ``.extra["job"]`` and ``.field`` name the first,
        ``.extra["errors"]`` lists up to 100. Nothing changed.
    :raises Unavailable, Indeterminate: the deadline passed with commands still failing;
        ``.extra`` says which jobs are committed (``jobs``), ``not_committed`` and
        ``unknown``, and the ``idempotency_key`` to retry with.
    """
    body = _batch_body(jobs, create_only, paused)  # (paused: every job paused in the same command)
    if dry_run:
        body["dry_run"] = True
    return Request("POST", "/v1/jobs:batch", body=body, idempotency_key=idempotency_key, deadline_s=deadline_s)


def _batch_body(jobs: dict[str, dict], create_only: bool, paused: bool) -> dict:
    """A batch's body (put_jobs, plan_jobs). :raises ValueError: more than batch_jobs_max jobs."""
    if len(jobs) > limits.batch_jobs_max:
        raise ValueError(f"{len(jobs)} jobs; send at most {limits.batch_jobs_max} per call")
    return {"jobs": jobs, **({"create_only": True} if create_only else {}), **({"paused": True} if paused else {})}


@endpoint
def plan_jobs(jobs: dict[str, dict], create_only: bool = False, *, deadline_s: float | None = None,
              paused: bool = False) -> Request:
    """``POST /v1/jobs:plan``: what ``put_jobs`` of these jobs would do to each, changing nothing
    (its ``dry_run``, which a token that may only read may send: a drift check in CI). A node of
    a version before it answers 404 (NotFound, field None): send ``put_jobs(..., dry_run=True)``
    there. :raises ValueError: more than ``limits.batch_jobs_max`` jobs (nothing is sent)."""
    return Request("POST", "/v1/jobs:plan", body=_batch_body(jobs, create_only, paused), deadline_s=deadline_s)


@endpoint
def get_job(name: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/jobs/{name}``: a job's spec and state. :raises NotFound:"""
    return Request("GET", f"/v1/jobs/{_q(name)}", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def delete_job(name: str, force: bool = False) -> Request:
    """``DELETE /v1/jobs/{name}``: delete a job (its queued runs with it). A job other jobs run
    after (pipelines) is a Conflict listing them, unless ``force``."""
    return Request("DELETE", f"/v1/jobs/{_q(name)}", {"force": "true" if force else None})


@endpoint
def graph(name: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/jobs/{name}/graph``: the jobs it runs after and that run after it (pipelines),
    transitively: ``{"job", "parents", "children", "nodes", "edges"}``."""
    return Request("GET", f"/v1/jobs/{_q(name)}/graph", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def list_jobs(limit: int = PAGE_LIMIT_DEFAULT, after: str | None = None, consistent: bool = False,
              labels: dict[str, str] | None = None, *, stale: bool = False) -> Request:
    """``GET /v1/jobs``, one page: ``{"jobs", "next", "total"}``; pass ``after=page["next"]``
    for the next one. With ``labels``, only the jobs that carry every one of them
    (``?label=KEY=VALUE``)."""
    return Request("GET", "/v1/jobs", {"stale": _stale(stale), "limit": limit, "after": after,
                                       "consistent": _consistent(consistent),
                                       "label": [f"{k}={v}" for k, v in labels.items()] if labels else None})


@endpoint
def runs(name: str, limit: int = PAGE_LIMIT_DEFAULT, state: str | None = None, slot: str | None = None,
         consistent: bool = False, *, since: str | None = None, until: str | None = None,
         before: str | None = None, stale: bool = False) -> Request:
    """``GET /v1/jobs/{name}/runs``: a job's runs, newest first; ``slot``, ``since`` and ``until``
    are ISO-8601 times (a window of slots), ``before`` the ``next`` of the page before."""
    return Request("GET", f"/v1/jobs/{_q(name)}/runs",
                   {"stale": _stale(stale), "limit": limit, "state": state, "slot": slot,
                    "consistent": _consistent(consistent),
                    "since": since, "until": until, "before": before})


@endpoint
def get_run(run: str, *, stale: bool = False) -> Request:
    """``GET /v1/runs/{run}``: one run. :raises NotFound:"""
    return Request("GET", f"/v1/runs/{_q(run)}", {"stale": _stale(stale)})


@endpoint
def preview(name: str, count: int = PREVIEW_COUNT_DEFAULT, after: str | None = None, *, stale: bool = False) -> Request:
    """``GET /v1/jobs/{name}/preview``: a job's next ``count`` slots (after ``after``, an
    ISO-8601 time; default now), with DST marks."""
    return Request("GET", f"/v1/jobs/{_q(name)}/preview", {"stale": _stale(stale), "count": count, "after": after})


@endpoint
def explain(name: str, down_from: str | None = None, down_to: str | None = None, *,
            slot: str | None = None) -> Request:
    """``POST /v1/jobs/{name}/explain``: what an outage from ``down_from`` to ``down_to``
    (ISO-8601) would do to a job's slots, by its misfire policy; or, with ``slot`` (ISO-8601)
    instead, why that slot met or missed its deadline; or, with neither, a triggered job's
    parents and its slots waiting for them. Read-only: it proposes nothing."""
    if slot is not None:
        return Request("POST", f"/v1/jobs/{_q(name)}/explain", body={"slot": slot})
    return Request("POST", f"/v1/jobs/{_q(name)}/explain",
                   body={k: v for k, v in (("down_from", down_from), ("down_to", down_to)) if v is not None})


@endpoint
def ping(name: str, status: str = "success", *, slot: str | int | None = None) -> Request:
    """``POST /v1/jobs/{name}/ping``: a heartbeat job's ``start``, ``success`` or ``fail``, for
    its newest slot started (an end), else the slot at hand (its newest that came, or one due
    within 2 s; 409 when it ended: never an older one), or for ``slot`` (ISO-8601, or ms since
    the epoch): ``{"job", "run", "state"}``."""
    return Request("POST", f"/v1/jobs/{_q(name)}/ping", body=dict(_given(slot=slot), status=status))


@endpoint
def list_deadlines(state: str | None = None, job: str | None = None, since: str | None = None,
                   limit: int = PAGE_LIMIT_DEFAULT, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/deadlines``: slots' deadline outcomes, newest first (``state``: pending, met,
    late or missed; ``since``: ISO-8601): ``{"deadlines"}``."""
    return Request("GET", "/v1/deadlines", {"stale": _stale(stale), "state": state, "job": job, "since": since,
                                            "limit": limit,
                                            "consistent": _consistent(consistent)})


@endpoint
def trigger(name: str, *, slot: str | None = None, payload: Any = UNSET, propagate: bool = False,
            rerun: bool = False, downstream: bool = False) -> Request:
    """``POST /v1/jobs/{name}/trigger``: start a manual run now (one run per call, even when the
    call is retried). ``payload`` overrides the job's for this run; ``slot`` (ISO-8601) makes it
    the run of that scheduled time, deduplicated: when the slot has a run already, that run is
    the answer (``created`` False). ``propagate``: its outcome reaches the job's children
    (pipelines), as a scheduled run's does. ``rerun`` (with ``slot``): the slot runs again
    though its run ended (one still going is the answer); ``downstream`` (with ``rerun``): the
    children that ran for the slot run again after it, down the graph."""
    body: dict = _given(slot=slot, propagate=True if propagate else None, rerun=True if rerun else None,
                        downstream=True if downstream else None)
    if payload is not UNSET:
        body["payload"] = payload
    return Request("POST", f"/v1/jobs/{_q(name)}/trigger", body=body or None)


@endpoint
def pause(name: str, note: str | None = None) -> Request:
    """``POST /v1/jobs/{name}/pause``: the job fires no more slots until resumed. ``note``: why,
    in your words, kept with when and by which token (``GET /v1/jobs/{name}``'s ``state.pause``)."""
    return Request("POST", f"/v1/jobs/{_q(name)}/pause", body=None if note is None else {"note": note})


@endpoint
def resume(name: str, catch_up: bool = False) -> Request:
    """``POST /v1/jobs/{name}/resume``: fire again; ``catch_up`` runs the slots missed while
    paused, by the job's misfire policy."""
    return Request("POST", f"/v1/jobs/{_q(name)}/resume", {"catch_up": "true" if catch_up else None})


# ------------------------------------------------------------------ queues, tenants, DLQ
@endpoint
def dlq(queue: str | None = None, limit: int = PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> Request:
    """``GET /v1/dlq``: dead runs, of every queue or of ``queue``."""
    return Request("GET", "/v1/dlq", {"stale": _stale(stale), "queue": queue, "limit": limit})


@endpoint
def dlq_get(run: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/dlq/{run}``: one dead run (NotFound unless it is in a dead-letter queue)."""
    return Request("GET", f"/v1/dlq/{_q(run)}", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def cancel_run(run: str, reason: str | None = None) -> Request:
    """``POST /v1/runs/{run}/cancel``: end a queued run (recorded ``skipped``, reason
    ``cancelled``) or a running one (``failed``: its lease ends, and its worker stops it at its
    next heartbeat). ``reason``: why, in your words, shown in the run's error (the node's audit log
    names the token that asked). :raises NotFound: :raises Conflict: it has ended already
    (``state``), or is dead."""
    return Request("POST", f"/v1/runs/{_q(run)}/cancel", body=None if reason is None else {"reason": reason})


@endpoint
def cancel_job_runs(name: str, reason: str | None = None, running: bool = False, after: str | None = None) -> Request:
    """``POST /v1/jobs/{name}/cancel``: end the job's queued runs, oldest first (with ``running``,
    its running ones too), at most 1 000 a call, each as ``cancel_run`` ends one: ``{"job",
    "cancelled", "runs", "passed", "more", "next"?}``; ``more`` when some may be left: call again
    with ``after`` the answer's ``next``. :raises NotFound: no such job."""
    body = {k: v for k, v in (("reason", reason), ("running", running or None), ("after", after)) if v is not None}
    return Request("POST", f"/v1/jobs/{_q(name)}/cancel", body=body or None)


@endpoint
def dlq_requeue(run: str) -> Request:
    """``POST /v1/dlq/{run}/requeue``: queue a dead run again, with a fresh attempt budget."""
    return Request("POST", f"/v1/dlq/{_q(run)}/requeue")


@endpoint
def dlq_delete(run: str) -> Request:
    """``DELETE /v1/dlq/{run}``: delete a dead run from its dead-letter queue."""
    return Request("DELETE", f"/v1/dlq/{_q(run)}")


@endpoint
def queues(*, stale: bool = False) -> Request:
    """``GET /v1/queues``: every queue: depth, running, oldest waiting, dead, settings."""
    return Request("GET", "/v1/queues", {"stale": _stale(stale)})


@endpoint
def put_queue(name: str, max_depth: int | None = None, on_full: str | None = None, *,
              tenants: Any = UNSET) -> Request:
    """``PUT /v1/queues/{name}``: a queue's settings (``max_depth``, ``on_full``) and, when
    given, the tenants it belongs to (``tenants``: a list, or None for none)."""
    body = _given(max_depth=max_depth, on_full=on_full)
    if tenants is not UNSET:
        body["tenants"] = tenants
    return Request("PUT", f"/v1/queues/{_q(name)}", body=body)


@endpoint
def tenants(*, stale: bool = False) -> Request:
    """``GET /v1/tenants``: every tenant's rate limit, policy and default routes."""
    return Request("GET", "/v1/tenants", {"stale": _stale(stale)})


@endpoint
def tenant(name: str, *, stale: bool = False) -> Request:
    """``GET /v1/tenants/{name}``: a tenant's rate limit, policy and default routes, and the policy that holds the
    jobs its limited tokens write."""
    return Request("GET", f"/v1/tenants/{_q(name)}", {"stale": _stale(stale)})


@endpoint
def put_tenant(name: str, rate_per_s: float | None = None, burst: int | None = None, *,
               executors: list[str] | None = None, placement_labels: dict[str, str] | None = None,
               network_allow: list[str] | None = None, notify: list[dict] | None = None) -> Request:
    """``PUT /v1/tenants/{name}``: limit the runs a tenant starts to ``rate_per_s`` (bursts of
    ``burst``), and/or set its policy (whole, when any of ``executors``, ``placement_labels`` or
    ``network_allow`` is given: the others take their defaults), and/or its jobs' default
    ``notify`` routes (docs/notifications.md)."""
    body: dict[str, Any] = _given(rate_per_s=rate_per_s, burst=burst, executors=executors, notify=notify)
    if placement_labels is not None:
        body["placement"] = {"labels": placement_labels}
    if network_allow is not None:
        body["network"] = {"allow": network_allow}
    return Request("PUT", f"/v1/tenants/{_q(name)}", body=body)


@endpoint
def delete_tenant(name: str) -> Request:
    """``DELETE /v1/tenants/{name}``: lift the tenant's rate limit, policy and default routes."""
    return Request("DELETE", f"/v1/tenants/{_q(name)}")


# ------------------------------------------------------------------ notification sinks
@endpoint
def sinks(consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/sinks``: every sink (secrets redacted), its cursor and dead count."""
    return Request("GET", "/v1/sinks", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def get_sink(name: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/sinks/{name}``: a sink. :raises NotFound:"""
    return Request("GET", f"/v1/sinks/{_q(name)}", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def put_sink(name: str, spec: dict) -> Request:
    """``PUT /v1/sinks/{name}``: create or replace a sink (webhook, slack, email, pagerduty)."""
    return Request("PUT", f"/v1/sinks/{_q(name)}", body=spec)


@endpoint
def delete_sink(name: str) -> Request:
    """``DELETE /v1/sinks/{name}``. :raises NotFound:"""
    return Request("DELETE", f"/v1/sinks/{_q(name)}")


@endpoint
def sink_dead(name: str, limit: int = PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> Request:
    """``GET /v1/sinks/{name}/dead``: the events the sink refused past its retry budget."""
    return Request("GET", f"/v1/sinks/{_q(name)}/dead", {"stale": _stale(stale), "limit": str(limit)})


@endpoint
def sink_requeue(name: str, events: list[str] | None = None) -> Request:
    """``POST /v1/sinks/{name}/dead:requeue``: deliver the dead events (those ids, or all) again."""
    return Request("POST", f"/v1/sinks/{_q(name)}/dead:requeue", body={} if events is None else {"events": events})


# ------------------------------------------------------------------ backfills and bulk DLQ operations
@endpoint
def backfill(job: str, from_: str, to: str, *, reprocess: str | None = None, order: str | None = None,
             max_concurrent: int | None = None, rate_per_s: float | None = None, max_slots: int | None = None,
             payload: Any = UNSET, overlap: str | None = None, dry_run: bool = False,
             backfill_id: str | None = None, cascade: str | None = None,
             upstream: str | None = None) -> Request:
    """``POST /v1/jobs/{job}/backfills``: run ``job`` for the slots of ``[from_, to)`` (ISO-8601)
    that never ran (``reprocess`` ``missing``, the default), also those whose last run failed
    or went dead (``failed``), or all of them (``all``); ``order`` ``oldest`` (default) or
    ``newest``; at most ``max_concurrent`` (default 1) of its runs queued or running, at most
    ``rate_per_s`` started a second. ``dry_run``: the slots it would run and why the others
    are left out, changing nothing. ``backfill_id`` makes the call idempotent: the same id
    again answers with the same backfill (``created`` False; docs/backfill.md). ``cascade``
    ``children``: the job's children (pipelines) follow each backfilled slot, as its runs.
    ``upstream`` ``ignore``: a gated job (a schedule and ``after``) runs the slots whatever its
    parents did for them (without it, such a backfill is refused)."""
    body: dict = {"from": from_, "to": to}
    body.update(_given(reprocess=reprocess, order=order, max_concurrent=max_concurrent, rate_per_s=rate_per_s,
                       max_slots=max_slots, overlap=overlap, id=backfill_id, cascade=cascade, upstream=upstream))
    if payload is not UNSET:
        body["payload"] = payload
    if dry_run:
        body["dry_run"] = True
    return Request("POST", f"/v1/jobs/{_q(job)}/backfills", body=body)


@endpoint
def backfills(kind: str | None = None, job: str | None = None, state: str | None = None, *,
              stale: bool = False) -> Request:
    """``GET /v1/backfills``: every backfill and bulk DLQ operation the cluster keeps."""
    return Request("GET", "/v1/backfills", {"stale": _stale(stale), "kind": kind, "job": job, "state": state})


@endpoint
def get_backfill(backfill_id: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/backfills/{id}``: one backfill or bulk operation, with its progress."""
    return Request("GET", f"/v1/backfills/{_q(backfill_id)}", {"stale": _stale(stale),
                                                               "consistent": _consistent(consistent)})


@endpoint
def pause_backfill(backfill_id: str) -> Request:
    """``POST /v1/backfills/{id}/pause``: start no more of its runs until resumed."""
    return Request("POST", f"/v1/backfills/{_q(backfill_id)}/pause")


@endpoint
def resume_backfill(backfill_id: str) -> Request:
    """``POST /v1/backfills/{id}/resume``: go on with a paused backfill or bulk operation."""
    return Request("POST", f"/v1/backfills/{_q(backfill_id)}/resume")


@endpoint
def cancel_backfill(backfill_id: str) -> Request:
    """``POST /v1/backfills/{id}/cancel``: stop a backfill (its queued runs are withdrawn) or a
    bulk operation."""
    return Request("POST", f"/v1/backfills/{_q(backfill_id)}/cancel")


def _dlq_bulk(action: str, filters: dict, dry_run: bool, op_id: str | None, all_runs: bool) -> Request:
    body = _given(**filters)
    if all_runs:
        body["all"] = True
    if dry_run:
        body["dry_run"] = True
    if op_id is not None:
        body["id"] = op_id
    return Request("POST", f"/v1/dlq:{action}", body=body)


@endpoint
def dlq_requeue_matching(*, queue: str | None = None, job: str | None = None, error: str | None = None,
                         dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                         rate_per_s: float | None = None, max_concurrent: int | None = None,
                         dry_run: bool = False, op_id: str | None = None, all_runs: bool = False) -> Request:
    """``POST /v1/dlq:requeue``: queue again, with fresh budgets, the dead runs that match
    (``error`` is a substring of their error; dead between ``dead_from`` and ``dead_to``, ISO),
    at most ``max_count``, ``rate_per_s`` a second (10 by default): one replicated operation
    whose progress ``get_backfill`` shows. ``dry_run``: the runs it would requeue. With no filter
    the node refuses it unless ``all_runs`` (``"all": true``) says every dead run is meant."""
    return _dlq_bulk("requeue", {"queue": queue, "job": job, "error": error, "dead_from": dead_from,
                                 "dead_to": dead_to, "max_count": max_count, "rate_per_s": rate_per_s,
                                 "max_concurrent": max_concurrent}, dry_run, op_id, all_runs)


@endpoint
def dlq_purge_matching(*, queue: str | None = None, job: str | None = None, error: str | None = None,
                       dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                       rate_per_s: float | None = None, dry_run: bool = False, op_id: str | None = None,
                       all_runs: bool = False) -> Request:
    """``POST /v1/dlq:purge``: delete the dead runs that match, as ``dlq_requeue_matching``
    selects them (no rate unless given; ``all_runs`` as there)."""
    return _dlq_bulk("purge", {"queue": queue, "job": job, "error": error, "dead_from": dead_from,
                               "dead_to": dead_to, "max_count": max_count, "rate_per_s": rate_per_s},
                     dry_run, op_id, all_runs)


# ------------------------------------------------------------------ runs, previews, health
@endpoint
def list_runs(state: str | None = None, limit: int = PAGE_LIMIT_DEFAULT, consistent: bool = False, *,
              since: str | None = None, until: str | None = None, before: str | None = None,
              stale: bool = False) -> Request:
    """``GET /v1/runs``: runs and recorded slots of every job, newest first: ``{"runs", "next"}``;
    ``since``/``until`` a window of slots, ``before`` the ``next`` of the page before."""
    return Request("GET", "/v1/runs", {"stale": _stale(stale), "state": state, "limit": limit,
                                       "consistent": _consistent(consistent),
                                       "since": since, "until": until, "before": before})


@endpoint
def preview_spec(spec: dict, count: int = PREVIEW_COUNT_DEFAULT, name: str | None = None,
                 after: str | None = None) -> Request:
    """``POST /v1/preview``: the next ``count`` slots of a spec that is not stored (it is
    validated like a PUT's), as the job ``name`` would have them (a jitter offset is a hash of
    the name), after ``after`` (an ISO-8601 time; default now). Read-only: it proposes nothing."""
    return Request("POST", "/v1/preview", {"count": int(count), "name": name, "after": after}, body=spec)


@endpoint
def healthz(*, deadline_s: float | None = None) -> Request:
    """``GET /healthz`` of the node tried first: ``{"ok", "role", "leader"}``, ``ok`` False
    (a 503, returned rather than raised) when that node sees no leader."""
    return Request("GET", "/healthz", accept=(503,), deadline_s=deadline_s)


@endpoint
def metrics() -> Request:
    """``GET /metrics``: the node's Prometheus text (NotFound when the node has none)."""
    return Request("GET", "/metrics")


@endpoint
def openapi() -> Request:
    """``GET /v1/openapi.json``: the API's OpenAPI 3.1 document (no token needed)."""
    return Request("GET", "/v1/openapi.json")


# ------------------------------------------------------------------ the worker fleet
@endpoint
def workers(consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/workers``: every registered worker: ``{"workers": [...], "total"}`` (docs/api.md,
    "Workers")."""
    return Request("GET", "/v1/workers", {"stale": _stale(stale), "consistent": _consistent(consistent)})


@endpoint
def worker(worker_id: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/workers/{id}``: one worker, with the runs it holds. :raises NotFound: no such
    worker."""
    return Request("GET", f"/v1/workers/{_q(worker_id)}", {"stale": _stale(stale),
                                                           "consistent": _consistent(consistent)})


@endpoint
def drain_worker(worker_id: str) -> Request:
    """``POST /v1/workers/{id}/drain``: the worker is granted nothing more, lets its runs finish
    and stops (docs/workers.md). ``{"worker", "state": "draining", "held"}``."""
    return Request("POST", f"/v1/workers/{_q(worker_id)}/drain")


# ------------------------------------------------------------------ the worker protocol (docs/api.md)
# What `raftsched worker` speaks (through the AsyncClient); a worker-role token may call them and
# nothing else.
@endpoint
def worker_lease(worker_id: str, *, max_runs: int, wait_s: float, ttl_ms: int, facts: dict | None = None,
                 results: list | None = None, idempotent_key: str | None = None,
                 timeout_s: float | None = None, deadline_s: float | None = None,
                 on_answer: Callable[[float], None] | None = None) -> Request:
    """``POST /v1/workers/{id}/lease``: up to ``max_runs`` runs this worker's facts (queues,
    labels, slots, executors, version, instance) allow, waiting at the node up to ``wait_s``
    for work: ``{"runs": [grants], "draining"}``. Retried on another node only while no
    attempt may have granted runs (a lease is not idempotent: its runs would wait out their
    TTL). ``results``: outcomes carried to the node with the request, as ``worker_complete``'s,
    with ``idempotent_key`` as their request id; the answer has ``results`` (or
    ``results_error``: then send them to ``worker_complete`` with the same key). ``on_answer``:
    :class:`Request`'s (how long the answering attempt took: with the answer's ``held_ms``, how
    long the grants were on the way)."""
    body = dict(facts or {}, max=max_runs, wait_s=wait_s, ttl_ms=ttl_ms)
    if results is not None:
        body["results"] = results
    return Request("POST", f"/v1/workers/{_q(worker_id)}/lease", body=body, idempotency_key=idempotent_key,
                   timeout_s=timeout_s, deadline_s=deadline_s, on_answer=on_answer)


@endpoint
def worker_heartbeat(worker_id: str, leases: list, ttl_ms: int, *, timeout_s: float | None = None,
                     deadline_s: float | None = None) -> Request:
    """``POST /v1/workers/{id}/heartbeat``: extend ``leases`` (``[[run, token], ...]``):
    ``{"extended", "lost", "draining"}``."""
    return Request("POST", f"/v1/workers/{_q(worker_id)}/heartbeat", body={"leases": leases, "ttl_ms": ttl_ms},
                   timeout_s=timeout_s, deadline_s=deadline_s)


@endpoint
def worker_complete(worker_id: str, results: list, *, idempotent_key: str | None = None,
                    timeout_s: float | None = None, deadline_s: float | None = None) -> Request:
    """``POST /v1/workers/{id}/complete``: outcomes (``{"run", "token", "success", "error",
    "output"}``), each judged alone: ``{"results": [...]}``."""
    return Request("POST", f"/v1/workers/{_q(worker_id)}/complete", body={"results": results},
                   idempotency_key=idempotent_key, timeout_s=timeout_s, deadline_s=deadline_s)


@endpoint
def worker_release(worker_id: str, leases: list, reason: str = "", *, idempotent_key: str | None = None,
                   timeout_s: float | None = None, deadline_s: float | None = None,
                   not_started: bool = False) -> Request:
    """``POST /v1/workers/{id}/release``: give ``leases`` back (queued again at once, no budget
    spent). ``not_started``: the worker never began these runs (one of a job with
    ``late_start: skip`` given back past its grant's ``start_by`` is withdrawn)."""
    body: dict = {"leases": leases, "reason": reason}
    if not_started:  # (sent only when set: a node of an older version refuses the field)
        body["not_started"] = True
    return Request("POST", f"/v1/workers/{_q(worker_id)}/release", body=body,
                   idempotency_key=idempotent_key, timeout_s=timeout_s, deadline_s=deadline_s)


@endpoint
def worker_leave(worker_id: str, instance: str, reason: str | None = None, *, idempotent_key: str | None = None,
                 timeout_s: float | None = None, deadline_s: float | None = None) -> Request:
    """``POST /v1/workers/{id}/leave``: the worker process ``instance`` is going away: the worker
    is drained (shown ``draining``, granted nothing) until a new instance says hello."""
    body: dict = {"instance": instance}
    if reason is not None:
        body["reason"] = reason
    return Request("POST", f"/v1/workers/{_q(worker_id)}/leave", body=body,
                   idempotency_key=idempotent_key, timeout_s=timeout_s, deadline_s=deadline_s)


# ------------------------------------------------------------------ tokens (admin)
@endpoint
def create_token(role: str, tenants: list[str] | None = None, expires: str | int | None = None,
                 note: str | None = None, workers: list[str] | None = None,
                 jobs: list[str] | None = None) -> Request:
    """``POST /v1/tokens``: ``{"id", "token", "role", "tenants", "workers", "jobs", "expires_at",
    "note"}``; the token (its secret) is shown this once. ``expires``: ISO-8601 or ms since
    the epoch; ``workers``: the worker ids a worker token may speak for (None: any); ``jobs``:
    the heartbeat jobs a ping token may ping."""
    return Request("POST", "/v1/tokens",
                   body={"role": role, **_given(tenants=tenants, expires=expires, note=note, workers=workers,
                                                jobs=jobs)})


@endpoint
def tokens(*, stale: bool = False) -> Request:
    """``GET /v1/tokens``: every token, without secrets."""
    return Request("GET", "/v1/tokens", {"stale": _stale(stale)})


@endpoint
def revoke_token(token_id: str) -> Request:
    """``DELETE /v1/tokens/{id}``: every node refuses the token once it has applied the
    revocation."""
    return Request("DELETE", f"/v1/tokens/{_q(token_id)}")


# ------------------------------------------------------------------ secrets at rest (admin)
@endpoint
def secrets_status(*, stale: bool = False) -> Request:
    """``GET /v1/secrets``: the key new secret values are sealed under, the keys the node's ring
    holds, and how many stored values are sealed under each key (or still in clear)."""
    return Request("GET", "/v1/secrets", {"stale": _stale(stale)})


@endpoint
def rotate_seal_key(key: str) -> Request:
    """``POST /v1/secrets:rotate``: seal every stored secret value under key ``key`` (which every
    node's key ring must hold), and every new one from then on."""
    return Request("POST", "/v1/secrets:rotate", body={"key": key})


# ------------------------------------------------------------------ locks
@endpoint
def lock_acquire(name: str, owner: str, ttl_s: float, *, deadline_s: float | None = None) -> Request:
    """``POST /v1/locks/{name}/acquire``: acquire lock ``name`` for ``ttl_s`` seconds:
    ``{"lock", "owner", "token", "expires_at"}``.

    ``token`` is the fencing token: pass it to every write you make under the lock. Holding
    the lock does not make you safe by itself (raftsched/client/__init__.py, "Locks, honestly").

    :raises LockHeld: someone else holds it (``.holder``, ``.expires_at_ms``).
    """
    return Request("POST", f"/v1/locks/{_q(name)}/acquire", body={"owner": owner, "ttl_s": ttl_s},
                   deadline_s=deadline_s, recover=conflict_as(LockHeld))


@endpoint
def lock_renew(name: str, token: int, ttl_s: float | None = None, *, deadline_s: float | None = None) -> Request:
    """``POST /v1/locks/{name}/renew``: extend the lease of ``token`` by ``ttl_s`` (default: the
    TTL it was acquired with).

    :raises LockLost: the token does not hold the lock any more.
    """
    return Request("POST", f"/v1/locks/{_q(name)}/renew", body={"token": token, **_given(ttl_s=ttl_s)},
                   deadline_s=deadline_s, recover=conflict_as(LockLost))


@endpoint
def lock_release(name: str, token: int, *, deadline_s: float | None = None) -> Request:
    """``POST /v1/locks/{name}/release``: release the lock held with ``token``.

    :raises LockLost: the token did not hold it (it had expired already).
    """
    return Request("POST", f"/v1/locks/{_q(name)}/release", body={"token": token}, deadline_s=deadline_s,
                   recover=conflict_as(LockLost))


@endpoint
def lock_info(name: str, consistent: bool = False, *, stale: bool = False) -> Request:
    """``GET /v1/locks/{name}``: the current holder ``{"lock", "owner", "token", "expires_at",
    "since"}``, or None when the lock is free."""
    return Request("GET", f"/v1/locks/{_q(name)}", {"stale": _stale(stale), "consistent": _consistent(consistent)},
                   recover=none_if_not_found)
