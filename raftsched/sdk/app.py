"""Jobs declared in code: :class:`App` and its ``@app.job`` decorator.

Each option of the decorator is a field of the job spec (docs/api.md), and a declaration is
validated when it is made, at import, by the very function the nodes validate a PUT with
(core.model.validate_job): an unknown option, or a value the API would refuse, raises
:class:`DeclarationError` naming the job, the function and the field.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import time
from typing import Any, Callable, TypeVar, cast

from ..core import limits, model
from ..core.errors import InvalidSpec
from .context import Context

#: A handler, as @App.job decorates it (its signature kept for type checkers).
_F = TypeVar("_F", bound=Callable[..., Any])

#: The label every job of an app carries, with the app's name: how ``raftsched sync --prune``
#: tells this app's jobs from every other job.
APP_LABEL = "raftsched.app"

#: Options that go into the spec's ``schedule``.
SCHEDULE_OPTIONS = model.SCHEDULE_FIELDS
#: Options that are top-level spec fields of the same name (the schedule is made of the
#: options above, the executor is the decorated function).
SPEC_OPTIONS = model.SPEC_FIELDS - {"schedule", "executor"}
#: Every option of ``@app.job``.
OPTIONS = SCHEDULE_OPTIONS | SPEC_OPTIONS
#: The order a sent schedule's fields are written in (for readable, stable output).
_SCHEDULE_ORDER = ("cron", "timezone", "dst", "every_s", "start_at", "at")
assert set(_SCHEDULE_ORDER) == SCHEDULE_OPTIONS
#: Options that only each job can give (an app-wide schedule makes no sense).
_JOB_ONLY = frozenset({"cron", "every_s", "at", "start_at", "after", "match", "max_wait_s"})
#: Schedule options an App default gives to the jobs whose schedule takes them only.
_SCHEDULE_SCOPED = {"timezone": "cron", "dst": "cron"}
#: Options that take a policy name for ``{"policy": name}``.
_POLICY_SHORTHAND = frozenset({"misfire", "overlap"})
#: ``placement`` not given: the App's own, ``{"labels": {"raftsched.app": NAME}}``.
_APP_PLACEMENT = object()


class DeclarationError(InvalidSpec):
    """A declaration the API would refuse, raised where it is made (at import).

    ``field`` is the spec field (``retry.max_attempts``, ``schedule.cron``); ``extra["job"]``
    the job's name, ``extra["target"]`` its handler (``module:function``)."""


@dataclasses.dataclass(frozen=True)
class JobDeclaration:
    """One ``@app.job``: what the cluster is sent, and the handler.

    :param name: the job's name.
    :param target: ``module:function`` of the handler: the spec's python executor target.
    :param function: the decorated function itself (``handler`` wraps it).
    :param handler: what the module holds under the function's name: the function, called with
        a :class:`Context` made from whatever run context it is given (:meth:`Context.of`).
    :param is_async: the function is a coroutine function (it runs on the worker's loop; a
        plain one runs in a thread).
    :param raw: the spec as it is sent (``PUT /v1/jobs/{name}``, ``POST /v1/jobs:batch``).
    :param spec: the spec as a node stores it (validate_job's normal form).
    """

    name: str
    target: str
    function: Callable
    handler: Callable
    is_async: bool
    raw: dict
    spec: dict

    @functools.cached_property
    def view(self) -> dict:
        """The spec as ``GET /v1/jobs/{name}`` shows it: what ``raftsched sync`` compares with
        the cluster's job. Made when first asked for, with the API's own view (node/views.py):
        a worker running the App's handlers never asks, and loads nothing of the node."""
        from ..node.views import spec_view
        return json.loads(json.dumps(spec_view(self.spec)))


