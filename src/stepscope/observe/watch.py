"""``stepscope watch -- CMD``: record any training command without changing its code.

The command runs as a child in its own session (so a terminal's Ctrl-C reaches only us, and we
decide what reaches it). This process is the run's one writer: it samples the child's whole
process tree (DataLoader workers included) and writes the records the child's injected hooks
send over a pipe (see ``observe/inject/``). The child never opens the database, so a child
killed with SIGKILL loses at most the lines it had not flushed (half a second), and the run
still ends with a status and an exit code.

One side effect of the own session: where the kernel schedules by autogroup
(``/proc/sys/kernel/sched_autogroup_enabled``), a new session is its own CPU-share group, so on a
machine busy with other sessions' work the watched command can get more CPU than when started
from the same shell directly. ``bench/watch_overhead.py`` starts its bare runs the same way.

Examples:
    >>> result = watch(["python", "train.py", "--epochs", "2"], Path("runs/watched"))
    >>> result.status, result.exit_code
    ('completed', 0)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

from stepscope.errors import StepscopeError
from stepscope.observe.host import env_facts
from stepscope.observe.pagecache import DatasetResidency
from stepscope.observe.sampling import (
    Sampler,
    SamplerThread,
    create_samplers,
    phase_io_totals,
    phase_resident_frac,
)
from stepscope.observe.stages import ENV_DIR as STAGES_ENV
from stepscope.observe.stages import SEQ_FACT_PREFIX as STAGES_SEQ_PREFIX
from stepscope.observe.watch_ranks import RankHub
from stepscope.store.db import RunWriter
from stepscope.store.records import ArrivalRecord, PhaseRecord, RunInfo, Sample, StepRecord
from stepscope.store.rundir import RunDir

INJECT_DIR = Path(__file__).with_name("inject")
KERAS_STAGES_SEQ = "keras_stages.seq."  # as observe/inject/stepscope_watch_keras_steps.py
FD_VAR = "STEPSCOPE_WATCH_FD"
SOCK_VAR = "STEPSCOPE_WATCH_SOCK"
DIR_VAR = "STEPSCOPE_WATCH_DIR"
PYTHONPATH_VAR = "STEPSCOPE_WATCH_PYTHONPATH"
PHASE_HINT_VAR = "STEPSCOPE_WATCH_PHASE_HINT"  # as inject/stepscope_watch_loop.HINT_VAR
PHASE_HINTS = ("auto", "mode", "grad")
FRAMEWORKS = ("torch", "tensorflow", "jax")
DATASET_SOURCES = ("torchvision DatasetFolder/ImageFolder datasets, Keras ImageDataGenerator "
                   "iterators and file paths in a tf.data pipeline")  # where the hooks look
NO_STEPS_NOTE = (
    "no training steps seen: step-level timing (data wait / transfer / compute) needs a PyTorch "
    "DataLoader loop, Keras fit/evaluate/predict, a Lightning Trainer, or the stepscope.Monitor "
    "API in the script; this run has the system-level picture only"
)
NO_HOOKS_NOTE = (
    " (no Python process of the command loaded stepscope's hooks: it is not Python, or it "
    "ignores PYTHONPATH, e.g. `python -I` or `-E`)"
)
# How long to wait for the pipe's last lines after the child exits: a forked worker that
# outlives it holds the write end open until the process group is cleaned up.
DRAIN_TIMEOUT_S = 2.0
TERM_GRACE_S = 1.0


@dataclass
class WatchResult:
    """How the watched command ended: its exit code (128 + N when killed by signal N), the run's
    status (``completed``/``failed``/``interrupted``), where it was recorded, and the notes
    ``watch`` itself wrote (things the explanation should say)."""

    exit_code: int
    status: str
    run_dir: Path
    notes: list[str] = field(default_factory=list)


def child_env(base: Mapping[str, str], fd: int, *, no_preallocate: bool,
              phase_hint: str = "auto", sock: str | None = None,
              run_dir: Path | None = None) -> dict[str, str]:
    """The child's environment: our ``sitecustomize`` first on PYTHONPATH, the pipe's fd, the
    original PYTHONPATH (JSON, ``null`` when unset) for the child to restore for its own children,
    the phase hint (``--phase-hint``) when not ``auto``, and the socket the command's training
    ranks connect to (``watch_ranks``): with it, the command's descendants keep our PYTHONPATH so
    that a launcher's workers load the hooks too.
    """
    env = dict(base)
    if phase_hint != "auto":
        env[PHASE_HINT_VAR] = phase_hint
    original = base.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(INJECT_DIR), *([original] if original else [])])
    env[PYTHONPATH_VAR] = json.dumps(original)
    env[FD_VAR] = str(fd)
    if sock is not None:
        env[SOCK_VAR] = sock
    if run_dir is not None:  # where a multi-node job's rank 0 puts the other nodes' stores
        env[DIR_VAR] = str(Path(run_dir).resolve())
    if no_preallocate:
        # TensorFlow maps nearly all free GPU memory at start and JAX 75 % of it; these make
        # both allocate as they go, so the memory reading shows what the model uses.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def exit_status(returncode: int, forwarded: int | None) -> tuple[str, int]:
    """``(status, exit_code)`` from ``Popen.returncode`` (negative = killed by that signal).

    A run we forwarded Ctrl-C/SIGTERM to is ``interrupted`` however it exits; one killed by a
    signal is ``interrupted`` with the shell's code 128 + N; otherwise non-zero is ``failed``.
    """
    code = 128 - returncode if returncode < 0 else returncode
    if forwarded is not None or returncode < 0:
        return "interrupted", code
    return ("completed" if returncode == 0 else "failed"), code


def choose_framework(imported: Sequence[str], keras_backend: str | None) -> str | None:
    """What holds the model's memory: Keras's backend if Keras ran, else the first imported."""
    if "keras" in imported and keras_backend in FRAMEWORKS:
        return keras_backend
    return next((name for name in imported if name in FRAMEWORKS), None)


class RecordSink:
    """Turns the child's messages (JSON arrays, see ``inject/stepscope_watch_recorder.py``) into
    store records. Phase ids continue the run database's; phase boundaries get this side's
    process-tree I/O counters and dataset residency, read when the message arrives.

    Args:
        writer: the run's writer.
        tree: the process-tree sampler (its ``io_totals``), if it could be built.
        interval_s: sampling period for the residency sampler started once files are known.
        phase_ids: hands out the store's phase ids (shared by sinks writing one store).
        residency: sample the dataset's page-cache residency (off for ranks > 0: run.db has it).
        on_identity: called with a ``W`` message (the process joined a process group).
    """

    def __init__(self, writer: RunWriter, *, tree: Any, interval_s: float,
                 phase_ids: Callable[[], int] | None = None, residency: bool = True,
                 on_identity: Callable[[list[Any]], None] | None = None,
                 on_child_exit: Callable[[int, int], None] | None = None) -> None:
        self._writer = writer
        self._tree = tree
        self._interval_s = interval_s
        self._phase_ids = phase_ids or _counter(writer.next_phase_id)
        self._ids: dict[int, int] = {}
        self._residency_on = residency
        self._on_identity = on_identity
        self._on_child_exit = on_child_exit
        self._lock = threading.Lock()
        self.phases: dict[int, PhaseRecord] = {}
        self.steps = 0
        self.imported: list[str] = []
        self.keras_backend: str | None = None
        self.hooked_pid: int | None = None
        self.dataset_files: list[Path] = []
        self.residency: DatasetResidency | None = None
        self._residency_thread: SamplerThread | None = None
        self.bad_lines = 0
        self.said_bye = False
        self._handlers: dict[str, Callable[[list[Any]], None]] = {
            "P": self._phase_begin, "E": self._phase_end, "S": self._step, "F": self._fact,
            "N": self._note, "M": self._sample, "I": self._imported, "K": self._keras,
            "D": self._dataset, "R": self._device, "H": self._hello, "W": self._identity,
            "A": self._arrival, "B": self._bye, "Q": self._flush, "X": self._child_exit,
        }

    def handle_line(self, line: bytes) -> None:
        """Decode one line and record it; a garbled line is counted, never raised."""
        try:
            msg = json.loads(line)
            handler = self._handlers[msg[0]]
        except (ValueError, KeyError, IndexError, TypeError):
            self.bad_lines += 1
            return
        with self._lock:
            try:
                handler(msg)
            except (ValueError, TypeError, IndexError, KeyError):
                self.bad_lines += 1

    # -- messages -------------------------------------------------------------------------------
    def _phase_begin(self, m: list[Any]) -> None:
        _, seq, epoch, phase, t, workers = m
        rb, rc = phase_io_totals(self._tree)
        resident = phase_resident_frac(self.residency)
        phase_id = self._ids[int(seq)] = self._phase_ids()
        rec = PhaseRecord(
            phase_id=phase_id, epoch=int(epoch), phase=str(phase),
            started=float(t), resident_frac_start=resident, read_bytes_start=rb,
            rchar_start=rc, workers=workers,
        )
        self.phases[int(seq)] = rec
        self._writer.put_phase(rec)

    def _phase_end(self, m: list[Any]) -> None:
        _, seq, t, steps, images = m
        rec = self.phases.get(int(seq))
        if rec is None or rec.ended is not None:
            return
        rec.ended, rec.steps, rec.images = float(t), int(steps), int(images)
        rec.read_bytes_end, rec.rchar_end = phase_io_totals(self._tree)
        rec.resident_frac_end = phase_resident_frac(self.residency)
        self._writer.put_phase(rec)

    def _step(self, m: list[Any]) -> None:
        _, seq, step, t_start, wall, wait, transfer, compute, other, images, warmup, *comm = m
        self.steps += 1
        self._writer.add_step(StepRecord(
            phase_id=self._ids[int(seq)], step=int(step), t_start=float(t_start),
            wall_s=float(wall), data_wait_s=float(wait), transfer_s=float(transfer),
            compute_s=float(compute), other_s=float(other), images=int(images),
            warmup=bool(warmup), comm_s=float(comm[0]) if comm else 0.0,
        ))

    def _arrival(self, m: list[Any]) -> None:
        _, seq, t_arrive, wait, comm, buckets = m
        self._writer.add_arrival(ArrivalRecord(seq=int(seq), t_arrive=float(t_arrive),
                                               wait_s=float(wait), comm_s=float(comm),
                                               buckets=int(buckets)))

    def _identity(self, m: list[Any]) -> None:
        if self._on_identity is not None and len(m) >= 7:
            self._on_identity(m)

    def _child_exit(self, m: list[Any]) -> None:
        if self._on_child_exit is not None:
            self._on_child_exit(int(m[1]), exit_status(int(m[2]), None)[1])

    def _flush(self, m: list[Any]) -> None:
        self._writer.flush()  # the pipe has no way back: commit, the child reads what is there

    def _bye(self, m: list[Any]) -> None:
        self.said_bye = True

    def _fact(self, m: list[Any]) -> None:
        key = str(m[1])
        if key.startswith(STAGES_SEQ_PREFIX):  # the child numbers phases; the store has ids
            key = f"stages.phase.{self._ids[int(key[len(STAGES_SEQ_PREFIX):])]}"
        elif key.startswith(KERAS_STAGES_SEQ):
            phase_id = self._ids.get(int(key[len(KERAS_STAGES_SEQ):]))
            if phase_id is None:  # a phase this sink never saw begin
                return
            key = f"keras_stages.phase.{phase_id}"
        self._writer.fact(key, m[2], str(m[3]))

    def _note(self, m: list[Any]) -> None:
        self._writer.note(str(m[1]), str(m[2]))

    def _sample(self, m: list[Any]) -> None:
        self._writer.add_samples([Sample(float(m[1]), str(m[2]), str(m[3]), float(m[4]))])

    def _imported(self, m: list[Any]) -> None:
        if m[1] not in self.imported:
            self.imported.append(str(m[1]))

    def _keras(self, m: list[Any]) -> None:
        self.keras_backend = None if m[1] is None else str(m[1])

    def _device(self, m: list[Any]) -> None:
        self._writer.update_run(device=str(m[1]))

    def _hello(self, m: list[Any]) -> None:
        self.hooked_pid = int(m[1])

    def _dataset(self, m: list[Any]) -> None:
        known = {str(p) for p in self.dataset_files}
        new = [Path(p) for p in m[1] if isinstance(p, str) and p not in known]
        self.dataset_files += new
        if new and self._residency_on:
            self._start_residency()

    # -- dataset residency ------------------------------------------------------------------------
    def _start_residency(self) -> None:
        """(Re)start the residency sampler over every file known so far, and say what it covers."""
        if self._residency_thread is not None:
            self._residency_thread.stop()
        files = self.dataset_files
        self.residency = DatasetResidency(files)
        sizes = sum(_size(p) for p in files)
        how = f"files of the datasets the watched script iterated ({DATASET_SOURCES})"
        self._writer.fact("dataset.files", len(files), how)
        self._writer.fact("dataset.bytes", sizes, "sum of those files' sizes (os.stat)")
        self._writer.fact("dataset.residency_sample_files", len(self.residency.sample_files),
                          "files whose page-cache residency is measured (all, or a random sample)")
        self._residency_thread = SamplerThread([self.residency], self._writer, self._interval_s)
        self._residency_thread.start()

    def finish(self, t_end: float) -> list[str]:
        """Close phases the child left open, stop residency, write facts; return notes written."""
        with self._lock:
            for rec in self.phases.values():
                if rec.ended is None:
                    rec.ended = t_end
                    rec.read_bytes_end, rec.rchar_end = phase_io_totals(self._tree)
                    rec.resident_frac_end = phase_resident_frac(self.residency)
                    self._writer.put_phase(rec)
            if self._residency_thread is not None:
                self._residency_thread.stop()
            notes: list[str] = []
            framework = choose_framework(self.imported, self.keras_backend)
            if framework is not None:
                self._writer.fact("mem.framework", framework,
                                  "watch: the framework the command imported (Keras: its backend)")
            if not self.dataset_files:
                notes.append(f"no dataset files discovered (watch finds them in "
                             f"{DATASET_SOURCES}): page-cache residency of the dataset not sampled")
            if self.steps == 0:
                notes.append(NO_STEPS_NOTE + ("" if self.hooked_pid else NO_HOOKS_NOTE))
            if self.bad_lines:
                notes.append(f"{self.bad_lines} unreadable lines from the watched process skipped")
            return notes


def _counter(start: int) -> Callable[[], int]:
    lock = threading.Lock()
    box = [start]

    def next_id() -> int:
        with lock:
            box[0] += 1
            return box[0] - 1

    return next_id


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_messages(stream: BinaryIO, sink: RecordSink) -> None:
    """Feed every line of ``stream`` to ``sink`` until EOF (every writer of the pipe exited)."""
    with stream:
        for line in stream:
            if line.strip():
                sink.handle_line(line)


class _SignalForwarder:
    """While active, SIGINT goes to the child's process group (as a terminal's Ctrl-C would) and
    SIGTERM to the child; a third SIGINT kills the group. Handlers exist only on the main thread.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.forwarded: int | None = None
        self._interrupts = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.forwarded = signum
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if signum == signal.SIGINT:
                self._interrupts += 1
                sig = signal.SIGKILL if self._interrupts >= 3 else signal.SIGINT
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, signum)

    def __enter__(self) -> _SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def kill_group(pgid: int, grace_s: float = TERM_GRACE_S) -> bool:
    """SIGTERM what is left of the child's process group, SIGKILL it after ``grace_s``.
    True if anything was left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    return True


def _resolve(cmd: Sequence[str]) -> list[str]:
    if not cmd:
        raise StepscopeError("watch needs a command: `stepscope watch -- python train.py`")
    if shutil.which(cmd[0]) is None:
        raise StepscopeError(
            f"command not found: {cmd[0]!r}; expected an executable on PATH or a path to one "
            "(e.g. `stepscope watch -- python train.py`)"
        )
    return list(cmd)


@contextlib.contextmanager
def _samplers(writer: RunWriter, pid: int, interval_s: float) -> Iterator[list[Sampler]]:
    # create_samplers notes the absence of dataset files up front; watch may still discover
    # them, so that note waits for the end.
    def note(source: str, text: str) -> None:
        if not (source == "pagecache" and "no dataset files" in text):
            writer.note(source, text)

    samplers = create_samplers(root_pid=pid, note=note)
    for s in samplers:
        for key, (value, how) in getattr(s, "identities", dict)().items():
            writer.fact(key, value, how)
    thread = SamplerThread(samplers, writer, interval_s=interval_s)
    thread.start()
    try:
        yield samplers
    finally:
        thread.stop()
        for s in samplers:
            close = getattr(s, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()


def _start_facts(writer: RunWriter, no_preallocate: bool) -> list[str]:
    for key, (value, how) in env_facts().items():
        writer.fact(key, value, how)
    if not no_preallocate:
        return []
    writer.fact("watch.no_preallocate", True,
                "watch set TF_FORCE_GPU_ALLOW_GROWTH=true and XLA_PYTHON_CLIENT_PREALLOCATE=false")
    return ["watch set TF_FORCE_GPU_ALLOW_GROWTH=true and XLA_PYTHON_CLIENT_PREALLOCATE=false "
            "for the command: TensorFlow and JAX allocate GPU memory as needed instead of "
            "preallocating most of the card"]


def watch(
    cmd: list[str],
    run_dir: Path,
    *,
    interval_s: float = 1.0,
    no_preallocate: bool = False,
    phase_hint: str = "auto",
    on_start: Callable[[int], None] | None = None,
) -> WatchResult:
    """Run ``cmd`` as a child and record it into ``run_dir/run.db`` like ``stepscope train``.

    Args:
        cmd: the command and its arguments (``["python", "train.py"]``).
        run_dir: the run directory (created).
        interval_s: sampling period of the system samplers.
        no_preallocate: stop TensorFlow/JAX from preallocating GPU memory in the child.
        phase_hint: ``auto`` (a step with an optimizer step or backward is training), ``mode``
            (``model.train()/eval()``) or ``grad`` (``no_grad`` is validation).
        on_start: called with the child's PID once it runs.

    Returns:
        The child's exit code and the run's status; the run row has ``kind="watch"``.

    Raises:
        StepscopeError: no command, the command is not found, or an unknown phase hint.
    """
    argv = _resolve(cmd)
    if phase_hint not in PHASE_HINTS:
        raise StepscopeError(f"unknown --phase-hint {phase_hint!r}; expected one of "
                             f"{', '.join(PHASE_HINTS)}")
    run_dir = Path(run_dir)
    interval_s = min(max(interval_s, 0.1), 60.0)  # as Monitor: 10 Hz at most
    info = RunInfo(name=run_dir.name, command=shlex.join(argv), kind="watch",
                   config={"interval_s": interval_s, "no_preallocate": no_preallocate,
                           "phase_hint": phase_hint})
    writer = RunWriter(run_dir, info)
    notes = _start_facts(writer, no_preallocate)
    cpu0 = time.process_time()
    phase_ids = _counter(writer.next_phase_id)  # run.db's phases: the command's and rank 0's

    def make_sink(w: RunWriter, tree: Any, primary: bool) -> RecordSink:
        # A rank reports the exit status of the children it reaps (Lightning's rank 0).
        return RecordSink(w, tree=tree, interval_s=interval_s,
                          phase_ids=phase_ids if primary else None, residency=primary,
                          on_child_exit=lambda pid, code: hub.set_exit(pid, code))

    hub = RankHub(run_dir, writer, make_sink, info, interval_s)
    read_fd, write_fd = os.pipe()
    # The child's loaders (and their workers, forked or spawned) keep stage counters here.
    stages_dir = RunDir(run_dir).stages / "watch"
    with contextlib.suppress(OSError):
        stages_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(os.environ, write_fd, no_preallocate=no_preallocate, phase_hint=phase_hint,
                    sock=hub.path, run_dir=run_dir)
    env[STAGES_ENV] = str(stages_dir)
    try:
        proc = subprocess.Popen(
            argv, env=env,
            pass_fds=(write_fd,), start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        hub.finish(time.time(), 0.0)
        writer.note("watch", f"could not start the command: {exc}")
        writer.close("failed", 127)
        raise StepscopeError(f"could not start {argv[0]!r}: {exc}") from exc
    finally:
        os.close(write_fd)  # only the child (and its forks) may hold the write end
    status, code = "interrupted", 1
    try:
        status, code, more = _supervise(proc, writer, read_fd, interval_s, on_start, hub,
                                        phase_ids)
        notes += more
    finally:
        kill_group(proc.pid)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            proc.kill()
        failed_code, rank_notes = hub.finish(time.time(), DRAIN_TIMEOUT_S)
        notes += rank_notes
        if failed_code is not None and failed_code != 0:
            # The job failed because a rank did: exit with that rank's status, as a single
            # process that failed so would have.
            status, code = ("failed" if status == "completed" else status), failed_code
        writer.fact("monitor.cpu_s", time.process_time() - cpu0,
                    "CPU time of the stepscope watch process (samplers, pipe reader, writer)")
        for text in notes:
            writer.note("watch", text)
        writer.close(status, code)
        shutil.rmtree(stages_dir.parent, ignore_errors=True)
    return WatchResult(exit_code=code, status=status, run_dir=run_dir, notes=notes)


def _supervise(
    proc: subprocess.Popen[bytes], writer: RunWriter, read_fd: int, interval_s: float,
    on_start: Callable[[int], None] | None, hub: RankHub, phase_ids: Callable[[], int],
) -> tuple[str, int, list[str]]:
    """Sample and read the child until it exits; returns ``(status, exit_code, notes)``."""
    notes: list[str] = []
    with _SignalForwarder(proc.pid) as forwarder, \
            _samplers(writer, proc.pid, interval_s) as samplers:
        tree = next((s for s in samplers if s.name == "tree"), None)
        sink = RecordSink(writer, tree=tree, interval_s=interval_s, phase_ids=phase_ids,
                          on_identity=lambda m: hub.claim_primary(m, sink),
                          on_child_exit=hub.set_exit)
        hub.start()
        reader = threading.Thread(target=read_messages, args=(os.fdopen(read_fd, "rb"), sink),
                                  name="stepscope-watch-pipe", daemon=True)
        reader.start()
        if on_start is not None:
            on_start(proc.pid)
        returncode = proc.wait()
        t_end = time.time()
        hub.set_exit(proc.pid, exit_status(returncode, None)[1])
        if returncode == 0:  # a failed command ends its job (its ranks may hang in a collective)
            notes += hub.wait_ranks()
        reader.join(DRAIN_TIMEOUT_S)
        if reader.is_alive():  # a leftover process holds the pipe: end it, then drain
            kill_group(proc.pid)
            reader.join(DRAIN_TIMEOUT_S)
        notes += _launcher_notes(sink.finish(t_end), hub)
    status, code = exit_status(returncode, forwarder.forwarded)
    if returncode < 0:
        name = _signal_name(-returncode)
        notes.append(f"the command was killed by {name} (exit code {code}); what it recorded "
                     "until then is kept")
    elif forwarder.forwarded is not None:
        notes.append(f"watch forwarded {_signal_name(forwarder.forwarded)} to the "
                     f"command, which exited with code {code}")
    return status, code, notes


def _launcher_notes(notes: list[str], hub: RankHub) -> list[str]:
    """A launcher (torchrun) records no steps and opens no dataset: its ranks did, say nothing."""
    if not hub.ranks or any(not r.owns_sink for r in hub.ranks.values()):
        return notes
    return [n for n in notes if not n.startswith((NO_STEPS_NOTE, "no dataset files"))]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
