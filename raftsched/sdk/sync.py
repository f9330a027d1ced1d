"""``raftsched sync MODULE:app [--dry-run] [--prune] [--json]``: make the cluster's jobs match
an app's declarations.

It imports the module (running its declarations, which validate themselves), reads the
cluster's jobs of this app and the declared names (consistent reads), computes the plan
(:func:`raftsched.sdk.plan.plan`), prints it, and unless ``--dry-run`` applies it (:func:`apply`:
the creates, create-only, then the updates, in ``POST /v1/jobs:batch`` requests that fit; then,
with ``--prune``, a ``DELETE`` for each of this app's jobs that is no longer declared). A second
sync finds nothing to change. Exit status: 0 done (or nothing to do), 1 a conflict, a job the
node refused, an API error (what was applied before it is printed), 2 the app could not be
loaded.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from ..client.endpoints import job_batches
from ..core import pipelines
from ..core.errors import NotFound, RaftschedError
from ..node import limits as node_limits
from .app import APP_LABEL, App, DeclarationError
from .loader import AppLoadError, load_app
from .plan import Plan, plan


def existing_jobs(client, app: App) -> dict[str, dict]:
    """The cluster's jobs a plan for ``app`` needs, ``{name: spec}``: every job labelled with
    the app (a consistent read first, so that what the last sync wrote is seen), and each
    declared name that exists without that label."""
    out: dict[str, dict] = {}
    after, consistent = None, True
    while True:
        page = client.list_jobs(limit=node_limits.jobs_page_max, after=after, consistent=consistent,
                                labels={APP_LABEL: app.name})
        consistent = False  # the node that answered has applied every earlier write now
        for j in page["jobs"]:
            out[j["name"]] = j["spec"]
        after = page.get("next")
        if after is None:
            break
    for name in app.jobs:
        if name not in out:
            try:
                out[name] = client.get_job(name)["spec"]
            except NotFound:
                pass
    return out


def new_applied() -> dict:
    """What :func:`apply` did so far: ``{"created", "updated", "deleted", "refused", "skipped",
    "warnings", "commands"}`` (``refused``: name -> the node's error; ``skipped``: jobs to prune
    that another app or a person holds by the time they were to be deleted; ``warnings``: name ->
    what the node said of a job it wrote, docs/api.md "PUT /v1/jobs/{name}")."""
    return {"created": [], "updated": [], "deleted": [], "refused": {}, "skipped": [], "warnings": {}, "commands": 0}


def apply(client, app: App, p: Plan, done: dict | None = None) -> dict:
    """Apply ``p`` into ``done`` (:func:`new_applied`, filled as each request succeeds, so a
    failure part-way can say what was applied before it), and return it.

    The creates first, with ``create_only`` (a job of that name made by someone else since the
    plan was read is left as it is, and refused), then the updates; each in batches that fit a
    request (:func:`raftsched.client.endpoints.job_batches`), parents before the jobs that run
    after them (pipelines). Then the deletes, children first, each of a job read again just
    before: one that no longer carries this app's label is skipped, one already gone counts as
    deleted. A job the node refused inside a batch's answer is in ``refused``, not applied."""
    done = new_applied() if done is None else done
    specs = app.specs()
    order = pipelines.parents_first(specs)
    for names, create_only, into in (([n for n in order if n in set(p.create)], True, "created"),
                                     ([n for n in order if n in {u.job for u in p.update}], False, "updated")):
        for part in job_batches(names, specs):
            res = client.put_jobs({n: specs[n] for n in part}, create_only)
            done["commands"] += res.get("commands", 0) if isinstance(res, dict) else 0
            answers = res.get("jobs") if isinstance(res, dict) else None
            for n in part:
                a = answers.get(n) if isinstance(answers, dict) else None
                err = a.get("error") if isinstance(a, dict) else None
                if err is not None:
                    done["refused"][n] = err
                else:
                    done[into].append(n)
                    if isinstance(a, dict) and a.get("warnings"):
                        done["warnings"][n] = a["warnings"]
    existing: dict[str, dict] = {}
    for n in p.delete:
        try:
            spec = client.get_job(n)["spec"]
        except NotFound:
            done["deleted"].append(n)  # gone already (another sync, or by hand): what prune wanted
            continue
        if (spec.get("labels") or {}).get(APP_LABEL) != app.name:
            done["skipped"].append(n)  # given to another app, or taken by hand, since the plan
            continue
        existing[n] = spec
    for name in reversed(pipelines.parents_first(existing)):
        try:
            client.delete_job(name)
        except NotFound:
            pass  # gone meanwhile: what prune wanted
        done["deleted"].append(name)
    return done


