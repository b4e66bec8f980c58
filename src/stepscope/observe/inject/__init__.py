"""Code that ``stepscope watch`` injects into the watched Python process.

This directory goes first on the child's PYTHONPATH, so its ``sitecustomize`` runs at start-up;
the ``stepscope_watch_*`` modules are imported by those top-level names there (distinct enough
not to shadow the user's modules) and use only the standard library plus the framework they hook.
"""
