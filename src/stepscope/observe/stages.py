"""Stage timing inside the input pipeline (see ``inject/stepscope_watch_stages.py``).

The implementation lives beside the ``watch`` hooks because it must import only the standard
library there; the Monitor and the trainer use it under this name.
"""

from stepscope.observe.inject.stepscope_watch_stage_hooks import install_loaded
from stepscope.observe.inject.stepscope_watch_stages import (
    ENV_DIR,
    SEQ_FACT_PREFIX,
    STAGES,
    BatchTimer,
    LoaderProbe,
    ProcessStages,
    Stage,
    add_bytes,
    phase_stages,
    read_boards,
    set_folder,
    timed,
)

__all__ = ["ENV_DIR", "SEQ_FACT_PREFIX", "STAGES", "BatchTimer", "LoaderProbe", "ProcessStages", "Stage", "add_bytes",
           "install_loaded", "phase_stages", "read_boards", "set_folder", "timed"]
