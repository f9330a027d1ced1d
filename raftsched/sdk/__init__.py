"""The Python SDK: jobs declared in code next to their handlers, and made real by
``raftsched sync`` (docs/sdk.md).

- :class:`App` and ``@app.job(...)``: declarations, validated at import by the nodes' own
  validation (core.model.validate_job);
- :class:`Context`: what a handler is called with;
- :func:`raftsched.sdk.plan.plan`: what a sync would change (pure), and
  :mod:`raftsched.sdk.sync`: ``raftsched sync MODULE:app``.
"""
from .app import APP_LABEL, OPTIONS, App, DeclarationError, JobDeclaration
from .context import Context
from .loader import load_app

__all__ = ["APP_LABEL", "OPTIONS", "App", "Context", "DeclarationError", "JobDeclaration", "load_app"]