def _schedule_text(spec: dict) -> str:
    if not spec.get("schedule") and spec.get("after"):
        return "after " + ", ".join(e["job"] if isinstance(e, dict) else e for e in spec["after"])
    s = spec.get("schedule") or {}
    if "cron" in s:
        return f"cron {s['cron']} {s.get('timezone', 'UTC')}"
    if "every_s" in s:
        return f"every {s['every_s']} s"
    return f"at {s.get('at')}"


def format_plan(p: Plan, app: App, url: str, dry_run: bool) -> str:
    """The plan as a table: one line a job, then a summary line."""
    views = app.views()
    rows: list[tuple[str, str, str]] = []
    rows += [("create", n, _schedule_text(views[n])) for n in p.create]
    rows += [("update", u.job, ", ".join(u.fields)) for u in p.update]
    rows += [("unchanged", n, "") for n in p.unchanged]
    rows += [("delete", n, "no longer declared (--prune)") for n in p.delete]
    rows += [("undeclared", n, "no longer declared; kept (--prune deletes it)") for n in p.undeclared]
    rows += [("conflict", c.job, f"belongs to app {c.owner!r} (label {APP_LABEL})") for c in p.conflicts]
    width = max([len(r[1]) for r in rows] + [4])
    lines = [f"raftsched sync: app {app.name!r}, {len(views)} job(s) declared, against {url}"]
    lines += [f"  {what:<10} {name:<{width}}  {note}".rstrip() for what, name, note in rows]
    lines.append(f"plan: {len(p.create)} to create, {len(p.update)} to update, {len(p.unchanged)} unchanged, "
                 f"{len(p.delete)} to delete" + (f", {len(p.conflicts)} in conflict" if p.conflicts else "")
                 + (" (dry run)" if dry_run else ""))
    return "\n".join(lines)


def _fail(e: RaftschedError) -> int:
    body = getattr(e, "body", None)
    # The body adds what the message does not say (a batch's answers job by job); a body that is
    # only the error said it twice.
    more = isinstance(body, dict) and set(body) != {"error"}
    print(f"raftsched sync: {e.message}" + (f"\n{json.dumps(body, indent=2)}" if more else ""), file=sys.stderr)
    errors = e.extra.get("errors")
    if not more and isinstance(errors, list) and len(errors) > 1:  # (every job refused, not the first only)
        for x in errors:
            if isinstance(x, dict):
                print(f"raftsched sync:   job {x.get('job')}: {x.get('field')}: {x.get('message')}", file=sys.stderr)
    if not e.definite:
        print("raftsched sync: the outcome is unknown; run the sync again (it applies only what is left)",
              file=sys.stderr)
    return 1


def load(ref: str, who: str = "raftsched sync") -> App | None:
    """The app ``ref`` names, or None after saying on stderr why it cannot be loaded: a
    declaration error, or any exception its import raised (a missing dependency, a syntax
    error), as one line naming the type and where in the user's code, not a traceback."""
    try:
        return load_app(ref)
    except (AppLoadError, DeclarationError) as e:
        print(f"{who}: {ref}: {e}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - the app's own import failed: say so, exit 2
        print(f"{who}: {ref}: cannot import it: {import_error(e)}", file=sys.stderr)
    return None


def import_error(e: BaseException) -> str:
    """``Type: message`` of an exception an app's import raised, with the last frame of it
    outside raftsched (the user's file and line) when there is one."""
    where = None
    tb = e.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if "/raftsched/" not in f and not f.startswith("<frozen"):
            where = f"{f}:{tb.tb_lineno}"
        tb = tb.tb_next
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}:{e.lineno}"
    return f"{type(e).__name__}: {e}" + (f" ({where})" if where else "")


def missing_parents(client, app: App, existing: dict[str, dict]) -> list[tuple[str, str]]:
    """(job, parent) for each declared job's ``after`` parent that the app does not declare and
    the cluster does not hold: the sync would be refused for it (422), so the dry run says so."""
    out = []
    known = set(app.jobs) | set(existing)
    looked: dict[str, bool] = {}
    for name, spec in app.specs().items():
        for e in spec.get("after") or ():
            parent = e["job"] if isinstance(e, dict) else e
            if parent in known:
                continue
            if parent not in looked:
                try:
                    client.get_job(parent)
                    looked[parent] = True
                except NotFound:
                    looked[parent] = False
            if not looked[parent]:
                out.append((name, parent))
    return out