class App:
    """A set of jobs declared in code, and defaults for them.

        app = App("reports", queue="reports", misfire="fire_once", retry={"max_attempts": 3})

        @app.job("nightly-report", cron="0 2 * * *", timezone="Europe/Berlin")
        def nightly_report(ctx):
            ...

    :param name: the app's name (job name rules), marked on each of its jobs as the label
        ``raftsched.app``; ``raftsched sync --prune`` deletes only jobs with this label. Default:
        the name of the module that makes the App. Give one: renaming the module would otherwise
        make the jobs another app's.
    :param defaults: any option of :meth:`job` but a schedule (``cron``, ``every_s``, ``at``,
        ``start_at``), for every job of the app; a job's own option replaces the default
        (``labels`` and ``placement`` labels are merged). ``timezone`` and ``dst`` apply to the
        app's cron jobs only.

    Every job is placed on the worker label ``raftsched.app=NAME`` (its spec's ``placement``),
    the label ``raftsched worker --app`` gives the worker that runs the app's handlers, and to
    which that worker is dedicated: the app's runs go to its workers only, and its workers take
    nothing else. A ``placement`` option adds labels to it; ``placement=None`` (for one job or
    as the App's default) leaves the job without placement, for any worker that can import the
    handler with its python executor (a node's, say).

    :raises DeclarationError: an unknown option, or a default the API would refuse.
    """

    def __init__(self, name: str | None = None, **defaults: Any) -> None:
        if name is None:
            name = sys._getframe(1).f_globals.get("__name__", "__main__")
            if name == "__main__":
                raise DeclarationError("give the App a name: it marks its jobs (label raftsched.app), and "
                                       "a script run as __main__ has no module name to default to", field="name")
        try:
            model.check_name(name, "name")
        except InvalidSpec as e:
            raise DeclarationError(f"App name {name!r} {e.message}", field="name") from None
        self.name = name
        for k in defaults:
            if k in _JOB_ONLY:
                what = "pipeline parents (@app.job(..., after=[...]))" if k in ("after", "match", "max_wait_s") \
                    else "schedule"
                raise DeclarationError(f"App({name!r}): {k} is part of a job's own {what}, not an app default",
                                       field=k)
            if k not in OPTIONS:
                raise DeclarationError(f"App({name!r}): unknown option {k}; the options are: "
                                       f"{', '.join(sorted(OPTIONS - _JOB_ONLY))}", field=k)
        labels = defaults.get("labels")
        if isinstance(labels, dict) and APP_LABEL in labels:
            raise DeclarationError(f"App({name!r}): labels.{APP_LABEL} is the App's name, set by the App",
                                   field=f"labels.{APP_LABEL}")
        if defaults.get("placement", _APP_PLACEMENT) is not None and len(name) > limits.worker_label_chars_max:
            raise DeclarationError(
                f"App name {name!r} is longer than {limits.worker_label_chars_max} characters: its jobs are placed "
                f"on the worker label {APP_LABEL}={name} (or give placement=None)", field="name")
        self.defaults = dict(defaults)
        self._check_defaults()
        self._jobs: dict[str, JobDeclaration] = {}
        self._by_target: dict[str, JobDeclaration] = {}

    def __repr__(self) -> str:
        return f"App({self.name!r}, jobs={list(self._jobs)})"

    # ------------------------------------------------------------------ declaring
    def job(self, name: str | None = None, **options: Any) -> Callable[[_F], _F]:
        """Declare the decorated function as the handler of job ``name`` (default: the
        function's name), with the spec the options say:

        - the schedule: exactly one of ``cron`` (with ``timezone``, ``dst``), ``every_s`` (with
          ``start_at``) or ``at``;
        - ``misfire``: a policy name (``"fire_once"``) or the whole object
          (``{"policy": "fire_all", "max_catchup": 10}``); required, as in the API, unless the
          App gives it;
        - ``overlap``: a policy name or the object;
        - every other top-level spec field under its own name: ``retry``, ``timeout_s``,
          ``priority``, ``payload``, ``jitter_s``, ``queue``, ``tenant``, ``history``,
          ``description``, ``labels``, ``deadline``, ``notify``, ``pause_on_failure``, ``metrics``,
          ``secrets``, ``keep_output`` (docs/api.md, "The job spec"; docs/notifications.md);
        - ``after``: the jobs it runs after (pipelines, docs/pipelines.md): names, or
          ``{"job": NAME, "on": "success" | "failure" | "finished"}``; with no schedule the job
          is triggered by them, with one it is gated (``match``, ``max_wait_s``). The handler
          reads its parents' outcomes and results in ``ctx.upstream``, and what it returns
          (JSON, at most 4 KiB) is handed to its own children;
        - ``placement``: more worker labels for the job's runs, beside the App's
          ``raftsched.app`` (which is always there); ``None``: no placement at all.

        The executor is ``{"type": "python", "target": "<module>:<function>"}``: the handler
        must be a module-level function of an importable module, sync or async. It is called
        with a :class:`Context`.

        :raises DeclarationError: at once, naming the field: an unknown option, a value the
            API would refuse, a job name declared twice, a handler that is not a module-level
            function.
        """
        if callable(name):
            raise DeclarationError(f"@app.job on {getattr(name, '__qualname__', name)!r} needs its parentheses "
                                   "and options: @app.job(\"name\", cron=..., misfire=...)", field="name")
        for k in options:
            if k not in OPTIONS:
                raise DeclarationError(
                    f"@app.job({name!r}): unknown option {k}; the options are: {', '.join(sorted(OPTIONS))}",
                    field=k, job=name)

        def decorate(fn: _F) -> _F:
            decl = self._declare(name or getattr(fn, "__name__", None), fn, options)
            self._jobs[decl.name] = decl
            self._by_target.setdefault(decl.target, decl)
            # (called as the function is: a type checker keeps the handler's own signature)
            return cast(_F, decl.handler)

        return decorate

    def _declare(self, name: str, fn: Callable, options: dict) -> JobDeclaration:
        if not callable(fn):
            raise DeclarationError(f"@app.job({name!r}) decorates a function, not {type(fn).__name__}",
                                   field="executor.target", job=name)
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        target = f"{module}:{qualname}"
        where = f"@app.job({name!r}) on {target}"
        if name in self._jobs:
            raise DeclarationError(f"{where}: job {name!r} is declared twice in App {self.name!r} "
                                   f"(first on {self._jobs[name].target})", field="name", job=name, target=target)
        if module == "__main__":
            raise DeclarationError(f"{where}: a handler in a script run as __main__ cannot be imported by a "
                                   "worker; declare it in a module and import that", field="executor.target",
                                   job=name, target=target)
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise DeclarationError(f"{where}: a handler returns (or raises); it cannot be a generator",
                                   field="executor.target", job=name, target=target)
        raw = self._raw_spec(name, target, options, where)
        try:
            spec = model.validate_job(name, raw, int(time.time() * 1000))
        except InvalidSpec as e:
            field = e.field
            if field == "executor.target":
                msg = f"the handler must be a module-level function ({target!r} is not 'module:function')"
            else:
                msg = e.message
            option = _option_of(field)
            if field == "executor.target":
                named = "the handler"  # (made of the function, no option of the decorator's)
            else:
                named = f"{field} (option {option})" if option and option != field else (field or "spec")
            raise DeclarationError(f"{where}: {named}: {msg}", field=field, job=name, target=target) from None
        is_async = inspect.iscoroutinefunction(fn)
        return JobDeclaration(name=name, target=target, function=fn, handler=_handler(fn, is_async),
                              is_async=is_async, raw=raw, spec=spec)

    def _raw_spec(self, name: str, target: str, options: dict, where: str) -> dict:
        """The spec a declaration sends: the App's defaults, then the job's options."""
        user_labels = options.get("labels", {})
        if isinstance(user_labels, dict) and APP_LABEL in user_labels:
            raise DeclarationError(f"{where}: labels.{APP_LABEL} is the App's name, set by the App",
                                   field=f"labels.{APP_LABEL}", job=name, target=target)
        merged = dict(self.defaults)
        merged.update(options)
        placement = self._placement(merged.pop("placement", _APP_PLACEMENT), where, name, target)
        sched = {k: merged.pop(k) for k in _SCHEDULE_ORDER if k in merged}
        kind = next((k for k in ("cron", "every_s", "at") if k in sched), None)
        for k, needs in _SCHEDULE_SCOPED.items():
            if k in sched and k not in options and kind != needs:
                del sched[k]  # an app-wide default for the jobs it applies to
        raw: dict = {"schedule": sched, "executor": {"type": "python", "target": target}}
        if not sched and "after" in merged:
            del raw["schedule"]  # a triggered job (pipelines): its parents' outcomes make its runs
        for k, v in merged.items():
            raw[k] = {"policy": v} if k in _POLICY_SHORTHAND and isinstance(v, str) else v
        # (None: no labels of its own, as a spec's null field is left out: the App's mark stays)
        app_labels, job_labels = self.defaults.get("labels"), options.get("labels")
        app_labels, job_labels = {} if app_labels is None else app_labels, {} if job_labels is None else job_labels
        if isinstance(app_labels, dict) and isinstance(job_labels, dict):
            # The App's labels, then the job's, merged; then the App's mark.
            raw["labels"] = {**app_labels, **job_labels, APP_LABEL: self.name}
        # (labels that are not a map are left as they are, for validate_job to refuse by name)
        if placement is not None:
            raw["placement"] = placement
        return raw

    def _placement(self, given: Any, where: str, name: str, target: str) -> Any:
        """The placement a declaration sends: the App's label ``raftsched.app`` with any the
        option gives, or None (``placement=None``: no placement)."""
        if given is None:
            return None
        own = {APP_LABEL: self.name}
        if given is _APP_PLACEMENT:
            return {"labels": own}
        labels = given.get("labels") if isinstance(given, dict) else None
        if not isinstance(labels, dict):
            return given  # malformed: left as it is, for validate_job to refuse by name
        if labels.get(APP_LABEL, self.name) != self.name:
            raise DeclarationError(f"{where}: placement.labels.{APP_LABEL} is the App's name, set by the App "
                                   "(placement=None for a job of no app's workers)",
                                   field=f"placement.labels.{APP_LABEL}", job=name, target=target)
        return {**given, "labels": {**labels, **own}}

    def _check_defaults(self) -> None:
        """Validate the defaults on a probe job, so that a bad default raises where the App is
        made, whether or not a job uses it."""
        d = dict(self.defaults)
        probe_sched: dict = {"every_s": 3600}
        if "timezone" in d or "dst" in d:
            probe_sched = {"cron": "0 0 * * *"}
        for k in _SCHEDULE_ORDER:
            if k in d:
                probe_sched[k] = d.pop(k)
        raw = {"schedule": probe_sched, "executor": {"type": "python", "target": "probe:probe"},
               "misfire": {"policy": "skip"}}
        placement = d.pop("placement", None)
        if placement is not None:
            raw["placement"] = placement  # the App's own label is added per job (its name is checked)
        for k, v in d.items():
            raw[k] = {"policy": v} if k in _POLICY_SHORTHAND and isinstance(v, str) else v
        try:
            model.validate_job("probe", raw)
        except InvalidSpec as e:
            raise DeclarationError(f"App({self.name!r}) default {e.field}: {e.message}", field=e.field) from None

    # ------------------------------------------------------------------ what it declared
    @property
    def jobs(self) -> dict[str, JobDeclaration]:
        """Every declaration, by job name, in the order they were made."""
        return dict(self._jobs)

    def specs(self) -> dict[str, dict]:
        """The spec of every job, as it is sent: ``{name: spec}`` (``POST /v1/jobs:batch``'s
        ``jobs``)."""
        return {n: d.raw for n, d in self._jobs.items()}

    def views(self) -> dict[str, dict]:
        """The spec of every job as the API shows it once stored: ``{name: spec}``."""
        return {n: d.view for n, d in self._jobs.items()}

    # ------------------------------------------------------------------ running the handlers
    def handler_for(self, target: str) -> Callable:
        """The handler of executor target ``target`` (``module:function``): called with any run
        context (:meth:`Context.of`), it calls the function with a :class:`Context` and returns
        what it returns (a coroutine, for an async function: ``declaration_for(target).is_async``).

        :raises KeyError: no job of this app has that target."""
        return self.declaration_for(target).handler

    def declaration_for(self, target: str) -> JobDeclaration:
        """The (first) declaration whose handler is ``target``. :raises KeyError:"""
        try:
            return self._by_target[target]
        except KeyError:
            raise KeyError(f"App {self.name!r} has no job whose target is {target!r}") from None

    def run(self, ctx: Any, worker: str | None = None) -> Any:
        """Call the handler of job ``ctx.job`` with the :class:`Context` of ``ctx``: its result,
        or for an async handler the coroutine to await.

        :raises KeyError: this app declares no job of that name."""
        decl = self._jobs.get(getattr(ctx, "job", None))
        if decl is None:
            raise KeyError(f"App {self.name!r} declares no job {getattr(ctx, 'job', None)!r}")
        return decl.handler(Context.of(ctx, worker))


def _option_of(field: str | None) -> str | None:
    """The decorator option a spec field comes from (``schedule.cron`` -> ``cron``)."""
    if not field:
        return None
    parts = field.split(".")
    if parts[0] == "schedule" and len(parts) > 1:
        return parts[1]
    return parts[0]


def _handler(fn: Callable, is_async: bool) -> Callable:
    """``fn`` called with the :class:`Context` of whatever run context it is given: the python
    executor's RunContext, a Context, or a worker's grant made into one."""
    if is_async:
        @functools.wraps(fn)
        async def handler(ctx, *args, **kwargs):
            return await fn(Context.of(ctx), *args, **kwargs)
    else:
        @functools.wraps(fn)
        def handler(ctx, *args, **kwargs):
            return fn(Context.of(ctx), *args, **kwargs)
    handler.__raftsched_job__ = True
    return handler
