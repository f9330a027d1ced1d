"""``python -m raftsched.sdk.child MODULE:ATTR TARGET RESULT_PATH``: one run of an App's handler
in a process of its own (``raftsched worker --app ... --isolation subprocess``, sdk/worker.py).

The run's identity comes from its ``RAFTSCHED_*`` environment (the executor contract, as a
shell run sees it). The child imports the App (the current directory first on the import path,
as the worker does), calls the handler through the python executor's run
(``executors.run_function``, so its outcome is the one an in-process run would report: the repr
of what it returned, or the exception and its traceback), writes ``{"ok", "error", "output"}``
as JSON to RESULT_PATH, with ``result``, what the handler returned when that is JSON of at most
result_bytes_max (pipelines: handed to the run's children, as an in-process run's is), and exits 0 when the handler succeeded, 1 when it failed, 2 when the
run could not even start. What the handler prints, and logs (``ctx.log``, INFO and up), goes to
the run's output. The worker kills it at the run's timeout. Its stdin holds the job's secrets
(JSON), which the outcome is masked of before it is cut, as an in-process run's is: read to its
end before the app is imported, and stdin is then /dev/null (not the environment, which
``/proc/PID/environ`` shows any process of the user for the child's whole life; started by hand,
give it ``</dev/null``, or it waits for its stdin to end). The handler reads them as
``ctx.secrets``, as an in-process handler does; they are in the child's memory only.

The child leads a process group of its own (the shell executor's), so a worker killed by
SIGKILL would leave it running, and the run, handed on once its lease expires, would run twice
at once. The worker gives its pid (``RAFTSCHED_SDK_WORKER_PID``): a thread of the child watches
its parent, and once it is another process (the worker died, the child was handed to init),
removes the result file and kills the child's whole process group, what the handler started
included (:func:`_watch_parent`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import traceback

#: How often the child looks whether its worker is still its parent (_watch_parent).
PARENT_LOOK_S = 0.2

#: The environment variable the worker names itself in (sdk/worker.py run_in_child).
WORKER_PID_ENV = "RAFTSCHED_SDK_WORKER_PID"


def _watch_parent(path: str) -> None:
    """Kill this process group once the worker that started it is gone (module docstring); from
    a daemon thread, so whatever the handler does in the main thread. Without the worker's pid
    (started by hand), nothing is watched."""
    try:
        worker = int(os.environ.get(WORKER_PID_ENV, ""))
    except ValueError:
        return

    def watch() -> None:
        wait = threading.Event()
        while os.getppid() == worker:
            wait.wait(PARENT_LOOK_S)
        try:
            os.unlink(path)
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="raftsched-watch-worker", daemon=True).start()


def _context():
    from ..core.schedule import parse_iso_ms
    from ..worker.executors import RunContext
    env = os.environ
    return RunContext(run_id=env["RAFTSCHED_RUN_ID"], job=env["RAFTSCHED_JOB"],
                      slot_ms=parse_iso_ms(env["RAFTSCHED_SLOT"], "RAFTSCHED_SLOT"),
                      attempt=int(env["RAFTSCHED_ATTEMPT"]), fencing_token=int(env["RAFTSCHED_FENCING_TOKEN"]),
                      payload=json.loads(env.get("RAFTSCHED_PAYLOAD") or "null"),
                      worker_id=env.get("RAFTSCHED_WORKER_ID"),
                      upstream=json.loads(env["RAFTSCHED_UPSTREAM"]) if env.get("RAFTSCHED_UPSTREAM") else None)


def _secrets() -> dict[str, str]:
    """The job's secrets the worker wrote to this process's stdin (JSON; nothing: none), read to
    the end; stdin is /dev/null afterwards, for the handler and what it starts."""
    try:
        data = sys.stdin.buffer.read() if sys.stdin is not None else b""
    except (OSError, ValueError):
        data = b""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        pass
    try:
        got = json.loads(data or b"{}")
    except (ValueError, RecursionError):
        return {}
    return {k: v for k, v in got.items() if isinstance(v, str)} if isinstance(got, dict) else {}


def _write(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m raftsched.sdk.child MODULE:ATTR TARGET RESULT_PATH", file=sys.stderr)
        return 2
    ref, target, path = argv
    _watch_parent(path)
    secrets = _secrets()
    # The handler's log lines (ctx.log) go where its prints go: into the run's output.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    try:
        from ..core import limits
        from ..worker.executors import run_function
        from .context import Context
        from .loader import load_app
        run_ctx = _context()
        run_ctx.secrets = secrets  # the handler's ctx.secrets, and the masking of the outcome
        ctx = Context.of(run_ctx)
        decl = load_app(ref).declaration_for(target)
    except BaseException as e:  # the app's import, or a broken environment: the run fails, saying why
        reason, tb = f"cannot load {ref} for {target}: {type(e).__name__}: {e}", traceback.format_exc()
        try:  # masked before it is cut, as a run's outcome is
            from ..worker.executors._output import short, tail_str
            from ..worker.masking import secret_values
            masked = secret_values(None, secrets)
            reason, tb = short(reason, masked=masked), tail_str(tb, masked=masked)
        except BaseException:  # a worker package that cannot be imported: the worker masks what it can
            reason, tb = reason[:400], tb[-4096:]
        _write(path, {"ok": False, "error": reason, "output": tb})
        return 2
    out = asyncio.run(run_function(decl.handler, ctx, limits.timeout_s_max, None, name=target))
    res = {"ok": out.ok, "error": out.error, "output": out.output}
    if out.ok and run_ctx.result is not None:
        from ..worker.loop import run_result
        kept = run_result(run_ctx.result)
        if kept is not None:
            res["result"] = kept
        else:
            res["output"] = (out.output + f"\nthe handler's result is not JSON of at most {limits.result_bytes_max} "
                                          "bytes: not kept\n")[-limits.output_bytes_max:]
    _write(path, res)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
