"""The Keras memory facts a watched process sends: its RSS at named moments (the framework's
import, ``fit``'s start, the first training step), JAX's start at first use, the weights and
optimizer state read from the model's variables, and what the framework's allocator says it
holds. The ledger (``stepscope.analysis.memory``) names the growth between the moments.

Standard library only at import: this runs inside the user's interpreter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder


def rss_bytes() -> int | None:
    """This process's resident set size (``/proc/self/statm``; Linux)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def runtime_baseline(rec: Recorder, what: str) -> None:
    """The framework's baseline: this process's RSS right after ``what`` was imported."""
    rss = rss_bytes()
    if rss is not None:
        rec.runtime_baseline(rss, f"watch: process RSS right after importing {what} "
                                  "(interpreter + libraries)")


def mark_rss(rec: Recorder, moment: str) -> None:
    """The process's RSS at ``moment`` (``fit``: a fit or a hand-written loop begins;
    ``first_step``: its first training step is done), once each."""
    if moment in rec.rss_marks:
        return
    rss = rss_bytes()
    if rss is not None:
        rec.rss_marks[moment] = rss


def refit_growth(rec: Recorder) -> None:
    """A later fit's first training step is done: its RSS growth since the fit began (a train
    function traced and compiled again, for more trainable weights) is added to fact
    ``mem.refit_step_bytes``."""
    start = rec.rss_marks.pop("refit", None)
    rss = rss_bytes()
    if start is None or rss is None:
        return
    total = rec.rss_marks["refit_total"] = rec.rss_marks.get("refit_total", 0) + max(0, rss - start)
    rec.fact("mem.refit_step_bytes", total,
             "watch: RSS growth over each later fit()'s start and first training step (its train "
             "function compiled again: compile() dropped it), summed")


def cache_fact(rec: Recorder, phase: str, held: int) -> None:
    """A ``tf.data`` ``.cache()`` in memory, filled by the first ``phase`` pass: ``held`` bytes
    (the images that pass took, each as the cache holds it), facts ``mem.tf_data_cache_bytes``
    (training's and validation's caches summed)."""
    total = rec.rss_marks["tf_data_cache"] = rec.rss_marks.get("tf_data_cache", 0) + held
    rec.fact("mem.tf_data_cache_bytes", total,
             f"watch: the images the first {phase} pass put in the pipeline's in-memory "
             ".cache() × each one's bytes there (the cache's element spec)"
             + (", training's and validation's summed" if total != held else ""))


def mark_jax_start(rec: Recorder) -> None:
    """JAX starts its runtime at first use, not at ``import jax``: its client and devices at
    the first array, an MLIR context at the first lowering, XLA's compiler at the first
    compile (~5, ~14 and ~12 MB of this CPU's RSS; a CUDA context on a GPU). With Keras they
    come with the model's first weight, after the baseline. Their RSS growth is fact
    ``mem.jax_start_bytes``, taken out of the model objects' growth. Each hook wraps one
    function of JAX's and puts it back at its first call (later calls are the model's; a
    second compile still grew ~16 MB here, and stays in the model objects)."""
    try:
        from jax._src import compiler, xla_bridge
        from jax._src.interpreters import mlir
    except ImportError:  # another JAX layout: the start stays in the model objects' growth
        return
    if getattr(xla_bridge, "_backends", None):  # started before Keras: in the baseline
        return
    inside = [False]  # one of these started inside another: counted in the outer one
    compile_ = getattr(compiler, "backend_compile_and_load", None)
    if compile_ is not None:
        compiler.backend_compile_and_load = _compiles_before_fit(compile_, rec, inside)
    for module, name in ((xla_bridge, "backends"), (mlir, "make_ir_context"),
                         (compiler, "backend_compile_and_load")):
        inner = getattr(module, name, None)
        if inner is not None:
            setattr(module, name, _first_call_growth(module, name, inner, rec, inside))


