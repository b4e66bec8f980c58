"""Loaded by ``site`` at start-up of the Python under ``stepscope watch`` (this directory is put
first on its PYTHONPATH). It installs post-import hooks for PyTorch, Keras and Lightning, then
runs the ``sitecustomize`` this one shadows, if any (on the user's PYTHONPATH or in
site-packages), so the user's start-up customisation keeps working.

Only the first Python process of the watched command takes the pipe (it removes the fd's
variable from its environment). The processes it starts keep this directory on PYTHONPATH and
the parent's socket path: a launcher's workers (torchrun, ``accelerate launch``, Lightning DDP)
load the same hooks, hold their lines, and speak to the parent over the socket only once they
join a torch.distributed process group (``stepscope_watch_dist``); every other descendant
(spawned DataLoader workers, tools) stays silent. Nothing here may raise into the user's
program: a hook that fails is a note in the run.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
FD_VAR = "STEPSCOPE_WATCH_FD"
SOCK_VAR = "STEPSCOPE_WATCH_SOCK"
PYTHONPATH_VAR = "STEPSCOPE_WATCH_PYTHONPATH"


def _restore_environment() -> str | None:
    """Drop the pipe's variable; without a socket to follow ranks, drop every watch variable
    and our directory too, so the command's children run exactly as unwatched."""
    fd = os.environ.pop(FD_VAR, None)
    if os.environ.get(SOCK_VAR):
        return fd
    original = os.environ.pop(PYTHONPATH_VAR, None)
    if original is not None:
        value = json.loads(original)
        if value is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = value
    return fd


