"""``raftsched sync MODULE:app [--dry-run] [--prune] [--json]``: make the cluster's jobs match
an app's declarations.

It imports the module (running its declarations, which validate themselves), reads the
cluster's jobs of this app and the declared names (consistent reads), computes the plan
(:func:`raftsched.sdk.plan.plan`), prints it, and unless ``--dry-run`` applies it: the creates
and updates in one ``POST /v1/jobs:batch`` (one per 10 000 jobs), then, with ``--prune``, a
``DELETE`` for each of this app's jobs that is no longer declared. A second sync finds nothing
to change. Exit status: 0 done (or nothing to do), 1 a conflict or an API error, 2 the app could
not be loaded.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from ..core import limits, pipelines
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


def apply(client, app: App, p: Plan) -> dict:
    """Apply ``p``: the puts in batches of at most batch_jobs_max, parents before the jobs that
    run after them (pipelines), then the deletes, children first.
    ``{"created", "updated", "deleted", "commands"}``."""
    specs = app.specs()
    puts = set(p.puts())
    names = [n for n in pipelines.parents_first(specs) if n in puts]
    commands = 0
    for k in range(0, len(names), limits.batch_jobs_max):
        res = client.put_jobs({n: specs[n] for n in names[k:k + limits.batch_jobs_max]})
        commands += res.get("commands", 0)
    deleted = []
    existing = {n: client.get_job(n)["spec"] for n in p.delete} if len(p.delete) > 1 else {}
    order = list(reversed(pipelines.parents_first(existing))) if existing else list(p.delete)
    for name in order:
        try:
            client.delete_job(name)
        except NotFound:
            pass  # gone already (another sync, or by hand): what prune wanted
        deleted.append(name)
    return {"created": list(p.create), "updated": [u.job for u in p.update], "deleted": deleted,
            "commands": commands}


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
    print(f"raftsched sync: {e.message}" + (f"\n{json.dumps(body, indent=2)}" if isinstance(body, dict) else ""),
          file=sys.stderr)
    if not e.definite:
        print("raftsched sync: the outcome is unknown; run the sync again (it applies only what is left)",
              file=sys.stderr)
    return 1


def run(args: Any, client) -> int:
    """The ``raftsched sync`` subcommand (cli.py): ``args.app``, ``args.dry_run``,
    ``args.prune``, ``args.json``; ``client`` a raftsched.client.Client."""
    try:
        app = load_app(args.app)
    except (AppLoadError, DeclarationError) as e:
        print(f"raftsched sync: {args.app}: {e}", file=sys.stderr)
        return 2
    try:
        existing = existing_jobs(client, app)
    except RaftschedError as e:
        return _fail(e)
    p = plan(app.name, app.views(), existing, prune=args.prune)
    out: dict = {"plan": p.to_dict(), "dry_run": bool(args.dry_run), "applied": None}
    if not args.json:
        print(format_plan(p, app, ",".join(client.urls), args.dry_run))
    if p.conflicts:
        msg = (f"{len(p.conflicts)} declared job(s) belong to another app; nothing applied. Rename them, "
               "or delete the other app's job first")
        if args.json:
            print(json.dumps(out, indent=2))
        print(f"raftsched sync: {msg}", file=sys.stderr)
        return 1
    if not args.dry_run and p.changes:
        try:
            out["applied"] = apply(client, app, p)
        except RaftschedError as e:
            if args.json:
                print(json.dumps(out, indent=2))
            return _fail(e)
    if args.json:
        print(json.dumps(out, indent=2))
    elif out["applied"] is not None:
        a = out["applied"]
        print(f"applied: {len(a['created'])} created, {len(a['updated'])} updated, {len(a['deleted'])} deleted")
    elif not p.changes:
        print("nothing to change")
    return 0
