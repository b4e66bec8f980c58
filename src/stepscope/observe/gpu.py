"""GPU samples through NVML (package ``nvidia-ml-py``, module ``pynvml``) and the PyTorch caching
allocator's statistics.

All NVML calls go through ``Nvml.call``: a function the device does not support (consumer
cards lack PCIe counters, some MIG slices lack utilization) returns None once, writes one note,
and its series is simply absent from then on.

NVML "utilization" is the share of the last sample window (1/6 s to 1 s) in which at least one
kernel ran, not how busy the GPU's cores were: a single tiny kernel running all the time reads
100 %. Step timing, not this figure, decides whether a run is compute-bound.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

from stepscope.observe.base import NoteFn, SamplerUnavailable
from stepscope.store.records import Sample

T = TypeVar("T")

# torch.cuda.memory_stats key -> our metric (docs/records.md, source torch:cuda<N>)
TORCH_STATS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "allocated_bytes.all.peak": "max_allocated_bytes",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
}


def _load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise SamplerUnavailable(f"NVML not available: nvidia-ml-py is not installed ({exc})") from exc
    return pynvml


class Nvml:
    """The one place that talks to NVML: initialised once, unsupported calls noted once.

    Args:
        note: where "not supported" notes go, ``note(source, text)``.
        module: the ``pynvml`` module; tests inject a stand-in since there is no GPU here.

    Raises:
        SamplerUnavailable: NVML cannot start (no driver, no library, no device).
    """

    _init_lock = threading.Lock()

    def __init__(self, note: NoteFn, module: ModuleType | None = None) -> None:
        self.nv = module if module is not None else _load_pynvml()
        self._note = note
        self._noted: set[str] = set()
        with self._init_lock:  # nvmlInit is reference counted; one init per wrapper
            try:
                self.nv.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
                raise SamplerUnavailable(f"NVML not available: {exc}") from exc

    def call(self, source: str, fn_name: str, *args: Any) -> Any:
        """``pynvml.<fn_name>(*args)``, or None (with one note per function) when the device or
        driver does not support it. Other NVML errors also give None, noted once."""
        fn: Callable[..., Any] | None = getattr(self.nv, fn_name, None)
        if fn is None:
            return self._once(fn_name, source, f"{fn_name} is missing from this nvidia-ml-py")
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            not_supported = getattr(self.nv, "NVMLError_NotSupported", ())
            why = "not supported on this device" if isinstance(exc, not_supported) else str(exc)
            return self._once(fn_name, source, f"{fn_name}: {why}; its series is absent")

    def _once(self, key: str, source: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self._note(source, text)

    def shutdown(self) -> None:
        # shutting down a broken NVML must not fail the run's end
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


class GpuSampler:
    """``gpu<N>``, ``gpu<N>:proc:<pid>`` and ``torch:cuda<N>`` series (docs/records.md).

    ``gpu<N>`` is NVML's device index (all devices, whatever ``CUDA_VISIBLE_DEVICES`` says);
    ``torch:cuda<N>`` is torch's index within the visible devices.

    Args:
        pids: the observed tree's PIDs, for per-process GPU memory. In a container NVML reports
            host PIDs, which then match nothing: the per-process series is absent, with a note.
        note: where notes go.
        nvml: an ``Nvml`` wrapper (tests build one over a stand-in module).

    Examples:
        >>> s = GpuSampler(pids=tree.pids, note=writer.note)
        >>> s.sample(time.time())
    """

    name = "gpu"

    def __init__(
        self,
        *,
        pids: Callable[[], Iterable[int]] = lambda: (),
        note: NoteFn,
        nvml: Nvml | None = None,
    ) -> None:
        self.nvml = nvml if nvml is not None else Nvml(note)
        self._pids = pids
        self._note = note
        count = self.nvml.call("gpu", "nvmlDeviceGetCount") or 0
        if count == 0:
            raise SamplerUnavailable("NVML not available: it reports no GPU")
        self.handles = [self.nvml.call("gpu", "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        self._pid_mismatch_noted = False

    def identities(self) -> dict[str, tuple[object, str]]:
        """Facts naming each NVML device (``gpu<N>.uuid``, ``gpu<N>.pci_bus_id``): what maps a
        run's ``cuda:N`` to NVML's index (analysis/gpu_identity.py)."""
        out: dict[str, tuple[object, str]] = {}
        for index, h in enumerate(self.handles):
            if h is None:
                continue
            uuid = self.nvml.call(f"gpu{index}", "nvmlDeviceGetUUID", h)
            if uuid is not None:
                out[f"gpu{index}.uuid"] = (_text(uuid), "nvmlDeviceGetUUID")
            pci = self.nvml.call(f"gpu{index}", "nvmlDeviceGetPciInfo", h)
            bus = getattr(pci, "busId", None)
            if bus is not None:
                out[f"gpu{index}.pci_bus_id"] = (_text(bus), "nvmlDeviceGetPciInfo busId")
        return out

    def sample(self, now: float) -> list[Sample]:
        """NVML device and per-process figures, then torch allocator figures if CUDA is live."""
        out: list[Sample] = []
        ours = set(self._pids())
        for index, handle in enumerate(self.handles):
            if handle is not None:
                out += self._device_samples(now, index, handle)
                out += self._process_samples(now, index, handle, ours)
        return out + torch_allocator_samples(now)

    def _device_samples(self, now: float, index: int, h: Any) -> list[Sample]:
        src, nv, call = f"gpu{index}", self.nvml.nv, self.nvml.call
        values: dict[str, float | None] = {}
        util = call(src, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            values["util_pct"], values["mem_util_pct"] = util.gpu, util.memory
        mem = call(src, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            values["mem_used_bytes"], values["mem_total_bytes"] = mem.used, mem.total
        # Each PCIe counter call blocks ~20 ms (NVML measures over that window): wall time of
        # the sampler thread, not CPU, and not the training thread's.
        for metric, counter in (("pcie_rx_bytes_per_s", "NVML_PCIE_UTIL_RX_BYTES"),
                                ("pcie_tx_bytes_per_s", "NVML_PCIE_UTIL_TX_BYTES")):
            kb_per_s = call(src, "nvmlDeviceGetPcieThroughput", h, getattr(nv, counter, 1))
            values[metric] = None if kb_per_s is None else kb_per_s * 1024.0
        power_mw = call(src, "nvmlDeviceGetPowerUsage", h)
        values["power_w"] = None if power_mw is None else power_mw / 1000.0
        values["temp_c"] = call(src, "nvmlDeviceGetTemperature", h,
                                getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        values["sm_clock_mhz"] = call(src, "nvmlDeviceGetClockInfo", h,
                                      getattr(nv, "NVML_CLOCK_SM", 1))
        return [Sample(now, src, m, float(v)) for m, v in values.items() if v is not None]

    def _process_samples(self, now: float, index: int, h: Any, ours: set[int]) -> list[Sample]:
        procs = self.nvml.call(f"gpu{index}", "nvmlDeviceGetComputeRunningProcesses", h) or []
        out = [
            Sample(now, f"gpu{index}:proc:{p.pid}", "mem_used_bytes", float(p.usedGpuMemory))
            for p in procs
            if p.pid in ours and p.usedGpuMemory is not None  # None: not reported (e.g. WDDM, MIG)
        ]
        if procs and not out and ours and not self._pid_mismatch_noted:
            self._pid_mismatch_noted = True
            self._note(f"gpu{index}", "NVML lists GPU processes but none of the observed PIDs "
                       "(PID namespace of a container?): per-process GPU memory absent")
        return out

    def close(self) -> None:
        self.nvml.shutdown()


def process_gpu_bytes(nvml: Nvml, pid: int) -> int:
    """Device memory NVML attributes to ``pid``, summed over every GPU (0 when not listed)."""
    total = 0
    for index in range(nvml.call("gpu", "nvmlDeviceGetCount") or 0):
        h = nvml.call(f"gpu{index}", "nvmlDeviceGetHandleByIndex", index)
        procs = [] if h is None else (
            nvml.call(f"gpu{index}", "nvmlDeviceGetComputeRunningProcesses", h) or [])
        total += sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)
    return total


def measure_cuda_context(init: Callable[[], object], reserved: Callable[[], int],
                         nvml: Nvml, pid: int) -> int:
    """The CUDA context's device memory: NVML's per-process figure after ``init`` (which
    creates the context and allocates nothing) minus before, minus what the allocator reserved
    meanwhile. Call it before anything else touches CUDA."""
    before = process_gpu_bytes(nvml, pid)
    init()
    return max(process_gpu_bytes(nvml, pid) - before - int(reserved()), 0)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_device_identity(torch: Any, index: int) -> dict[str, tuple[object, str]]:
    """Facts naming torch's ``cuda:<index>`` (UUID, PCI bus id) for the NVML mapping."""
    props = torch.cuda.get_device_properties(index)
    out: dict[str, tuple[object, str]] = {}
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        out[f"torch.cuda{index}.uuid"] = (str(uuid), "torch.cuda.get_device_properties().uuid")
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        out[f"torch.cuda{index}.pci_bus_id"] = (f"{domain:08x}:{bus:02x}:{device:02x}.0",
                                                "torch.cuda.get_device_properties() pci ids")
    return out


def torch_allocator_samples(now: float) -> list[Sample]:
    """``torch:cuda<N>`` allocator figures, only when this process already uses CUDA.

    Never initialises CUDA: doing it from the sampler thread would create a CUDA context
    (hundreds of MB of device memory) on a device the program may never use, and a process that
    has initialised CUDA cannot fork DataLoader workers that touch CUDA. Nor does it import
    torch: a program that does not import it has no allocator to report.
    """
    torch: Any = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    out: list[Sample] = []
    for index in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(index)
        out += [Sample(now, f"torch:cuda{index}", metric, float(stats[key]))
                for key, metric in TORCH_STATS.items() if key in stats]
    return out
