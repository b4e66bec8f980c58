"""The ``stepscope`` command: each command parses, builds a config, calls the library, renders.

This is the only module that imports the CLI library.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from stepscope.analysis.contracts_summary import Summary
from stepscope.errors import StepscopeError, disk_error
from stepscope.store.rundir import RunDir

app = typer.Typer(
    name="stepscope",
    help="Make a training run explain itself: where every step's time goes, what the machine "
    "does in each epoch and phase, why, and which change makes it faster.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
data_app = typer.Typer(help="Make datasets.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(data_app, name="data")

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

Opt = typer.Option


def _live_tensorboard(run_dir: Path, tensorboard: Path | None) -> Any:
    """Follow the run into TensorBoard files while it records (None without --tensorboard)."""
    if tensorboard is None:
        return None
    from stepscope.tblive import LiveTensorBoard

    err_console.print(f"stepscope: TensorBoard files in {tensorboard}, written as the run goes "
                      f"(tensorboard --logdir {tensorboard})")
    return LiveTensorBoard(run_dir, tensorboard).start()


def _print_version(value: bool) -> None:
    if value:
        from stepscope import __version__

        typer.echo(f"stepscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, Opt("--version", callback=_print_version, is_eager=True,
                                 help="Print stepscope's version and exit.")] = False,
) -> None:
    """Make a training run explain itself (see `stepscope COMMAND --help`)."""


def _finish_run(run_dir: Path, *, show: bool = True, as_json: bool = False,
                tensorboard: Path | None = None, live: Any = None) -> Summary:
    """Analyse a recorded run, write summary.json and report.html (and TensorBoard event files
    into ``tensorboard``), print the verdicts."""
    from stepscope.finish import finish_run
    from stepscope.render import terminal

    done = finish_run(run_dir, tensorboard=tensorboard, live=live)
    if tensorboard is not None:
        err_console.print(f"tensorboard: {tensorboard}  (tensorboard --logdir {tensorboard})")
    if as_json:
        console.print_json(json.dumps(done.summary, default=str))
    elif show:
        if done.summary.get("phases"):  # no loop timed: the explanation says what exists
            console.print(terminal.phase_table(done.summary))
        ranks = terminal.rank_table(done.summary)
        if ranks is not None:
            console.print(ranks)
        console.print(terminal.explanation(done.answers))
        console.print(f"report: {RunDir(run_dir).report}   summary: {RunDir(run_dir).summary}")
    return done.summary


# -- data ---------------------------------------------------------------------------------------
@data_app.command("synth")
def data_synth(
    out: Annotated[Path, typer.Argument(help="Folder to write images/, train.csv, valid.csv into.")],
    images: Annotated[int, Opt(help="Number of images (80 % train, 20 % validation).")] = 2000,
    seed: Annotated[int, Opt(help="Same seed, same bytes.")] = 0,
) -> None:
    """Synthesise a Dogs-vs-Cats-like JPEG dataset in the seed's CSV layout.

    Example: stepscope data synth data/catsdogs --images 2000 --seed 0
    """
    from stepscope.analysis.fmt import fmt_bytes
    from stepscope.train.synth import synth_dataset

    with console.status("writing images…"):
        res = synth_dataset(out, images=images, seed=seed)
    console.print(f"wrote {res.files} images ({fmt_bytes(res.bytes)}) to {out}/images; "
                  f"{out}/train.csv ({res.train_images} rows), {out}/valid.csv ({res.val_images} rows)")


# -- train --------------------------------------------------------------------------------------
@app.command()
def train(
    ctx: typer.Context,
    csv: Annotated[Path | None, Opt(help="CSV with file names and classes (flow_from_dataframe layout).")] = None,
    val_csv: Annotated[Path | None, Opt(help="Validation CSV; without it --val-split splits --csv.")] = None,
    images: Annotated[Path | None, Opt(help="Folder the CSV's file names are relative to.")] = None,
    folder: Annotated[Path | None, Opt(help="Or: a folder with one subfolder per class.")] = None,
    x_col: Annotated[str | None, Opt(help="CSV column with file names. [default: Photo]")] = None,
    y_col: Annotated[str | None, Opt(help="CSV column with classes. [default: Class]")] = None,
    val_split: Annotated[float | None, Opt(help="Validation share when no --val-csv. [default: 0.2]")] = None,
    on_missing: Annotated[str | None, Opt(help="error|skip: listed files that do not exist. [default: error]")] = None,
    follow_links: Annotated[bool | None, Opt("--follow-links", help="Read image links that lead outside the image folder (refused by default).")] = None,
    max_image_pixels: Annotated[int | None, Opt(help="Refuse larger images before decoding (decompression bombs); 0: no limit. [default: 89478485]")] = None,
    augment: Annotated[str | None, Opt(help="seed|none|FILE.yaml (Keras ImageDataGenerator keys). [default: seed]")] = None,
    aug_backend: Annotated[str | None, Opt(help="fused (one warp per image, fast) | keras (step by step, the seed's) | gpu. [default: fused]")] = None,
    img_size: Annotated[int | None, Opt(help="Input size in pixels. [default: 299]")] = None,
    batch_size: Annotated[int | None, Opt(help="[default: 8]")] = None,
    workers: Annotated[str | None, Opt(help="DataLoader workers: a number or auto. [default: auto]")] = None,
    model: Annotated[str | None, Opt(help="Any timm model name. [default: efficientnet_lite0]")] = None,
    weights: Annotated[str | None, Opt(help="imagenet|none|PATH. [default: imagenet]")] = None,
    unfreeze: Annotated[int | None, Opt(help="Fine-tune the last N stages. [default: 0, frozen]")] = None,
    lr: Annotated[float | None, Opt(help="Adam learning rate. [default: 1e-4]")] = None,
    epochs: Annotated[int | None, Opt(help="[default: 10]")] = None,
    val_every: Annotated[int | None, Opt(help="Validate every N epochs. [default: 1]")] = None,
    monitor_metric: Annotated[str | None, Opt("--monitor", help="val_accuracy|val_loss: what best.pt keeps. [default: val_accuracy]")] = None,
    precision: Annotated[str | None, Opt(help="auto|fp32|bf16 for the frozen trunk. [default: auto]")] = None,
    device: Annotated[str | None, Opt(help="auto|cpu|cuda. [default: auto]")] = None,
    seed: Annotated[int | None, Opt(help="[default: 0]")] = None,
    threads: Annotated[int | None, Opt(help="torch threads on the CPU. [default: usable cores]")] = None,
    gpu_memory_fraction: Annotated[float | None, Opt(help="Cap this process's CUDA memory (torch.cuda.set_per_process_memory_fraction).")] = None,
    alloc_conf: Annotated[str | None, Opt(help="PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True.")] = None,
    out: Annotated[Path | None, Opt(help="Run directory. [default: runs/<model>-<time>]")] = None,
    name: Annotated[str | None, Opt(help="Run name.")] = None,
    no_monitor: Annotated[bool, Opt("--no-monitor", help="Do not record telemetry.")] = False,
    no_feature_cache: Annotated[bool, Opt("--no-feature-cache", help="Recompute frozen-trunk features every epoch (the cache reuses validation features, and training ones with --augment none).")] = False,
    channels_last: Annotated[bool | None, Opt("--channels-last/--no-channels-last", help="Memory format of trunk and input. [default: on]")] = None,
    interval: Annotated[float | None, Opt(help="Sampling period in seconds (0.1–60). [default: 1]")] = None,
    resume: Annotated[Path | None, Opt(help="Continue RUN_DIR from its last.pt.")] = None,
    max_steps: Annotated[int | None, Opt(help="Stop each phase after N steps (smoke tests).")] = None,
    config: Annotated[Path | None, Opt(help="YAML config (e.g. a run's config.yaml or tune's output); flags override it.")] = None,
    tensorboard: Annotated[Path | None, Opt(help="Also write TensorBoard event files to this folder: steps and system series as the run goes, per-phase figures, findings and explanation at its end.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print summary.json at the end instead of tables.")] = False,
    nproc: Annotated[int | None, Opt(help="Run N DDP ranks on this machine under torchrun, e.g. --nproc 2.")] = None,
) -> None:
    """Train the seed's transfer-learning job (frozen backbone, new head) and diagnose it.

    Example: stepscope train --csv data/catsdogs/train.csv --val-csv data/catsdogs/valid.csv
    --images data/catsdogs/images --epochs 3 --img-size 224 --out runs/first
    """
    from stepscope.render.progress import TrainProgress
    from stepscope.train.loop import train as run_training

    if nproc and "RANK" not in os.environ:  # the shortcut: launch torchrun for this machine
        from stepscope.train.distributed import launch_local, without_flag

        raise typer.Exit(launch_local(nproc, without_flag(sys.argv[1:], "--nproc")))
    # The parsed flags by name, as click holds them (tune parses its pass-through flags the same way).
    cfg = _resolve_train_flags(ctx.params)
    live = None
    if tensorboard is not None and cfg.monitor and os.environ.get("RANK", "0") == "0":
        import dataclasses

        from stepscope.train.config import default_run_dir

        # Fix the run directory now (its default name holds the time) so the follower and
        # the trainer agree on it.
        cfg = dataclasses.replace(cfg, out=str(default_run_dir(cfg)))
        live = _live_tensorboard(Path(cfg.resume or cfg.out), tensorboard)
    try:
        result = run_training(cfg, TrainProgress(console))
    except BaseException:
        if live is not None:
            live.stop()
        raise
    if result.rank != 0:  # under torchrun only rank 0 analyses (all ranks' stores) and prints
        return
    if cfg.monitor:
        _finish_run(result.run_dir, as_json=as_json, tensorboard=tensorboard, live=live)
    console.print(f"run directory: {result.run_dir}")


# -- predict ------------------------------------------------------------------------------------
@app.command()
def predict(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint, e.g. runs/x/checkpoints/best.pt")],
    images: Annotated[list[Path], typer.Argument(help="Image files.")],
    as_json: Annotated[bool, Opt("--json", help="One JSON list: path, label, probability, error per image.")] = False,
    max_image_pixels: Annotated[int, Opt(help="Refuse larger images before decoding; 0: no limit.")] = 89_478_485,
) -> None:
    """Print the class and probability for each image, or why that image could not be read.

    Exits 1 if any image failed (the others are still answered).

    Example: stepscope predict runs/first/checkpoints/best.pt data/catsdogs/images/cat.1.jpg
    """
    from stepscope.train.data import set_max_image_pixels
    from stepscope.train.predict import predict as run_predict

    set_max_image_pixels(max_image_pixels)
    answers = run_predict(checkpoint, images)
    if as_json:
        typer.echo(json.dumps([p.to_dict() for p in answers]))
    for p in answers if not as_json else []:
        # Plain tab-separated lines: meant for scripts as much as for people. A failed image
        # says why on stderr, in its place in the order.
        if p.error is None:
            typer.echo(f"{p.path}\t{p.label}\t{p.probability:.3f}")
        else:
            typer.echo(f"{p.path}\terror: {p.error}", err=True)
    failed = sum(p.error is not None for p in answers)
    if failed:
        if not as_json:
            typer.echo(f"{failed} of {len(answers)} image(s) could not be classified", err=True)
        raise typer.Exit(1)


# -- report / explain / compare / top -----------------------------------------------------------
@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds run.db).")],
    trace: Annotated[bool, Opt(help="Also write trace.json (Chrome Trace Event format, opens in Perfetto).")] = False,
    tensorboard: Annotated[Path | None, Opt(help="Also write TensorBoard event files (steps, phases, system series, findings, explanation) to this folder.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print summary.json.")] = False,
) -> None:
    """(Re)analyse a run: summary.json, report.html, and optionally trace.json.

    Example: stepscope report runs/first --trace --tensorboard tb/first
    """
    _finish_run(run_dir, as_json=as_json, tensorboard=tensorboard)
    if trace:
        from stepscope.analysis.timeline import load_timeline
        from stepscope.render.trace import MAX_POINTS, MAX_STEPS, write_trace
        from stepscope.store.db import RunReader

        with RunReader(run_dir) as reader:
            tl = load_timeline(reader, max_points=MAX_POINTS, max_step_spans=MAX_STEPS)
        path = write_trace(RunDir(run_dir).trace, tl)
        console.print(f"trace: {path}  (open in https://ui.perfetto.dev)")


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    csv_dir: Annotated[Path, Opt("--csv", help="Folder for steps.csv, phases.csv and samples.csv.")],
) -> None:
    """Write the run's step, phase and sample tables as CSV files (for pandas).

    Example: stepscope export runs/first --csv runs/first/csv
    """
    from stepscope.store.export import export_csv

    for path in export_csv(run_dir, csv_dir):
        console.print(str(path))


@app.command()
def explain(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    as_json: Annotated[bool, Opt("--json", help="Answers as JSON.")] = False,
) -> None:
    """Answer, in plain words, why the run behaved as it did.

    Example: stepscope explain runs/first
    """
    from stepscope.analysis import summary as summ
    from stepscope.analysis.explain import explain as run_explain
    from stepscope.render import terminal

    summary = summ.write_summary(run_dir)
    answers = run_explain(summary)
    if as_json:
        from stepscope.render.jsonout import dumps, explain_json

        typer.echo(dumps(explain_json(summary, answers)))
    else:
        console.print(terminal.explanation(answers))


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The baseline run.")],
    run_b: Annotated[Path, typer.Argument(help="The changed run.")],
    html_out: Annotated[Path | None, Opt("--html", help="Also write an HTML comparison here.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Compare two runs: throughput ratio, data-wait change, verdict changes, memory deltas.

    Example: stepscope compare runs/workers0 runs/workers2 --html cmp.html
    """
    from stepscope.analysis import summary as summ
    from stepscope.analysis.compare import compare_summaries
    from stepscope.render import terminal
    from stepscope.render.html_compare import write_compare_report

    a, b = summ.write_summary(run_a), summ.write_summary(run_b)
    cmp = compare_summaries(a, b)
    if as_json:
        from stepscope.render.jsonout import compare_json, dumps

        typer.echo(dumps(compare_json(cmp, a, b)))
    else:
        console.print(terminal.comparison_table(cmp))
    if html_out is not None:
        write_compare_report(html_out, cmp, a, b)
        (err_console if as_json else console).print(f"comparison: {html_out}")


