"""GPM (GPU Performance Monitoring, Hopper and later): SM, tensor, DRAM and link activity.

Two sample buffers per GPU are used in turn (ping-pong): each cycle takes one sample into the
older buffer and asks NVML for the metrics between the previous sample and this one, so every
value covers the whole cycle and nothing sleeps. The first cycle after start has only one sample
and yields nothing. NVML wants more than 100 ms between samples ("The interval between two
nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample refresh rate",
nvmlGpmMetricsGet); a faster cycle keeps the previous sample and skips GPM for that cycle. Each
metric carries its own ``nvmlReturn``: one that says NotSupported is dropped for good (the source
then re-announces the GPU's capabilities).

A GPU in MIG mode has no GPM of its own; each GPU instance is sampled with
``nvmlGpmMigSampleGet(parent, gpuInstanceId, sample)`` (:func:`mig_sample_get`). The two sample
buffers are NVML allocations: they are freed when the sampler closes, and also when the sampler
cannot be built (the first ``SampleGet`` is the support probe).
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Callable
from typing import Any

from gpulse.sources.nvml import errors as E

#: (GPM metric id, gpu field, scale to the field's unit); MiB/s rates become B/s.
METRICS: tuple[tuple[int, str, float], ...] = (
    (2, "sm_active_pct", 1.0),  # NVML_GPM_METRIC_SM_UTIL
    (3, "sm_occupancy_pct", 1.0),  # SM_OCCUPANCY
    (5, "tensor_active_pct", 1.0),  # ANY_TENSOR_UTIL
    (7, "hmma_active_pct", 1.0),  # HMMA_TENSOR_UTIL
    (10, "dram_bw_pct", 1.0),  # DRAM_BW_UTIL
    (13, "fp16_active_pct", 1.0),  # FP16_UTIL (non-tensor)
    (12, "fp32_active_pct", 1.0),  # FP32_UTIL
    (11, "fp64_active_pct", 1.0),  # FP64_UTIL
    (20, "gpm_pcie_tx_bytes_per_s", 1048576.0),  # PCIE_TX_PER_SEC, MiB/s
    (21, "gpm_pcie_rx_bytes_per_s", 1048576.0),  # PCIE_RX_PER_SEC
    (61, "nvlink_tx_bytes_per_s", 1048576.0),  # NVLINK_TOTAL_TX_PER_SEC
    (60, "nvlink_rx_bytes_per_s", 1048576.0),  # NVLINK_TOTAL_RX_PER_SEC
)
FIELDS = tuple(name for _, name, _ in METRICS)
MIN_INTERVAL_NS = 100_000_000
#: Samples are taken at least this far apart on the sampler's clock: "greater than 100ms", with
#: 1 ms to spare for the time between reading the clock and the driver taking the sample.
SPACING_NS = MIN_INTERVAL_NS + 1_000_000
# c_nvmlGpmMetric_t: metricId u32, nvmlReturn u32, value double, metricInfo (3 pointers). Decoded in
# one pass because pynvml structures make each attribute read slow.
_METRIC = struct.Struct("<IId24x")


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """Whether the device offers GPM (raises for a lost GPU or a dead driver, like any call)."""
    query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
    if query is None:
        return False
    try:
        return bool(query(handle).isSupportedDevice)
    except nvml.NVMLError as e:
        if E.code_of(e) in E.UNSUPPORTED:
            return False
        raise


SampleGet = Callable[[Any], Any]


def mig_sample_get(nvml: Any, parent: Any, gpu_instance_id: int) -> SampleGet:
    """``nvmlGpmMigSampleGet`` bound to one GPU instance of a MIG-enabled GPU."""
    fn = nvml.nvmlGpmMigSampleGet

    def get(sample: Any) -> Any:
        return fn(parent, gpu_instance_id, sample)

    return get


class GpmSampler:
    """The ping-pong pair of samples of one GPU (or GPU instance) and a reusable metrics request."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        sample_get: SampleGet | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.handle = handle
        self._clock = clock_ns
        if sample_get is None:
            device_get = nvml.nvmlGpmSampleGet

            def sample_get(sample: Any) -> Any:
                return device_get(handle, sample)

        self._get = sample_get
        self._metrics_get = nvml.nvmlGpmMetricsGet
        self._free = nvml.nvmlGpmSampleFree
        self._samples: list[Any] = []
        try:
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            self._get(self._samples[0])  # proves sampling works here (e.g. not a MIG parent)
        except BaseException:
            self.close()  # the probe failed: the buffers are not leaked
            raise
        self._cur = 0
        self._have_prev = False
        self._last_ns = 0
        self._mg = nvml.c_nvmlGpmMetricsGet_t()  # ~25 kB struct: built once, reused every cycle
        self._mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        offset = nvml.c_nvmlGpmMetricsGet_t.metrics.offset
        self._fast = ctypes.sizeof(nvml.c_nvmlGpmMetric_t) == _METRIC.size
        self._metrics_addr = ctypes.addressof(self._mg) + offset
        self.metrics: list[tuple[int, str, float]] = []
        self._set_metrics(list(METRICS))
        #: fields dropped since the last look (NotSupported per metric)
        self.dropped: list[str] = []

    def _set_metrics(self, metrics: list[tuple[int, str, float]]) -> None:
        self.metrics = metrics
        self._mg.numMetrics = len(metrics)
        for i, (mid, _, _) in enumerate(metrics):
            self._mg.metrics[i].metricId = mid

    def restart(self) -> None:
        """Forget the previous sample (after a gap the next cycle must not span it)."""
        self._have_prev = False

    def sample(self, out: dict[str, Any]) -> int:
        """Take this cycle's sample and write the metrics; returns how many metrics failed.

        Spacing is judged on the sampler's clock at the moment of sampling, not on the cycle's
        grid time: at a 0.1 s interval two cycles can be a little less than 100 ms apart."""
        now_ns = self._clock()
        if self._have_prev and now_ns - self._last_ns < SPACING_NS:
            return 0
        cur = self._samples[self._cur]
        self._get(cur)
        self._last_ns = now_ns
        if not self._have_prev:
            self._have_prev = True
            self._cur ^= 1
            return 0
        mg = self._mg
        mg.sample1 = self._samples[self._cur ^ 1]
        mg.sample2 = cur
        self._cur ^= 1
        self._metrics_get(mg)
        failed = 0
        drop = None
        for i, ((_, name, scale), (ret, value)) in enumerate(zip(self.metrics, self._results(), strict=True)):
            if ret == 0:
                out[name] = value * scale
            else:
                failed += 1
                if ret == E.NOT_SUPPORTED:
                    drop = (drop or []) + [i]
        if drop:
            self.dropped += [self.metrics[i][1] for i in drop]
            self._set_metrics([m for i, m in enumerate(self.metrics) if i not in drop])
        return failed

    def _results(self) -> Any:
        """(nvmlReturn, value) per requested metric."""
        n = len(self.metrics)
        if self._fast:
            return (
                (ret, v) for _, ret, v in _METRIC.iter_unpack(ctypes.string_at(self._metrics_addr, n * _METRIC.size))
            )
        values = self._mg.metrics
        return ((values[i].nvmlReturn, values[i].value) for i in range(n))

    def close(self) -> None:
        for s in self._samples:
            try:
                self._free(s)
            except Exception:
                pass
        self._samples = []
