"""The docs run as written (issue 26, section 6): every curl example that calls the API sends
the token; the errors table of docs/api.md lists each status and code once; its CLI table is one
table; the messages it quotes are the code's."""
from __future__ import annotations

import re

import pytest

from procs import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "README.md"]


def _commands(text: str):
    """Each shell command of the fenced sh blocks, continuation lines joined."""
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, re.S):
        for cmd in re.sub(r"\\\n", " ", block).splitlines():
            yield cmd


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_curl_example_sends_the_token(doc):
    missing = [cmd.strip() for cmd in _commands(doc.read_text())
               if re.search(r"\bcurl\b", cmd) and re.search(r"/v1/|/metrics", cmd)
               and not re.search(r"\$AUTH|Authorization: Bearer", cmd)]
    assert not missing, "\n".join(missing)


def _section(name: str) -> str:
    text = (REPO / "docs" / "api.md").read_text()
    start = text.index(f"\n## {name}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_errors_table_lists_each_status_and_code_once():
    rows = [line for line in _section("Errors").splitlines() if re.match(r"\|\s*\d{3}\s*\|", line)]
    keys = [tuple(c.strip() for c in row.strip("|").split("|")[:2]) for row in rows]
    assert rows and len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]


def test_the_cli_section_has_one_table():
    tables = re.findall(r"(?:^\|.*\|\n)+", _section("CLI client"), re.M)
    assert len(tables) == 1, f"{len(tables)} tables"


def test_the_quoted_cron_messages_are_the_codes():
    from raftsched.core.errors import InvalidSpec
    from raftsched.core.schedule import check_cron
    text = (REPO / "docs" / "api.md").read_text()
    quoted = re.findall(r'"message": "((?:invalid )?cron expression (?:[^"\\]|\\.)*)"', text)
    assert quoted
    for msg in quoted:
        expr = re.search(r"'([^']*)'", msg).group(1)
        with pytest.raises(InvalidSpec) as ei:
            check_cron(expr, now_ms=1_764_547_200_000)
        assert ei.value.message == msg.replace('\\"', '"')


def _example_scripts():
    """Each (script, subcommand) the docs run as ``python examples/SCRIPT.py SUBCOMMAND ...``."""
    found = set()
    for doc in DOCS:
        for cmd in _commands(doc.read_text()):
            m = re.search(r"\bpython3?\s+examples/(\w+\.py)\s+(\w[\w-]*)", cmd)
            if m:
                found.add(m.groups())
    return sorted(found)


def test_the_docs_run_example_scripts():
    assert ("nightly_pipeline.py", "demo") in _example_scripts()


@pytest.mark.parametrize("script,sub", _example_scripts(), ids=lambda v: v)
def test_each_example_script_the_docs_run_starts_as_a_script(script, sub):
    """Run as the docs run it (the file is ``__main__``, not imported): ``SUB --help`` exits 0. An
    SDK app declared in the script refuses its handlers under ``__main__``; the import-based test
    of the demo would not see that."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, f"examples/{script}", sub, "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_the_pipelines_extract_job_writes_json_to_its_result_file(tmp_path):
    """The extract job of docs/pipelines.md, its argv as the doc gives it, run with a result file:
    the file is the JSON the doc says its children see (the shell strips the quotes of
    ``echo {"rows": 42}``, which wrote ``{rows: 42}``: no result)."""
    import json
    import subprocess

    from raftsched.worker.sandbox import read_result
    text = (REPO / "docs" / "pipelines.md").read_text()
    body = re.search(r"curl [^\n]*/v1/jobs/extract -d '(.*?)'", text, re.S).group(1)
    argv = json.loads(body)["executor"]["argv"]
    out = tmp_path / "result.json"
    p = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", "RAFTSCHED_RESULT_FILE": str(out)},
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text()) == {"rows": 42} and read_result(str(out)) == {"rows": 42}


def test_the_sdk_options_docs_sdk_md_quotes_are_the_codes():
    """docs/sdk.md quotes the error an unknown option of ``@app.job`` raises, which lists every
    option: the list it quotes is the whole list (it once lacked after, deadline, match and
    max_wait_s), and the options table names each of them."""
    from raftsched import App
    from raftsched.sdk.app import OPTIONS, DeclarationError
    text = (REPO / "docs" / "sdk.md").read_text()
    quoted = re.search(r"raftsched sync: bad:app: (@app\.job\('nightly-report'\): unknown option retries; .*)", text)
    assert quoted
    with pytest.raises(DeclarationError) as ei:
        App("reports").job("nightly-report", cron="0 2 * * *", misfire="fire_once", retries=3)
    assert ei.value.message == quoted.group(1)
    table = text[text.index("| Option | Spec field |"):]
    table = table[:table.index("\n\n")]
    named = set(re.findall(r"^\|([^|]*)\|", table, re.M)[2:])
    assert OPTIONS <= set(re.findall(r"`(\w+)`", " ".join(named))), OPTIONS - set(re.findall(r"`(\w+)`", " ".join(named)))


def _route_keys(method: str, path: str) -> set[tuple[str, str]]:
    """(method, path) with each ``{x}`` written ``{}``, and a ``{x:a|b}`` part expanded."""
    m = re.search(r"\{\w+:([^}]*)\}", path)
    if m:
        return set().union(*(_route_keys(method, path[:m.start()] + alt + path[m.end():])
                             for alt in m.group(1).split("|")))
    return {(method, re.sub(r"\{\w*\}", "{}", path))}


def test_the_endpoint_table_of_docs_api_md_lists_every_route_and_no_other():
    """Each row's first cell names routes: ``METHOD /path[?query]``, and ``/x`` after it for a
    sibling (the last segment replaced). Once it left out graph, ping and deadlines."""
    from raftsched.node import api, routes
    served: set[tuple[str, str]] = set()
    for r in routes.table(api.ROUTES).values():
        served |= _route_keys(r.method, r.path)
    text = (REPO / "docs" / "api.md").read_text()
    start = text.index("| Method and path | Purpose | Success |")
    listed: set[tuple[str, str]] = set()
    for row in text[start:text.index("\n\n", start)].splitlines()[2:]:
        method, last = None, None
        for item in re.findall(r"`([^`]*)`", row.split("|")[1]):
            item = re.sub(r"\[?\?.*$", "", item)
            m = re.fullmatch(r"([A-Z]+) (/\S*)", item)
            if m:
                method, last = m.groups()
            else:
                assert method and last and item.startswith("/"), (row, item)
                last = last.rsplit("/", 1)[0] + item
            listed |= _route_keys(method, last)
    # The dashboard's row names its entry page; /ui redirects to it and /ui/{file} are its files.
    missing = served - listed - {("GET", "/ui"), ("GET", "/ui/{}")}
    assert not missing, f"routes the table leaves out: {sorted(missing)}"
    assert not listed - served, f"rows that are no route: {sorted(listed - served)}"