def _compiles_before_fit(inner: Callable[..., Any], rec: Recorder,
                         inside: list[bool]) -> Callable[..., Any]:
    """``backend_compile_and_load``, with the RSS growth of each compile after JAX's start
    and before ``fit()`` summed (``mem.jax_compiles_bytes``): Keras builds a model and its
    optimizer with eager JAX ops, and JAX compiles each op's XLA program at its first call;
    the programs and the compiler's memory stay in RSS (6 compiles, ~40 MB, for a 305-weight
    Dense net on this CPU, which the model's objects had held).
    From ``fit()`` on, compiles are the step's (``mem.first_step_bytes``); one compile costs
    milliseconds, two RSS reads a few microseconds."""
    def compile_and_load(*args: Any, **kwargs: Any) -> Any:
        marks = rec.rss_marks
        if inside[0] or "fit" in marks:
            return inner(*args, **kwargs)
        before = rss_bytes()
        try:
            return inner(*args, **kwargs)
        finally:
            after = rss_bytes()
            if before is not None and after is not None and "fit" not in marks:
                marks["jax_compiles"] = marks.get("jax_compiles", 0) + max(0, after - before)
                marks["jax_compiles_n"] = marks.get("jax_compiles_n", 0) + 1
    return compile_and_load


def _first_call_growth(module: ModuleType, name: str, inner: Callable[..., Any],
                       rec: Recorder, inside: list[bool]) -> Callable[..., Any]:
    def first(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, inner)  # JAX calls it through the module's globals
        if inside[0]:
            return inner(*args, **kwargs)
        inside[0] = True
        before = rss_bytes()
        try:
            return inner(*args, **kwargs)
        finally:
            inside[0] = False
            after = rss_bytes()
            if before is not None and after is not None:
                grown = rec.rss_marks["jax_start"] = \
                    rec.rss_marks.get("jax_start", 0) + max(0, after - before)
                rec.fact("mem.jax_start_bytes", grown,
                         "watch: RSS growth while JAX started at first use: its client and "
                         "devices (jax._src.xla_bridge.backends), its MLIR context, its first "
                         "XLA compile")
    return first


def memory_growth_facts(rec: Recorder, weights: int, optimizer: int) -> None:
    """Name the RSS growth from the import to fit() and over the first training step."""
    marks = rec.rss_marks
    if "import" in marks and "fit" in marks:
        started = marks.get("jax_start", 0)  # named on its own (mark_jax_start)
        compiled = marks.get("jax_compiles", 0)
        if compiled:
            rec.fact("mem.jax_compiles_bytes", compiled,
                     f"watch: RSS growth over the {marks.get('jax_compiles_n', 0)} XLA compiles "
                     "JAX ran after its start and before fit() (jax._src.compiler."
                     "backend_compile_and_load): Keras builds the model and its optimizer with "
                     "eager ops, each compiled at its first call; the programs and the "
                     "compiler's own memory stay in RSS")
        rec.fact("mem.model_objects_bytes",
                 max(0, marks["fit"] - marks["import"] - weights - started - compiled),
                 "watch: RSS growth from the framework import to the first fit() (or a "
                 "hand-written loop's first batch), minus the weights"
                 + (" and JAX's start (named apart)" if started else "")
                 + (" and compiles (named apart)" if compiled else "")
                 + " (layer objects, graphs, the data pipeline's setup)")
    if "fit" in marks and "first_step" in marks:
        rec.fact("mem.first_step_bytes", max(0, marks["first_step"] - marks["fit"] - optimizer),
                 "watch: RSS growth over fit()'s start (a loop's) and first training step, minus the "
                 "optimizer state (traced/compiled train function, activations, allocator "
                 "arenas, prefetched batches)")


