"""TensorBoard export: a run's steps, phases, system series and words as event files.

People already look at their runs in TensorBoard; this puts stepscope's figures beside their loss
curves. ``write_tensorboard`` exports a stored run at once (the same summary, timeline and
answers the HTML report draws); under ``train``/``watch`` the follower in ``stepscope.tblive``
appends steps and samples as the run goes with the same writers and adds the rest at its end.

Only TensorBoard's own pure-Python pieces are used: its protobuf messages and its
``RecordWriter`` (the TFRecord framing) over a plain file. Its ``EventFileWriter`` (and so
``torch.utils.tensorboard``) opens files through ``tf.io.gfile``, which imports TensorFlow whenever
TensorFlow is installed; in a torch process that import is unsafe, so the file is opened here.

What goes where (TensorBoard groups tags by the part before the first ``/``):

- ``step_train/*``, ``step_val/*``: per step, x = the step's number within that kind of phase
  across epochs (train steps 0, 1, ...; val steps likewise): ``data_wait_ms``, ``copy_ms``,
  ``compute_ms``, ``other_ms``, ``images_per_s``. Where a long run's steps were merged into
  spans (more than the timeline keeps), a point is the span's mean per step, at its last step.
- ``phase_train/*``, ``phase_val/*``: per epoch (x = epoch): the shares of the steady-state step
  time (``data_wait_share`` ...), ``images_per_s``, physical and cached MB read, dataset
  residency at the phase's end, CPU and GPU utilisation.
- ``system/*``, ``disk/*``, ``dataset/*``, ``memory/*``: sampled series, x = whole seconds since
  the run's start (the mean of the samples in that second).
- text: ``run/summary``, ``verdicts/phases``, ``findings/all``, ``explanation/answers``.
"""

from __future__ import annotations

import html
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stepscope.analysis.contracts import Finding
from stepscope.analysis.contracts_summary import PhaseRow, Summary
from stepscope.analysis.fmt import fmt_bytes, fmt_num, fmt_pct
from stepscope.analysis.timeline import Series, Timeline
from stepscope.render.terminal import AnswerLike

MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class SeriesTag:
    """One sampled series and the TensorBoard tag it is exported under, in the tag's unit."""

    source: str
    metric: str
    tag: str
    scale: float = 1.0


# The sampled series worth a chart beside a loss curve. ``tree`` is the job's process tree
# (main process and DataLoader workers); ``host`` the whole machine.
SAMPLED_TAGS: tuple[SeriesTag, ...] = (
    SeriesTag("host", "cpu_util_pct", "system/host_cpu_util_pct"),
    SeriesTag("tree", "cpu_util_pct", "system/job_cpu_util_pct"),
    SeriesTag("tree", "read_rate_bytes_per_s", "disk/physical_read_MB_per_s", 1 / MB),
    SeriesTag("tree", "cache_read_rate_bytes_per_s", "disk/cached_read_MB_per_s", 1 / MB),
    SeriesTag("pagecache", "dataset_resident_frac", "dataset/resident_pct", 100.0),
    SeriesTag("host", "mem_used_bytes", "memory/host_used_GB", 1 / GB),
    SeriesTag("host", "mem_cached_bytes", "memory/host_page_cache_GB", 1 / GB),
    SeriesTag("tree", "rss_bytes", "memory/job_rss_GB", 1 / GB),
)
# Per GPU (``gpu0``, ``gpu1`` ...): NVML's utilisation and memory in use.
GPU_TAGS: tuple[tuple[str, str, float], ...] = (
    ("util_pct", "system/{gpu}_util_pct", 1.0),
    ("mem_used_bytes", "memory/{gpu}_used_GB", 1 / GB),
)
_STEP_PARTS = (("data_wait_s", "data_wait_ms"), ("transfer_s", "copy_ms"),
               ("compute_s", "compute_ms"), ("other_s", "other_ms"))
_ShareKey = Literal["data_wait_frac", "transfer_frac", "compute_frac", "other_frac"]
_PHASE_SHARES: tuple[tuple[_ShareKey, str], ...] = (("data_wait_frac", "data_wait_share"), ("transfer_frac", "copy_share"),
                 ("compute_frac", "compute_share"), ("other_frac", "other_share"))


_SERIAL = [0]  # event files written by this process, so two never share a name