@app.command()
def top(
    run_dir: Annotated[Path, typer.Argument(help="A run directory being written right now.")],
    interval: Annotated[float, Opt(help="Refresh period, seconds.")] = 1.0,
    once: Annotated[bool, Opt(help="Print one frame and exit.")] = False,
) -> None:
    """Live view of a run in progress, from another terminal (reads run.db; stops when the run ends).

    Example: stepscope top runs/first
    """
    from rich.live import Live

    from stepscope.analysis.live import snapshot
    from stepscope.render.live import top_view
    from stepscope.store.db import RunReader

    def frame() -> tuple[Any, str]:
        with RunReader(run_dir) as reader:
            snap = snapshot(reader)
        return top_view(snap), snap.status

    view, status = frame()
    if once or not console.is_terminal:
        console.print(view)
        return
    with Live(view, console=console, refresh_per_second=4) as live:
        while status == "running":
            time.sleep(interval)
            view, status = frame()
            live.update(view)


@app.command()
def doctor(
    data: Annotated[Path | None, Opt(help="Dataset folder (images, recursively) to test storage and decoding on.")] = None,
    model: Annotated[str, Opt(help="timm model whose forward speed to measure.")] = "efficientnet_lite0",
    img_size: Annotated[int, Opt(help="Input size in pixels.")] = 299,
    batch_size: Annotated[int, Opt(help="Batch size for the forward ceiling.")] = 8,
    augment: Annotated[str, Opt(help="seed|none: include the seed's augmentation in the decode ceiling.")] = "seed",
    aug_backend: Annotated[str, Opt(help="fused|keras.")] = "fused",
    threads: Annotated[int | None, Opt(help="torch threads for the forward ceiling. [default: usable cores]")] = None,
    budget: Annotated[float, Opt("--budget-s", help="Seconds to spend measuring.")] = 10.0,
    as_json: Annotated[bool, Opt("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What this machine can do and measure, and whether the input pipeline or the model will
    be the bottleneck — before you train.

    Example: stepscope doctor --data data/catsdogs --model inception_resnet_v2 --img-size 299
    """
    from stepscope.analysis.doctor import cache_prediction, prediction
    from stepscope.render.doctor import doctor_view
    from stepscope.train.doctor import run_doctor

    def progress(text: str) -> None:
        if not as_json:
            err_console.print(f"  {text}", markup=False)

    result = run_doctor(data=data, model=model, img_size=img_size, batch_size=batch_size,
                        budget_s=budget, progress=progress, augment=augment,
                        aug_backend="keras" if aug_backend == "keras" else "fused",
                        threads=threads)
    result["prediction"] = prediction(result)
    result["cache_prediction"] = cache_prediction(result)
    if as_json:
        from stepscope.render.jsonout import doctor_json, dumps

        typer.echo(dumps(doctor_json(result)))
    else:
        console.print(doctor_view(result))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def watch(
    cmd: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    out: Annotated[Path | None, Opt(help="Run directory. [default: runs/watch-<time>]")] = None,
    interval: Annotated[float, Opt(help="Sampling period in seconds (0.1–60).")] = 1.0,
    no_preallocate: Annotated[bool, Opt("--no-preallocate", help="Make TensorFlow/JAX allocate GPU memory as needed (TF_FORCE_GPU_ALLOW_GROWTH=true, XLA_PYTHON_CLIENT_PREALLOCATE=false), so their real need shows.")] = False,
    tensorboard: Annotated[Path | None, Opt(help="Also write TensorBoard event files to this folder: steps and system series as the run goes, per-phase figures, findings and explanation at its end.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print summary.json at the end instead of tables.")] = False,
    phase_hint: Annotated[str, Opt("--phase-hint", help="How plain PyTorch loops are split into train/val: auto (a step with an optimizer step or backward is training), mode (model.train()/eval()), grad (torch.no_grad() is validation), for optimizers torch's hooks cannot see.")] = "auto",
) -> None:
    """Run any training command and diagnose it, no code change: PyTorch DataLoader loops,
    Keras fit/evaluate, or just the system picture for anything else. Exits with the
    command's exit code.

    Example: stepscope watch --out runs/mine -- python train.py --epochs 3
    """
    from stepscope.observe.watch import watch as run_watch

    if not cmd:
        raise StepscopeError("nothing to watch: give the command after --, e.g. "
                             "stepscope watch -- python train.py")
    run_dir = out or Path("runs") / f"watch-{time.strftime('%Y%m%d-%H%M%S')}"
    if RunDir(run_dir).has_store():
        # A second run's rows would join the first's in one store, and its processes, phases
        # and memory would be read as one run's (a failed attempt's 15 MB process once stood
        # for a 750 MB one's baseline).
        raise StepscopeError(f"{run_dir} already holds a recorded run: give another --out, "
                             "or remove that folder to record over it")
    live = _live_tensorboard(run_dir, tensorboard)
    try:
        result = run_watch(list(cmd), run_dir, interval_s=interval, no_preallocate=no_preallocate,
                           phase_hint=phase_hint, on_start=lambda pid: err_console.print(f"stepscope: watching pid {pid}, recording to {run_dir}"))
    except BaseException:
        if live is not None:
            live.stop()
        raise
    if RunDir(run_dir).has_store():
        _finish_run(run_dir, as_json=as_json, tensorboard=tensorboard, live=live)
    elif live is not None:
        live.stop()
    raise typer.Exit(result.exit_code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tune(
    ctx: typer.Context,
    budget: Annotated[float, Opt("--budget-s", help="Seconds the whole tune may take.")] = 120.0,
    out_config: Annotated[Path, Opt(help="Where to write the winning configuration (YAML).")] = Path("tuned.yaml"),
    as_json: Annotated[bool, Opt("--json", help="Print the measurements and the winner as JSON (docs/json.md).")] = False,
) -> None:
    """Measure which input-pipeline and precision settings train fastest on your data and
    machine, and write the winner as a config for `stepscope train --config`.

    Takes the same arguments as `stepscope train` (data, model, image size, ...).

    Example: stepscope tune --csv data/catsdogs/train.csv --images data/catsdogs/images
    --img-size 299 --budget-s 120 --out-config tuned.yaml
    """
    from rich.progress import BarColumn, Progress, TextColumn

    from stepscope.analysis.tune import (
        choose_winner,
        predicted_vs_achieved,
        run_rate,
        run_workers_curve,
        skip_notes,
    )
    from stepscope.render.tune import tune_table
    from stepscope.train import tune as tuning

    cfg = _train_config_from_args(list(ctx.args))
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  console=err_console if as_json else console, transient=True) as bar:
        task = bar.add_task("tuning", total=1.0)

        def progress(text: str, frac: float) -> None:
            bar.update(task, description=text[:70], completed=min(frac, 1.0))

        result = tuning.tune(cfg, read_rate=run_rate, budget_s=budget, progress=progress,
                             read_curve=run_workers_curve)
    # train/ measured; analysis/ decides which run won and says why, and prices each run
    # with the capacity model beside what it achieved.
    result.decide(*choose_winner(result.rows), skip_notes(result.rows))
    result.price(predicted_vs_achieved(result.rows, result.baseline_workers_curve))
    tuning.write_tuned_config(result, cfg, out_config)
    if as_json:
        from stepscope.render.jsonout import dumps, tune_json

        typer.echo(dumps(tune_json(result.to_dict(), str(out_config))))
        return
    console.print(tune_table(result))
    console.print(f"winner written to {out_config}: stepscope train --config {out_config}")


def _train_config_from_args(args: list[str]) -> Any:
    """Parse `stepscope train`'s flags (as tune receives them) into a resolved TrainConfig."""
    from typer.main import get_command

    train_cmd = get_command(app).commands["train"]  # type: ignore[attr-defined]
    return _resolve_train_flags(train_cmd.make_context("tune", args).params)


# free-form: the train command's flags by name, as typer passed them
def _resolve_train_flags(params: dict[str, Any]) -> Any:
    """`train`'s parsed flags -> TrainConfig: defaults < --config/--resume's config < flags."""
    from stepscope.train import config as tcfg

    given = {k: v for k, v in params.items()
             if k not in ("config", "as_json", "no_monitor", "no_feature_cache", "nproc",
                          "tensorboard")}
    given["monitor"] = False if params.get("no_monitor") else None
    given["feature_cache"] = False if params.get("no_feature_cache") else None
    given["interval_s"] = given.pop("interval", None)
    given = {k: (str(v) if isinstance(v, Path) else v) for k, v in given.items()}
    resume = params.get("resume")
    base = None
    if resume is not None and RunDir(Path(resume)).config.is_file():
        base = tcfg.load_yaml_config(RunDir(Path(resume)).config)
    return tcfg.resolve_config(given, params.get("config"), base=base)


# -- demo ---------------------------------------------------------------------------------------
@app.command()
def demo(
    out: Annotated[Path, Opt(help="Where the data and the run go.")] = Path("runs/demo"),
    images: Annotated[int, Opt(help="Images to synthesise.")] = 600,
    epochs: Annotated[int, Opt(help="Epochs.")] = 2,
) -> None:
    """Synthesise a small cats-vs-dogs set, train pretrained EfficientNet-Lite0 with the seed's
    augmentation, and explain the run.

    Example: stepscope demo --out runs/demo
    """
    from stepscope.render.progress import TrainProgress
    from stepscope.train.config import resolve_config
    from stepscope.train.loop import train as run_training
    from stepscope.train.synth import synth_dataset

    data_dir = out / "data"
    if not (data_dir / "train.csv").is_file():
        with console.status(f"synthesising {images} images…"):
            synth_dataset(data_dir, images=images, seed=0)
    run_dir = out / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = resolve_config({
        "csv": str(data_dir / "train.csv"), "val_csv": str(data_dir / "valid.csv"),
        "images": str(data_dir / "images"), "augment": "seed", "epochs": epochs,
        "img_size": 224, "out": str(run_dir), "name": "demo",
    })
    result = run_training(cfg, TrainProgress(console))
    _finish_run(result.run_dir)


# -- entry point --------------------------------------------------------------------------------
def main() -> None:
    """Console entry point: user-fixable errors print in one or two lines (``--debug``: traceback)."""
    debug = "--debug" in sys.argv[1:]
    if debug:
        sys.argv.remove("--debug")
    try:
        # The program's name for --help and for the completion script (--install-completion),
        # also when started as `python -m stepscope`.
        app(prog_name="stepscope")
    except StepscopeError as exc:
        if debug:
            raise
        err_console.print(f"stepscope: error: {exc}", markup=False)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        err_console.print("stepscope: interrupted")
        raise SystemExit(130) from None
    except OSError as exc:
        # The disk failing under any other write (report.html, trace.json, run.db at the
        # start): one line that names it, not a traceback.
        err = disk_error(exc, str(exc.filename or "the run directory"),
                         "free space (or choose another directory) and run the command again")
        if err is None or debug:
            raise
        err_console.print(f"stepscope: error: {err}", markup=False)
        raise SystemExit(2) from None