def blocked_deletes(client, app: App, p: Plan) -> list[tuple[str, str]]:
    """(child, job) for each job --prune would delete that a job it would keep runs after (one
    of another app or a person's, or one the app still declares after it): the node refuses
    that delete (409: its children would lose a parent), so the dry run says so, and the sync
    applies nothing, as for a missing parent."""
    out = []
    specs = app.specs()
    for name in p.delete:
        try:
            g = client.graph(name)
        except NotFound:
            continue  # gone already: nothing to refuse
        for e in g.get("edges") or ():
            child = e.get("to")
            if e.get("from") != name or child in p.delete:
                continue
            if child in specs and name not in {x["job"] if isinstance(x, dict) else x
                                               for x in specs[child].get("after") or ()}:
                continue  # the app's update drops that edge before the deletes
            out.append((child, name))
    return sorted(set(out))


def _warning_lines(warnings: dict[str, list[str]]) -> list[str]:
    """What the node said of the jobs it wrote (accepted, but a route to no sink, a placement no
    live worker carries, ...), one line a distinct warning with the jobs it concerns: an app's
    thousand jobs synced before its workers start share one line, not a thousand."""
    jobs: dict[str, list[str]] = {}
    for n in sorted(warnings):
        for w in warnings[n]:
            jobs.setdefault(w, []).append(n)
    return [f"raftsched sync: warning: job {ns[0]}: {w}" if len(ns) == 1 else
            f"raftsched sync: warning: jobs {', '.join(ns[:5])}{f' and {len(ns) - 5} more' if len(ns) > 5 else ''}: {w}"
            for w, ns in jobs.items()]


def _print_applied(a: dict) -> None:
    print(f"applied: {len(a['created'])} created, {len(a['updated'])} updated, {len(a['deleted'])} deleted"
          + (f", {len(a['refused'])} refused" if a["refused"] else "")
          + (f", {len(a['skipped'])} not deleted (no longer this app's)" if a["skipped"] else ""))


#: ``sync --dry-run --exit-code``'s status when the sync would change something (as ``apply
#: --dry-run --exit-code``'s: 2 is a usage error's, 1 an error's).
DRIFT_EXIT = 3

#: Where a spec holds secret values (node/redact.py SECRET_MAPS): a read shows them as
#: ``***:fingerprint``, so a declaration in clear always differs from the cluster's view of them.
_SECRET_PREFIXES = ("secrets.", "executor.env.", "executor.headers.")


def dry_run_jobs(client, jobs: dict[str, dict], create_only: bool = False, paused: bool = False) -> dict:
    """What a batch of ``jobs`` would do to each, changing nothing: ``POST /v1/jobs:plan``, which
    a token that may only read may send; on a node of a version before it (404 naming no field),
    the batch's own ``dry_run`` (a token that may write jobs). :raises RaftschedError:"""
    plan_jobs = getattr(client, "plan_jobs", None)
    if plan_jobs is not None:
        try:
            return plan_jobs(jobs, create_only, paused=paused)
        except NotFound as e:
            if e.field is not None:
                raise
    return client.put_jobs(jobs, create_only, dry_run=True, **({"paused": True} if paused else {}))


def settle_secrets(client, app: App, p: Plan) -> Plan:
    """``p`` with the updates whose every changed field is a secret value asked of the nodes
    (:func:`dry_run_jobs`: they compare a value in clear with the stored one by
    its fingerprint): those the nodes find unchanged are unchanged. Without it a sync of a job with
    a secret rewrote the job every time, and could never say "nothing to change" (a walk). A node
    of a version before the dry run refuses it: the plan stays as it was."""
    suspects = [u.job for u in p.update
                if u.fields and all(f.startswith(_SECRET_PREFIXES) for f in u.fields)]
    if not suspects:
        return p
    specs = app.specs()  # (what the sync would send: its secrets in clear, not the views' redactions)
    same: set[str] = set()
    try:
        for part in job_batches(suspects, specs):
            res = dry_run_jobs(client, {n: specs[n] for n in part})
            same |= {n for n, r in (res.get("jobs") or {}).items()
                     if isinstance(r, dict) and r.get("action") == "unchanged"}
    except RaftschedError as e:
        print(f"raftsched sync: note: the nodes did not compare the secrets of {len(suspects)} job(s) ({e.message}); "
              "they are planned as updates", file=sys.stderr)
        return p
    if not same:
        return p
    return dataclasses.replace(p, update=tuple(u for u in p.update if u.job not in same),
                               unchanged=tuple(sorted(set(p.unchanged) | same)))


