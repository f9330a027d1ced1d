"""A worker: leases runs, executes them, heartbeats and reports (docs/workers.md).

One lease loop for both kinds of worker, over one of two channels:

- ``loop.py``: the lease loop (:class:`~raftsched.worker.loop.LeaseLoop`), its ``Channel``
  interface, and the embedded channel (``EmbeddedChannel``, ``Worker``): the worker a node runs
  in its own process, proposing through the Raft adapter the node hands it.
- ``remote.py``: ``raftsched worker``, a process outside the Raft quorum: the same loop over
  HTTP (``RemoteChannel``, ``run_worker``).
- ``executors/``: how one run executes (shell, http, python), the run contract, output capture.
- ``masking.py``: a run's secrets, given to its executor and masked out of what it reports.
- ``limits.py``: the bounds of one worker process.

The node embeds this package (node/node.py builds its ``Worker``); nothing here imports
``raftsched.node``, so a remote worker, or ``raftsched worker --app`` (sdk/worker.py), loads
neither the API server nor the trigger (tests/test_worker_imports.py). The node's side of the
worker protocol stays in the node: its HTTP handlers (node/api.py), the requests' validation
and commands (node/fleet.py), and the lease requests waiting for work (node/dispatch.py).
"""
