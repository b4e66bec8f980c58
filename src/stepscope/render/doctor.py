"""Terminal view of ``stepscope doctor``'s report: machine, measurability, ceilings, verdicts."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.doctor import cache_prediction, caveats, prediction
from stepscope.analysis.fmt import fmt_bytes, fmt_pct, fmt_rate
from stepscope.reports import DoctorReport, measured_ceilings

_ISA_NAMES = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16",
              "amx_tile": "AMX", "amx_bf16": "AMX-BF16"}


def _section(title: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE,
                  show_header=False, pad_edge=False)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column(overflow="fold")
    return table


def cpu_table(report: DoctorReport) -> Table:
    """CPU model, usable cores, instruction sets, memory."""
    cpu, mem = report["cpu"], report["memory"]
    t = _section("CPU and memory")
    t.add_row("model", cpu["model_name"])
    quota = "no quota" if cpu["quota_cores"] is None else f"quota {cpu['quota_cores']:g} cores"
    t.add_row("cores usable", f"{cpu['usable_cores']} (affinity {cpu['affinity_cores']} of "
              f"{cpu['logical_cpus']}, {quota}); load {cpu['load_avg_1m']:.1f}")
    isa = ", ".join(f"{name} {'yes' if cpu['isa'].get(flag) else 'no'}"
                    for flag, name in _ISA_NAMES.items())
    t.add_row("instruction sets", isa)
    pays = report["training"].get("bf16_pays")
    t.add_row("bf16 autocast", f"{'pays' if pays else 'does not pay'} on "
              f"{report['training']['device']}" + ("" if cpu.get("bf16_native") else
                                                   " (no native bf16 on the CPU)"))
    limit = mem.get("cgroup_limit_bytes")
    t.add_row("memory", f"{fmt_bytes(mem['total_bytes'])} total, "
              f"{fmt_bytes(mem['available_bytes'])} available"
              + (f", cgroup limit {fmt_bytes(limit)}" if limit else ""))
    return t


def gpu_table(report: DoctorReport) -> Table:
    """Each GPU NVML lists, or why there is none; and whether PyTorch sees one."""
    gpu = report["gpu"]
    t = _section("GPU")
    if not gpu["devices"]:
        t.add_row("NVML", f"none: {gpu['reason']}")
    else:
        t.add_row("driver", f"{gpu['driver_version']}, CUDA {gpu['cuda_driver_version']}")
    for d in gpu["devices"]:
        pcie = (f"PCIe gen {d['pcie_gen']} x{d['pcie_width']} (max gen {d['pcie_max_gen']} "
                f"x{d['pcie_max_width']})")
        t.add_row(f"gpu{d['index']}", f"{d['name']}, {fmt_bytes(d['memory_total_bytes'])}, "
                  f"compute capability {d['compute_capability']}, {pcie}")
    torch_sees = (f"yes, {gpu['torch_device_count']} device(s)" if gpu["torch_cuda_available"]
                  else "no (torch.cuda.is_available() is False)")
    t.add_row("PyTorch sees it", torch_sees)
    return t


def storage_table(report: DoctorReport) -> Table | None:
    """The dataset's filesystem, disk, size, residency and cold read speed."""
    s = report.get("storage")
    if not s:
        return None
    t = _section("Storage")
    t.add_row("dataset", f"{s['path']}: {s['files']:,} images, {fmt_bytes(s['dataset_bytes'])}")
    t.add_row("filesystem", f"{s['fstype']} mounted at {s['mount_point']} from {s['source']}")
    t.add_row("block device", s["block_device"] or "none (tmpfs, network or virtual filesystem)")
    t.add_row("in page cache", f"{fmt_pct(s['resident_frac'])} now "
              f"({s['resident_sampled_files']:,} files checked)")
    r = s.get("read")
    if r:
        cold = "" if r["cold_frac"] >= 0.99 else f", only {fmt_pct(r['cold_frac'])} of it cold"
        t.add_row("cold read", f"{r['mb_per_s']:.1f} MB/s, {fmt_rate(r['files_per_s'])} files/s "
                  f"({r['files']} files, one at a time, after eviction{cold})")
    return t


def capability_table(report: DoctorReport) -> Table:
    """What stepscope can measure here, yes/no with the reason."""
    t = Table(title="What stepscope can measure here", title_justify="left", title_style="bold",
              box=box.SIMPLE, pad_edge=False, show_header=False)
    t.add_column(style="cyan", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for c in report["capabilities"]:
        mark = Text("yes", style="green") if c["available"] else Text("no", style="red")
        t.add_row(c["name"], mark, c["reason"])
    return t


def ceiling_table(report: DoctorReport) -> Table:
    """The measured ceilings: median rate, spread, what each includes."""
    t = Table(title="Ceilings (measured)", title_justify="left", title_style="bold",
              box=box.SIMPLE, pad_edge=False)
    for name, justify in (("what", "left"), ("img/s", "right"), ("spread", "right"),
                          ("batches", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for _key, c in measured_ceilings(report["ceilings"]):
        t.add_row(c["name"], fmt_rate(c["images_per_s"]),
                  f"{fmt_rate(c['min_images_per_s'])}–{fmt_rate(c['max_images_per_s'])}",
                  str(c["batches"]))
    return t


def doctor_view(report: DoctorReport) -> RenderableType:
    """Everything ``stepscope doctor`` prints, as one renderable.

    Examples:
        >>> Console().print(doctor_view(run_doctor(data=None)))  # doctest: +SKIP
    """
    parts: list[RenderableType] = [cpu_table(report), gpu_table(report)]
    storage = storage_table(report)
    if storage is not None:
        parts.append(storage)
    parts += [capability_table(report), ceiling_table(report)]
    parts.append(Text.assemble(("Prediction: ", "bold"), prediction(report)))
    cache = cache_prediction(report)
    if cache:
        parts.append(Text.assemble(("Page cache: ", "bold"), cache))
    for caveat in caveats(report):
        parts.append(Text(f"note: {caveat}", style="yellow"))
    return Group(*parts)
