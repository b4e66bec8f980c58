"""One recording for framework callbacks (``stepscope.keras``/``lightning``/``hf``): a
:class:`~stepscope.observe.monitor.Monitor` and the very recorder ``stepscope watch`` injects.

A callback sees the same loop events as ``watch``'s framework hooks (phase begin/end, batch
begin/end), so it uses the same code to turn them into steps and phases: the hook's
:class:`Recorder`, whose messages go straight to ``watch``'s :class:`RecordSink` in this process
instead of through a pipe. The Monitor supplies what ``watch``'s parent supplies there: the run
database's writer, the samplers (process tree, host, disks, page cache, GPUs) and the lifecycle.
So a run recorded by a callback and one recorded by ``watch`` of the same script hold the same
kinds of records, split by the same rules.

Nothing here starts a signal handler; :meth:`CallbackRecording.close` stops every thread it
started (sampler, writer, residency), so a notebook cell leaves nothing running behind it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from stepscope.observe.host import env_facts
from stepscope.observe.inject.stepscope_watch_recorder import Channel, Recorder, _encode
from stepscope.observe.monitor import Monitor
from stepscope.observe.watch import RecordSink


class _SinkChannel(Channel):
    """The recorder's channel, delivering each message to the sink at once (no pipe, no
    buffering: the sink only queues records for the writer thread, a few microseconds)."""

    def __init__(self, sink: RecordSink) -> None:
        super().__init__(-1)
        self._sink = sink

    def send(self, msg: list[Any], *, urgent: bool = False) -> None:
        self._sink.handle_line(_encode(msg).encode())

    def flush(self) -> None:
        return None


class _DropChannel(Channel):
    """Where a recorder's messages go while no recording is active: nowhere."""

    def __init__(self) -> None:
        super().__init__(-1)

    def send(self, msg: list[Any], *, urgent: bool = False) -> None:
        return None

    def flush(self) -> None:
        return None


class RecorderProxy:
    """Stands for the active recording's :class:`Recorder` in the watch hooks' callback classes,
    which are built once around one recorder object. With no recording active it is a recorder
    that drops everything, so a callback outside ``fit`` (or a second one) records nothing
    rather than raising. One recording is active per process at a time, as one training loop
    runs at a time.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_null", Recorder(_DropChannel()))
        object.__setattr__(self, "_target", self._null)

    @property
    def busy(self) -> bool:
        return bool(self._target is not self._null)

    def attach(self, rec: Recorder) -> None:
        object.__setattr__(self, "_target", rec)

    def release(self, rec: Recorder) -> None:
        if self._target is rec:
            object.__setattr__(self, "_target", self._null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)


_PROXY = RecorderProxy()
# Typed as the recorder it stands for: the hooks' callback classes take a Recorder.
ACTIVE: Recorder = cast(Recorder, _PROXY)


def recording_active() -> bool:
    """True while some callback records in this process."""
    return _PROXY.busy


class CallbackRecording:
    """A run recorded from a framework's callbacks into ``out`` (``run.db``, later the report).

    Args:
        out: the run directory (created; an existing ``run.db`` is continued, as with resume).
        framework: who calls back (``keras``, ``lightning``, ``hf``), kept as the run's kind.
        name: the run's name (default: the folder's name).
        dataset_files: the dataset's files, for page-cache residency.
        interval_s: sampling period of the system samplers.
        sample: run the system samplers (off: steps and phases only).

    Examples:
        >>> recording = CallbackRecording("runs/mine", framework="lightning")
        >>> rec = recording.start()          # the recorder the hook callbacks drive
        >>> rec.cb_phase_begin("train", lambda first, last: 0)
        >>> recording.close("completed")
    """

    def __init__(self, out: str | Path, *, framework: str, name: str | None = None,
                 dataset_files: Sequence[str | Path] = (), interval_s: float = 1.0,
                 # free-form: config is the run's configuration as the caller gives it
                 sample: bool = True, config: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(out)
        self.framework = framework
        self._monitor = Monitor(
            self.run_dir, name=name, kind=f"callback:{framework}",
            dataset_files=[Path(f) for f in dataset_files], interval_s=interval_s,
            sample=sample, config={"framework": framework, **(config or {})},
        )
        self._sink: RecordSink | None = None
        self.recorder: Recorder | None = None

    @property
    def active(self) -> bool:
        return self.recorder is not None

    def start(self) -> Recorder:
        """Open the run database, start the samplers; returns the recorder to drive."""
        if self.recorder is not None:
            return self.recorder
        mon = self._monitor.start()
        assert mon.writer is not None
        for key, (value, how) in env_facts().items():
            mon.writer.fact(key, value, how)
        # Monitor samples the process tree (whose I/O counters the phases need) and the
        # dataset's residency; the sink reads both at phase boundaries, as watch's parent does.
        sink = RecordSink(mon.writer, tree=getattr(mon, "_tree", None),
                          interval_s=self._monitor._interval_s)
        sink.residency = getattr(mon, "_residency", None)
        sink.dataset_files = list(self._monitor._dataset_files)
        sink.hooked_pid = os.getpid()
        self._sink = sink
        self.recorder = Recorder(_SinkChannel(sink))
        _PROXY.attach(self.recorder)
        return self.recorder

    def note(self, text: str) -> None:
        self._monitor.note(self.framework, text)

    def close(self, status: str = "completed") -> None:
        """Close open steps and phases, write the end-of-run notes, stop every thread."""
        rec, sink = self.recorder, self._sink
        if rec is None or sink is None:
            return
        self.recorder = None
        rec.at_exit()
        for text in sink.finish(time.time()):
            if not text.startswith("no dataset files discovered"):
                self._monitor.note(self.framework, text)
        self._monitor.close(status)
        _PROXY.release(rec)