def _variables_bytes(variables: Any) -> int:
    return sum(count_of(v) * _itemsize(v.dtype) for v in variables)


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a variable's dtype, whichever framework made it. Keras 3 variables
    (every backend) carry a string ("float32"); tf-keras variables are ``tf.Variable``s, whose
    ``tf.DType`` NumPy does not understand (``str`` gives "<dtype: 'float32'>") but whose
    ``size`` is the element's bytes; NumPy and torch dtypes have ``itemsize``."""
    for attr in ("itemsize", "size"):
        size = getattr(dtype, attr, None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    name = str(getattr(dtype, "name", None) or dtype)
    import numpy as np  # Keras depends on NumPy

    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        # bfloat16 and float8 names NumPy knows only once ml_dtypes registered them: the
        # name's bit width is the element's (one byte at least: 4-bit types are stored so).
        bits = re.search(r"(\d+)", name)
        if bits is None:
            raise
        return max(1, int(bits.group(1)) // 8)


def count_of(v: Any) -> int:
    """Elements in a variable (the product of its shape)."""
    count = 1
    for dim in v.shape:
        count *= int(dim)
    return count


PRECISION = {"bfloat16": "bf16", "float16": "fp16"}  # a Keras compute dtype, as train.precision


def ledger_facts(model: Any, rec: Recorder, optimizer: Any = None) -> None:
    """Weights and optimizer state after the first training phase (the optimizer exists now):
    ``model.optimizer``, or ``optimizer`` (a hand-written loop's, never attached to the model)."""
    w_bytes = o_bytes = 0
    try:
        weights = list(model.weights)
        trainable = list(model.trainable_weights)
        w_bytes = _variables_bytes(weights)
        rec.fact("mem.weights_bytes", w_bytes, "watch: Keras model.weights")
        rec.fact("model.params", sum(count_of(v) for v in weights), "watch: Keras model.weights")
        rec.fact("model.trainable_params", sum(count_of(v) for v in trainable),
                 "watch: Keras model.trainable_weights")
        compute = str(getattr(getattr(model, "dtype_policy", None), "compute_dtype", ""))
        if compute:  # mixed_bfloat16 computes in bfloat16, mixed_float16 in float16
            rec.fact("train.precision", PRECISION.get(compute, "fp32"),
                     "watch: Keras model.dtype_policy.compute_dtype")
        optimizer = getattr(model, "optimizer", None) or optimizer
        if optimizer is not None:
            variables = optimizer.variables
            # tf-keras's legacy optimizers (tf.keras.optimizers.legacy.*) have variables()
            o_bytes = _variables_bytes(variables() if callable(variables) else variables)
            rec.fact("mem.optimizer_bytes", o_bytes,
                     "watch: Keras optimizer.variables after the first training phase")
    except Exception as exc:  # facts are a nicety; never break the fit
        rec.note("watch", f"Keras memory facts not read: {type(exc).__name__}: {exc}")
    memory_growth_facts(rec, w_bytes, o_bytes)
    _runtime_memory(rec)


def _runtime_memory(rec: Recorder) -> None:
    """What the framework's allocator says it holds (TensorFlow and JAX, where a device has it)."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            info = tf.config.experimental.get_memory_info("CPU:0")
            rec.fact("mem.tf_allocator_peak_bytes", int(info["peak"]),
                     "watch: tf.config.experimental.get_memory_info('CPU:0')['peak']")
        except Exception:  # not every build tracks the CPU allocator
            pass
        try:
            # On a GPU the BFC pool is preallocated: its peak is what the tensors really used.
            if tf.config.list_physical_devices("GPU"):
                info = tf.config.experimental.get_memory_info("GPU:0")
                rec.fact("mem.tf_gpu_peak_bytes", int(info["peak"]),
                         "watch: tf.config.experimental.get_memory_info('GPU:0')['peak']")
        except Exception:
            pass
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            stats = jax.local_devices()[0].memory_stats() or {}  # None on a CPU
            if "peak_bytes_in_use" in stats:
                rec.fact("mem.jax_peak_bytes", int(stats["peak_bytes_in_use"]),
                         "watch: jax.local_devices()[0].memory_stats()['peak_bytes_in_use']")
        except Exception:
            pass