def _install(fd_text: str | None) -> None:
    # Imported now, while this directory is still on sys.path (it leaves it below).
    import stepscope_watch_dist
    import stepscope_watch_exit
    import stepscope_watch_hf
    import stepscope_watch_imports as imports
    import stepscope_watch_keras
    import stepscope_watch_keras_backends
    import stepscope_watch_keras_clock as keras_clock
    import stepscope_watch_keras_data as keras_data
    import stepscope_watch_keras_steps as keras_steps
    import stepscope_watch_lightning
    import stepscope_watch_loop
    import stepscope_watch_recorder as recorder
    import stepscope_watch_stage_hooks as stage_hooks
    import stepscope_watch_stages as stages
    import stepscope_watch_tf_loop as tf_loop
    import stepscope_watch_torch

    fd = -1 if fd_text is None else int(fd_text)
    if fd >= 0:
        # Exec'd children must not hold the pipe open (the parent reads until every writer
        # exits); forked ones still inherit it, and the channel keeps them from writing.
        os.set_inheritable(fd, False)
    rec = recorder.create_recorder(fd)
    rec.stages = stages.WatchPhases()
    stepscope_watch_exit.install(rec.fact)
    # The cores this process may use (a `taskset`/cpuset on the command narrows them), measured
    # here: the watching parent's own affinity may be wider.
    rec.fact("env.cpu_count", len(os.sched_getaffinity(0)),
             "os.sched_getaffinity(0) of the watched process")

    def on_error(name: str, exc: BaseException) -> None:
        rec.note("watch", f"hooks for {name} not installed: {type(exc).__name__}: {exc}")

    imports_done: dict[str, float] = {}

    def imported(name: str) -> None:
        rec.send(["I", name], urgent=True)
        # when the import finished: the time before the first phase is split at it
        imports_done.setdefault(name, rec.unix(rec.clock()))
        rec.fact("run.imports_done", imports_done, "watch: Unix time each framework's import "
                 "finished in the watched process (its import hook)")

    loops: list[object] = []

    def torch_hook(module: object) -> None:
        imported("torch")
        loops.append(stepscope_watch_torch.install(module, rec, recorder.count_images,
                                                   stepscope_watch_loop))
        stage_hooks.install_torch(module)
        stepscope_watch_dist.install(module, rec)

    def accelerate_hook(module: object) -> None:
        if loops:  # accelerate.data_loader imports torch first
            stepscope_watch_torch.install_accelerate(module, loops[0])

    def keras_ledger() -> tuple[object, object]:
        """A hand-written loop's memory ledger, read as fit's is (once per process)."""
        def ledger(model: object, optimizer: object) -> None:
            if rec.once("ledger"):
                stepscope_watch_keras.ledger_facts(model, rec, optimizer)
        return ledger, lambda moment: stepscope_watch_keras.mark_rss(rec, moment)

    def keras_hook(module: object) -> None:
        imported("keras")
        stepscope_watch_keras.install(module, rec, recorder.count_images)
        tf_loop.install_keras(module.Model, [module.optimizers.Optimizer],  # type: ignore[attr-defined]
                              *keras_ledger())

    def tf_keras_hook(module: object) -> None:
        imported("keras")
        stepscope_watch_keras.install_tf_keras(module, rec, recorder.count_images)
        tf_loop.install_keras(module.Model, [module.optimizers.Optimizer,  # type: ignore[attr-defined]
                                             module.optimizers.legacy.Optimizer],  # type: ignore[attr-defined]
                              *keras_ledger())

    def keras_image_hook(module: object) -> None:
        stepscope_watch_keras.install_image_stages(module, rec, recorder.count_images)

    def python_gil_fact(t: float) -> None:
        found = keras_clock.python_gil()
        if found is not None:
            rec.fact("loop.python_gil", found,
                     "watch: a probe thread's wake-ups while TensorFlow ran a Python op "
                     "(numpy_function, py_function, from_generator), and how many found the GIL "
                     "held (late by 1 ms or more, run-queue time taken out), in all and by the "
                     "phase kind open then")

    def tensorflow_hook(module: object) -> None:
        imported("tensorflow")
        stepscope_watch_keras_backends.install_tensorflow()
        rec.at_exit_hooks.append(python_gil_fact)
        keras_clock.gil_phase_source(  # the newest open phase: validation nests in training
            lambda: rec.open_phases[-1].phase if rec.open_phases else None)
        # a hand-written loop over tf.data (no fit): steps from what it does
        tf_loop.install(module, rec, recorder.count_images, stepscope_watch_loop,
                        keras_data.input_files, lambda ds: keras_data.classify(ds, {})["workers"],
                        lambda ds, phase: keras_data.describe_input(
                            ds, {}, rec, "TensorFlow", phase,
                            f"watch: the {phase} dataset a hand-written loop iterated"),
                        keras_steps.gil_clocks(rec.clock),
                        keras_clock.process_clock(module, rec.clock))

    def lightning_hook(module: object) -> None:
        stepscope_watch_lightning.install(module, rec, recorder.count_images)
        # Lightning's own import (~280 MB RSS over torch's) is framework, not model memory.
        stepscope_watch_torch.runtime_baseline(
            rec, getattr(module, "__name__", "lightning.pytorch"), "torch, ")

    hooks = {
        "torch": torch_hook,
        "keras": keras_hook,
        "tf_keras": tf_keras_hook,
        # ImageDataGenerator's stages (Keras 3 keeps it as legacy; tf-keras has its own).
        "keras.src.legacy.preprocessing.image": keras_image_hook,
        "tf_keras.src.preprocessing.image": keras_image_hook,
        "lightning.pytorch": lightning_hook,
        "pytorch_lightning": lightning_hook,
        "accelerate.data_loader": accelerate_hook,
        "transformers.trainer": lambda m: stepscope_watch_hf.install_trainer(m, rec),
        "safetensors.torch": lambda m: stepscope_watch_hf.install_safetensors(m, rec),
        "subprocess": lambda m: stepscope_watch_dist.report_child_exits(m, rec),
        "tensorflow": tensorflow_hook,
        "jax": lambda m: imported("jax"),
    }
    # Loader stages inside the training process and its forked workers (torch's own hook above
    # installs them with the rest).
    hooks.update({k: v for k, v in stage_hooks.library_hooks().items() if k not in hooks})
    imports.PostImportFinder(hooks, on_error).install()


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, the one ours shadows."""
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _main() -> None:
    fd = _restore_environment()
    if fd is not None or os.environ.get(SOCK_VAR):
        try:
            _install(fd)
        except Exception as exc:  # watching must never stop the program from running
            print(f"stepscope watch: hooks not installed ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
    _chain()


_main()
