"""The SDK's types reach its users' type checkers (PEP 561): ``raftsched`` ships ``py.typed``,
``from raftsched import App, Context`` (the lazily loaded names) is typed, and ``@app.job``
keeps the handler's signature. Before, mypy said "module is installed, but missing library
stubs or py.typed marker", the top-level names were Any, and a decorated handler was
``def (*Any, **Any) -> Any`` (found by an SDK walk)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib

from procs import REPO

USER_CODE = textwrap.dedent('''
    from raftsched import App, AsyncClient, Client, Context

    app = App("typ", misfire="fire_once")


    @app.job("count", every_s=60)
    def count(ctx: Context) -> int:
        return ctx.attempt


    wrong: str = count
    client: Client | AsyncClient | None = None
''')


def test_the_package_is_typed_for_its_users(tmp_path):
    assert (REPO / "raftsched" / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["raftsched"]
    (tmp_path / "myjobs.py").write_text(USER_CODE)
    p = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-incremental", "myjobs.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, MYPYPATH=str(REPO)))
    lines = [ln for ln in p.stdout.splitlines() if ": error:" in ln]
    # The one error a typed decorator and typed names find (with Any, none at all).
    assert len(lines) == 1 and 'has type "Callable[[Context], int]", variable has type "str"' in lines[0], p.stdout
