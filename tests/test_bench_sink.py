"""The peers scenario's counting (scripts/benchlib/sink.py): slots lost and fired twice, the same
way for every system, from sink lines. Pure: no processes, no clock."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib.sink import count_window, first_fire_after, phases, read_sink, throughput  # noqa: E402

B = 1_000_000_000_000  # a whole second, ms since the epoch


def fire(job: str, slot: int, t: float | None = None, who: str = "p-1") -> dict:
    return {"j": job, "s": slot, "t": slot + 5 if t is None else t, "w": who}


def test_lost_and_fired_twice_per_job_on_its_own_grid():
    # j0 on whole seconds, j1 at phase 250 ms; window [B, B + 5 s).
    fires = [fire("j0", B + k * 1000) for k in range(5) if k != 2]  # j0 loses B+2s
    fires += [fire("j1", B + 250 + k * 1000) for k in range(5)]
    fires.append(fire("j1", B + 1250, who="p-2"))  # a second process fires j1's B+1.25s again
    fires.append(fire("j0", B + 5000))  # outside the window: not counted
    c = count_window(fires, ["j0", "j1"], 1000, B, B + 5000, phases(fires, 1000))
    assert (c["expected"], c["lost"], c["fired_twice"], c["extra_fires"]) == (10, 1, 1, 1)
    assert c["lost_examples"] == [["j0", B + 2000]]
    assert c["off_grid"] == 0 and c["lag_ms"]["p50"] == 5.0


def test_a_job_that_never_fired_loses_every_slot_of_the_window():
    fires = [fire("j0", B + k * 1000) for k in range(3)]
    c = count_window(fires, ["j0", "j1"], 1000, B, B + 3000, phases(fires, 1000))
    assert (c["expected"], c["lost"]) == (6, 3)


def test_first_fire_after_an_event_and_until_every_job_fired():
    fires = [fire("j0", B + 1000, t=B + 1400), fire("j1", B + 2000, t=B + 2600), fire("j0", B, t=B + 100)]
    a = first_fire_after(fires, B + 200, ["j0", "j1"])
    assert (a["next_fire_ms"], a["all_jobs_fired_ms"]) == (1200.0, 2400.0)
    b = first_fire_after(fires, B + 200, ["j0", "j1", "j2"])
    assert b["all_jobs_fired_ms"] is None and b["jobs_fired"] == 2


def test_throughput_and_a_torn_last_line(tmp_path):
    p = tmp_path / "sink.jsonl"
    lines = [json.dumps(fire(f"j{k}", B + k * 100 + s * 1000)) for s in range(4) for k in range(10)]
    p.write_text("\n".join(lines) + '\n{"j": "j0", "s": 17')  # a writer killed mid-line
    fires = read_sink([p, tmp_path / "missing.jsonl"])
    assert len(fires) == 40
    t = throughput(fires, [f"j{k}" for k in range(10)], 1000, B + 1000, B + 3000)
    assert (t["fires_per_s"], t["lost"], t["fired_twice"]) == (10.0, 0, 0)
