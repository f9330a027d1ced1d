"""``MODULE:ATTR`` -> the App it names (``raftsched sync``, and later ``raftsched worker --app``)."""
from __future__ import annotations

import importlib
import os
import sys

from .app import App


class AppLoadError(Exception):
    """The reference names no App: no such module or attribute, or not an App."""


def load_app(ref: str) -> App:
    """Import ``MODULE`` and return its ``ATTR`` (default ``app``) from ``MODULE:ATTR``.

    The current directory comes first on the import path, as with ``python -m``, so a module of
    the project one runs from is found. Importing runs the module's declarations: a bad one
    raises :class:`~raftsched.sdk.app.DeclarationError`. The import writes no bytecode: running
    ``raftsched sync`` or ``raftsched worker --app`` leaves no ``__pycache__`` in the project.

    :raises AppLoadError: the module or attribute does not exist, or is not an App.
    """
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")) \
            or not all(p.isidentifier() for p in attr.split(".")):
        raise AppLoadError(f"{ref!r} is not MODULE:ATTR (e.g. myproject.jobs:app)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    was = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise AppLoadError(f"no module {e.name!r} (looked in {cwd} and the installed packages)") from None
        raise
    finally:
        sys.dont_write_bytecode = was
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(f"module {module_name!r} has no {attr!r}") from None
    if not isinstance(obj, App):
        raise AppLoadError(f"{ref} is a {type(obj).__name__}, not a raftsched App")
    return obj
