"""Module-level handlers for the SDK's tests (a handler must be importable as module:function);
the tests declare them with their own Apps."""


def report(ctx):
    return {"job": ctx.job, "slot": ctx.slot_iso, "token": ctx.fencing_token, "logger": ctx.log.name}


async def areport(ctx):
    return {"job": ctx.job, "attempt": ctx.attempt, "worker": ctx.worker}


def other(ctx):
    return None


def gen(ctx):
    yield ctx
