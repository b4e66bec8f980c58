"""The user's own sitecustomize: watch must keep running it."""

import os

os.environ["OWN_SITECUSTOMIZE"] = "loaded"
MARKER = "own"
