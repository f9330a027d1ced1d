"""Profile of the fire path without a network: planning, encoding and applying one tick's fires.

    .venv/bin/python scripts/measure profile-fire [N]

Registers N interval jobs (default 20 000) in one in-process SchedulerState, makes them all due,
and times policy.plan_fire, commands.encode and state.apply_bytes per slot, then prints a cProfile
of a second tick. In a cluster every replica applies every fire, so apply's cost counts three
times on a three-node machine: this is what bounds slots committed per second (docs/benchmarks.md).
``GC_THRESHOLD=a,b,c`` sets the collector's thresholds first (CPython's default otherwise; the
node's gen0 is node/limits.py gc_gen0_threshold).
"""
import cProfile
import gc
import os
import pstats
import sys
import time

from measure import ROOT, Smoke

SMOKE = [Smoke(("300",), "apply", env=(("GC_THRESHOLD", "20000,10,10"),))]


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    if os.environ.get("GC_THRESHOLD"): gc.set_threshold(*map(int, os.environ["GC_THRESHOLD"].split(",")))
    from raftsched.core.state import SchedulerState
    from raftsched.core import commands as C, model, policy
    st=SchedulerState()
    try:  # the leader's due index, attached as its trigger does (code before core/due.py kept one built in)
        from raftsched.core.due import DueIndex
        st.due = DueIndex()
        pop_due = lambda t, n: st.due.pop(st.jobs, t, n)
    except ImportError:
        pop_due = st.pop_due
    N = int(argv[0]) if argv else 20000
    now=1_800_000_000_000
    spec=model.validate_job("j",{"schedule":{"every_s":1},"executor":{"type":"shell","argv":["true"]},"misfire":{"policy":"skip"},"queue":"q"})
    st.apply(C.make("put_queue",now,None,name="q",max_depth=10**6,on_full="reject"))
    t=time.perf_counter()
    for i in range(N):
        st.apply_bytes(C.encode(C.make("put_job",now,f"r{i}",name=f"j{i}",spec=spec,next=now+1000,cursor=now,anchor=now)))
    print("put_job/s", N/(time.perf_counter()-t))
    def tick(t_ms):
        t0=time.perf_counter()
        jobs=pop_due(t_ms, 10**6)
        plans=[policy.plan_fire_compact(j["spec"],j["anchor"],j["cursor"],t_ms,j["gen"],j["name"]) for j in jobs]
        t1=time.perf_counter()
        datas=[]
        for k in range(0,len(plans),400):
            datas.append(C.encode(C.make("fire",t_ms,None,entries=plans[k:k+400])))
        t2=time.perf_counter()
        for d in datas: st.apply_bytes(d)
        t3=time.perf_counter()
        print(f"jobs {len(jobs)} plan {1e6*(t1-t0)/len(jobs):.1f}us encode {1e6*(t2-t1)/len(jobs):.1f}us apply {1e6*(t3-t2)/len(jobs):.1f}us bytes/entry {sum(map(len,datas))/len(jobs):.0f}")
    tick(now+1000)
    for k in range(2, 6): tick(now+k*1000)
    pr=cProfile.Profile(); pr.enable(); tick(now+6000); pr.disable()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(18)
    return 0
