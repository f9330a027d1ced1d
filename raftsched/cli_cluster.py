"""Which members the leader hears, for ``raftsched cluster`` and ``raftsched members list``
(cli.py). ``GET /v1/cluster`` answers the asked node's own view: only the leader's has
``replication.followers`` (each follower's ``last_heard_s``, ``state``, ``lag_entries``,
``stalled_s``) and the conditions the leader sees (a stalled follower, a member's clock). So the
command asks the leader too when the node that answered is not it, and says so when it cannot:
a member is never shown as fine because nobody could tell.

The leader is asked only at one of the nodes the command was given (``--url``, a context, the
recorded cluster: cli_target.py), never at an address only the cluster announced
(``member_urls``): the token goes nowhere else (docs/api.md, "The command line finds its
cluster")."""
from __future__ import annotations

import urllib.parse
from typing import Any, Callable

from .core.errors import RaftschedError

#: A follower whose last answer is older than this is shown as not heard. The leader sends
#: every follower a heartbeat each 0.1 s (replication/conf.py appendEntriesPeriod), and a
#: follower that hears nothing for its election timeout (0.5-1 s) stands for election; 2 s is
#: how long the leader waits before it takes a follower's answers as lost
#: (replication/_progress.py INFLIGHT_STALL_S).
HEARD_WITHIN_S = 2.0


def heard(follower: Any) -> str:
    """Whether the leader hears a follower, in words, from its ``last_heard_s`` (the seconds
    since the leader last had an answer of it). Not its ``last_ack_age_s``: that is the age of
    the last acknowledgement that moved its match index, which grows on a live follower of an
    idle cluster too; a leader that gives no ``last_heard_s`` (a version before it) is unknown."""
    if not isinstance(follower, dict):
        return "not heard (the leader has no answer of it)"
    if "last_heard_s" not in follower:
        return "unknown (the leader does not say when it last heard it: an older version)"
    age_s = follower["last_heard_s"]
    if age_s is None:
        return "not heard since this leader was elected"
    if not isinstance(age_s, (int, float)) or isinstance(age_s, bool):
        return "unknown (the leader's answer is malformed)"
    if age_s <= HEARD_WITHIN_S:
        return f"last heard {age_s:.1f} s ago"
    return f"not heard for {age_s:.0f} s"


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of a URL, the default port filled in; None when it is no URL."""
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    except ValueError:
        return None
    return (u.scheme, (u.hostname or "").lower(), port) if u.hostname else None


def leader_view(body: dict, urls: list[str], ask: Callable[[str], dict]) -> tuple[dict | None, str | None, str | None]:
    """The leader's ``/v1/cluster`` answer, given ``body`` (the answer of the node that was
    asked) and the nodes the command was given (``urls``); ``ask(url)`` asks one of them.

    :returns: ``(the leader's answer, the URL it came from, None)``, or ``(None, None, why
        not)``. ``body`` itself when that node is the leader (URL None)."""
    if body.get("role") == "leader":
        return body, None, None
    leader = body.get("leader")
    node = body.get("node") or "the node asked"
    if not leader:
        return None, None, f"{node} knows no leader"
    announced = (body.get("member_urls") or {}).get(leader)
    want = _origin(announced) if isinstance(announced, str) else None
    own = (body.get("member_urls") or {}).get(body.get("raft"))
    answered = _origin(own) if isinstance(own, str) else None  # the node asked: a follower, known
    given = [u for u in urls if _origin(u) is not None and (answered is None or _origin(u) != answered)]
    # Where the leader's announced URL is among the nodes given, there; else each node given
    # (the leader may be reached by a name it did not announce, or announced none).
    first = [u for u in given if want is not None and _origin(u) == want]
    tried: list[str] = []
    for url in first + [u for u in given if u not in first]:
        try:
            answer = ask(url)
        except RaftschedError as e:
            tried.append(f"{url}: {e.message}")
            continue
        if isinstance(answer, dict) and answer.get("role") == "leader":
            return answer, url, None
        tried.append(f"{url}: {answer.get('role') if isinstance(answer, dict) else 'no answer'}")
    where = f" (it announced {announced})" if announced else " (it announced no API URL)"
    if want is not None and not first:
        why = (f"the leader {leader}'s API{where} is not one of the nodes given: add it to --url "
               "(the token is sent only to those)")
    else:
        why = f"the leader {leader}{where} could not be asked"
    return None, None, why + (f"; asked: {'; '.join(tried)}" if tried else "")


def members_heard(body: dict, leader_body: dict | None, why: str | None) -> list[dict]:
    """A row a member (voters, then learners, as ``body`` lists them): its role, whether the
    leader hears it (``heard``), its lag and replication state as the leader sees them, its API
    URL. Without the leader's view, ``heard`` says it is unknown, and why."""
    src = leader_body if leader_body is not None else body
    voters = list(src.get("members") or [])
    learners = [m for m in (src.get("learners") or []) if m not in voters]
    leader = src.get("leader") if leader_body is not None else body.get("leader")
    followers = ((leader_body or {}).get("replication") or {}).get("followers") or {}
    urls = {**(body.get("member_urls") or {}), **((leader_body or {}).get("member_urls") or {})}
    rows = []
    for m in voters + learners:
        role = "leader" if m == leader else "learner" if m in learners else "voter"
        row: dict[str, Any] = {"member": m, "role": role}
        f = followers.get(m) if isinstance(followers, dict) else None
        if leader_body is None:
            row["heard"] = f"unknown: {why}" if why else "unknown"
        elif m == leader:
            row["heard"] = "the leader (answered)"
        else:
            row["heard"] = heard(f)
        if isinstance(f, dict):
            row.update(lag_entries=f.get("lag_entries"), state=f.get("state"), stalled_s=f.get("stalled_s"))
        row["url"] = urls.get(m)
        rows.append(row)
    return rows


def add_leader_view(out: dict, body: dict, urls: list[str], ask: Callable[[str], dict]) -> str | None:
    """Add to ``out`` (what the command prints) ``members_heard``, the leader's ``conditions``
    (as ``leader_conditions`` when the node asked is not the leader: its own stay in
    ``conditions``) and ``leader_view`` (where the leader's view was read, or why it was not).
    :returns: why the leader's view could not be read, or None."""
    leader_body, url, why = leader_view(body, urls, ask)
    out["members_heard"] = members_heard(body, leader_body, why)
    if leader_body is None:
        out["leader_view"] = f"not read: {why}"
    elif leader_body is body:
        out["leader_view"] = f"{body.get('node')} is the leader"
    else:
        out["leader_view"] = f"read from the leader, {leader_body.get('node')} at {url}"
        out["leader_conditions"] = leader_body.get("conditions", [])
    return why
