"""fleet_e2e's runs that start no process: an SDK App of one ``async def`` handler that returns at
once, run by ``raftsched worker --app benchlib.noop_app:app`` on the worker's event loop.

A python job's run through a plain worker is a process of its own as the run user (the sandbox,
docs/security.md): a few milliseconds of CPU that would hide what the cluster spends scheduling
a run. The App's handlers are the worker's own code, run in its process (docs/sdk.md), so the
figure is the lease, the acquire, the complete and the worker protocol: what a run of a short
handler costs the nodes. The module imports nothing but the SDK (the worker imports it with the
scripts directory on its path)."""
from raftsched.sdk import App

app = App("bench-noop", queue="e2e", misfire="fire_all")


@app.job(every_s=1)
async def noop(ctx) -> None:
    return None