class EventWriter:
    """Scalar and text events into one event file (TensorBoard's own writer and messages)."""

    def __init__(self, log_dir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._pb = summary_pb2
        self._event_pb = event_pb2
        # TensorBoard finds event files by this name pattern; the suffix says who wrote it.
        _SERIAL[0] += 1
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{_SERIAL[0]}.stepscope")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / name
        self._writer = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 (closed in close())
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        value_pb = self._pb.Summary.Value(tag=tag, simple_value=float(value))
        self._add(value_pb, step, wall_time)

    def text(self, tag: str, markdown: str, wall_time: float) -> None:
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.text import metadata as text_metadata

        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[markdown.encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        )
        value_pb = self._pb.Summary.Value(
            tag=tag, metadata=text_metadata.create_summary_metadata(tag, ""), tensor=tensor)
        self._add(value_pb, 0, wall_time)

    def _add(self, value_pb: Any, step: int, wall_time: float) -> None:
        self._write(self._event_pb.Event(wall_time=wall_time, step=int(step),
                                         summary=self._pb.Summary(value=[value_pb])))

    def _write(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())

    def flush(self) -> None:
        """Make what was written visible to a running ``tensorboard``."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


# -- what is written ------------------------------------------------------------------------------
def write_step(ev: EventWriter, kind: str, index: int, parts_s: Sequence[float], images: int,
               wall_s: float, t_end: float, count: int = 1) -> None:
    """One step's point (or the mean step of ``count`` merged steps) under ``step_<kind>/``.

    ``parts_s`` are the summed data wait, copy, compute and other seconds, in that order.
    """
    n = max(count, 1)
    for (_, name), value in zip(_STEP_PARTS, parts_s, strict=True):
        ev.scalar(f"step_{kind}/{name}", value / n * 1000.0, index, t_end)
    if wall_s > 0 and images:
        ev.scalar(f"step_{kind}/images_per_s", images / wall_s, index, t_end)


def _step_events(ev: EventWriter, timeline: Timeline) -> int:
    """Per-step scalars from the timeline's step spans; returns how many points were written."""
    kinds = {p.phase_id: p.phase for p in timeline.phases}
    counters: dict[str, int] = {}
    for span in timeline.step_spans:
        kind = kinds.get(span.phase_id, "train")
        step = counters.get(kind, 0) + span.count - 1
        counters[kind] = step + 1
        write_step(ev, kind, step, (span.data_wait_s, span.transfer_s, span.compute_s,
                                    span.other_s), span.images, span.t_end - span.t_start,
                   span.t_end, span.count)
    return len(timeline.step_spans)


def write_phases(ev: EventWriter, phases: Iterable[PhaseRow]) -> None:
    for p in phases:
        kind, epoch, t = p.get("phase"), int(p.get("epoch") or 0), p.get("ended") or time.time()
        values: dict[str, float | None] = {name: p.get(key) for key, name in _PHASE_SHARES}
        values["images_per_s"] = p.get("images_per_s")
        values["disk_read_MB"] = _scaled(p.get("disk_read_bytes"), 1 / MB)
        values["cache_read_MB"] = _scaled(p.get("cache_read_bytes"), 1 / MB)
        values["dataset_resident_pct_end"] = _scaled(p.get("dataset_resident_frac_end"), 100.0)
        values["cpu_util_pct"] = p.get("cpu_util_pct")
        values["gpu_util_pct"] = p.get("gpu_util_pct")
        for name, value in values.items():
            if value is not None:  # a missing measurement is a missing point, not a zero
                ev.scalar(f"phase_{kind}/{name}", value, epoch, float(t))


def _scaled(v: Any, scale: float) -> float | None:
    return None if v is None else float(v) * scale


def _per_second(series: Series, t0: float, scale: float) -> list[tuple[int, float, float]]:
    """``(second, wall_time, mean)``: bucket means averaged per whole second since ``t0``."""
    acc: dict[int, list[float]] = {}
    for t, mean in zip(series.t, series.mean, strict=True):
        row = acc.setdefault(int(t - t0), [0.0, 0.0, 0.0])
        row[0] += t
        row[1] += mean
        row[2] += 1
    return [(s, row[0] / row[2], row[1] / row[2] * scale) for s, row in sorted(acc.items())]


def sampled_tags(gpu_sources: Iterable[str]) -> list[SeriesTag]:
    """The sampled series exported, given the GPU sources present (``gpu0`` ...)."""
    wanted = list(SAMPLED_TAGS)
    for gpu in gpu_sources:
        if ":" not in gpu:  # gpu0, not gpu0:proc:123
            wanted += [SeriesTag(gpu, metric, tag.format(gpu=gpu), scale)
                       for metric, tag, scale in GPU_TAGS]
    return wanted


def _sampled_events(ev: EventWriter, timeline: Timeline) -> list[str]:
    """System series; returns the tags written."""
    tags = []
    for st in sampled_tags(timeline.sources("util_pct", prefix="gpu")):
        source, metric, tag, scale = st.source, st.metric, st.tag, st.scale
        series = timeline.get(source, metric)
        if series is None or not series.t:
            continue
        for second, wall, value in _per_second(series, timeline.t0, scale):
            ev.scalar(tag, value, second, wall)
        tags.append(tag)
    return tags


# -- the words --------------------------------------------------------------------------------------
def _md_text(v: Any) -> str:
    """A user-controlled string (file, class or run name, command line, note) as inert text:
    TensorBoard renders these summaries as Markdown, and Markdown passes raw HTML through."""
    return html.escape(str(v), quote=False).replace("`", "&#96;")


def _md_cell(v: Any) -> str:
    return _md_text(v).replace("|", "\\|").replace("\n", " ")


def verdicts_markdown(phases: Sequence[PhaseRow]) -> str:
    """One table row per epoch and phase: verdict, cause and the step split."""
    rows = ["| epoch | phase | verdict | input cause | data wait | copy | compute | images/s |",
            "|---|---|---|---|---|---|---|---|"]
    for p in phases:
        rate = p.get("images_per_s")
        rows.append("| " + " | ".join(_md_cell(c) for c in (
            p.get("epoch"), p.get("phase"), p.get("verdict") or "no steps",
            p.get("input_cause") or "", fmt_pct(p.get("data_wait_frac")),
            fmt_pct(p.get("transfer_frac")), fmt_pct(p.get("compute_frac")),
            fmt_num(rate))) + " |")
    return "\n".join(rows)


def findings_markdown(findings: Sequence[Finding]) -> str:
    if not findings:
        return "No findings."
    parts = []
    for f in findings:
        ev = f.get("evidence")
        evidence = "; ".join(map(str, ev)) if isinstance(ev, list) else str(ev or "")
        gain = f.get("expected_gain")
        parts.append(f"**{_md_cell(f.get('title', ''))}** ({_md_text(f.get('severity', ''))})\n\n"
                     f"Evidence: {_md_text(evidence)}\n\n"
                     f"Fix: {_md_text(f.get('fix') or 'none named')}"
                     + (f"\n\nExpected gain: {_md_text(gain)}" if gain else ""))
    return "\n\n---\n\n".join(parts)


def answers_markdown(answers: Sequence[AnswerLike]) -> str:
    return "\n\n".join(f"**{i}. {_md_text(a.title)}**\n\n{_md_text(a.text)}"
                         for i, a in enumerate(answers, 1))


def run_markdown(summary: Summary) -> str:
    run = summary.get("run") or {}
    lines = [f"- {k}: {_md_cell(run.get(k))}" for k in
             ("name", "status", "device", "command") if run.get(k) is not None]
    mem = summary.get("memory") or {}
    if mem.get("total_bytes"):
        lines.append(f"- device memory: {fmt_bytes(mem.get('total_bytes'))}")
    return "\n".join(lines) or "(no run information)"


def write_texts(ev: EventWriter, summary: Summary, answers: Sequence[AnswerLike],
                t_end: float) -> None:
    """The run, the verdict table, the findings and the explanation as text summaries."""
    ev.text("run/summary", run_markdown(summary), t_end)
    ev.text("verdicts/phases", verdicts_markdown(list(summary.get("phases") or [])), t_end)
    ev.text("findings/all", findings_markdown(summary.get("findings") or []), t_end)
    ev.text("explanation/answers", answers_markdown(answers), t_end)


# -- public API -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorBoardExport:
    """What :func:`write_tensorboard` wrote: the folder, and how many points of each kind."""

    log_dir: Path
    event_file: Path
    step_points: int
    phase_count: int
    sampled_tags: tuple[str, ...]


def write_tensorboard(log_dir: Path, summary: Summary, timeline: Timeline,
                      answers: Sequence[AnswerLike]) -> TensorBoardExport:
    """Write a run's figures and words as TensorBoard event files into ``log_dir``.

    Args:
        log_dir: the folder ``tensorboard --logdir`` is pointed at (created); several runs can
            share a parent folder, one sub-folder each.
        summary: the run's ``summary.json`` dict.
        timeline: the run's history (``analysis.timeline.load_timeline``).
        answers: the explanation (objects with ``title`` and ``text``).

    Returns:
        Where the file went and what it holds.

    Examples:
        >>> with RunReader(run_dir) as r:
        ...     write_tensorboard(Path("tb/mine"), summary, load_timeline(r), explain(summary))
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    ev = EventWriter(log_dir)
    try:
        steps = _step_events(ev, timeline)
        phases = list(summary.get("phases") or [])
        write_phases(ev, phases)
        tags = _sampled_events(ev, timeline)
        write_texts(ev, summary, answers, timeline.t1 or time.time())
    finally:
        ev.close()
    return TensorBoardExport(log_dir, ev.path, steps, len(phases), tuple(tags))