def handler_warnings(client, app: App, p: Plan) -> list[str]:
    """What the sync should say of the jobs it creates or updates that no live worker of the app
    can run now: none is live, or every live one said its handlers (``targets``) and none has
    the job's (a worker of an older version of the app). Their runs wait for one (5 minutes,
    docs/sdk.md "Versions"). Nothing when the workers cannot be read (a token without ``read``)."""
    names = list(p.create) + [u.job for u in p.update]
    specs = app.specs()
    placed = [n for n in names if ((specs[n].get("placement") or {}).get("labels") or {}).get(APP_LABEL) == app.name]
    if not placed:
        return []
    try:
        ws = client.workers().get("workers") or []
    except RaftschedError:
        return []
    mine = [w for w in ws if isinstance(w, dict) and (w.get("labels") or {}).get(APP_LABEL) == app.name
            and w.get("status") == "active"]
    if not mine:
        return [f"no live worker of app {app.name!r} ({APP_LABEL}={app.name}): the runs of "
                f"{', '.join(placed[:5])}{' ...' if len(placed) > 5 else ''} wait until one asks for work "
                f"(raftsched worker --app)"]
    if any(w.get("targets") is None for w in mine):
        return []  # (a worker that says nothing of its handlers takes any run of the app)
    have = {t for w in mine for t in w["targets"]}
    lacking = [n for n in placed if specs[n].get("executor", {}).get("target") not in have]
    if not lacking:
        return []
    return [f"no live worker of app {app.name!r} has the handler of {', '.join(lacking[:5])}"
            f"{' ...' if len(lacking) > 5 else ''} (they run a version of the app without it): its runs wait up "
            f"to 5 minutes for one that has it, then fail on the others; deploy the workers first (docs/sdk.md, "
            f"\"Versions\")"]


def run(args: Any, client) -> int:
    """The ``raftsched sync`` subcommand (cli.py): ``args.app``, ``args.dry_run``,
    ``args.prune``, ``args.json``; ``client`` a raftsched.client.Client."""
    app = load(args.app)
    if app is None:
        return 2
    try:
        existing = existing_jobs(client, app)
        missing = missing_parents(client, app, existing)
    except RaftschedError as e:
        return _fail(e)
    p = plan(app.name, app.views(), existing, prune=args.prune)
    try:
        p = settle_secrets(client, app, p)
        blocked = blocked_deletes(client, app, p)
    except RaftschedError as e:
        return _fail(e)
    out: dict = {"plan": p.to_dict(), "dry_run": bool(args.dry_run), "applied": None}
    if missing:
        out["missing_parents"] = [{"job": j, "after": parent} for j, parent in missing]
    if blocked:
        out["blocked_deletes"] = [{"job": j, "runs_after": parent} for j, parent in blocked]
    if not args.json:
        print(format_plan(p, app, ",".join(client.urls), args.dry_run))
    if p.conflicts or missing or blocked:
        msg = (f"{len(p.conflicts)} declared job(s) belong to another app; nothing applied. Rename them, "
               "or delete the other app's job first") if p.conflicts else \
            "; ".join([f"job {j} runs after {parent}, which the app does not declare and the cluster does not hold"
                       for j, parent in missing]
                      + [f"job {j} runs after {parent}, which --prune would delete (the node refuses it while a "
                         f"job runs after it)" for j, parent in blocked]) + "; nothing applied"
        if args.json:
            print(json.dumps(out, indent=2))
        print(f"raftsched sync: {msg}", file=sys.stderr)
        return 1
    for line in handler_warnings(client, app, p):
        print(f"raftsched sync: warning: {line}", file=sys.stderr)
    if not args.dry_run and p.changes:
        done = new_applied()
        try:
            out["applied"] = apply(client, app, p, done)
        except RaftschedError as e:
            out["applied"] = done  # what went through before the failure stays applied
            if args.json:
                out["error"] = e.message
                print(json.dumps(out, indent=2))
            else:
                _print_applied(done)
            return _fail(e)
    if args.json:
        print(json.dumps(out, indent=2))
    elif out["applied"] is not None:
        _print_applied(out["applied"])
    elif not p.changes:
        print("nothing to change")
    for line in _warning_lines((out["applied"] or {}).get("warnings") or {}):
        print(line, file=sys.stderr)
    if args.dry_run and getattr(args, "exit_code", False) and p.changes:
        return DRIFT_EXIT
    a = out["applied"]
    if a is not None and (a["refused"] or a["skipped"]):
        for n, err in sorted(a["refused"].items()):
            print(f"raftsched sync: job {n} was refused: {err.get('message') if isinstance(err, dict) else err}",
                  file=sys.stderr)
        for n in a["skipped"]:
            print(f"raftsched sync: job {n} was not deleted: it no longer carries {APP_LABEL}={app.name}",
                  file=sys.stderr)
        print("raftsched sync: the cluster changed while syncing; run the sync again", file=sys.stderr)
        return 1
    return 0
