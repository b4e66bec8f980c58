"""Exits 0 only if the user's sitecustomize ran and stepscope's hooks are installed too."""

import os
import sys

import sitecustomize

own = os.environ.get("OWN_SITECUSTOMIZE") == "loaded" and getattr(sitecustomize, "MARKER", "") == "own"
hooked = "stepscope_watch_recorder" in sys.modules
print(f"own sitecustomize: {own}, stepscope hooks: {hooked}")
sys.exit(0 if own and hooked else 5)
