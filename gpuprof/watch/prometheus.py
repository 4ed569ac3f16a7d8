"""`gpuprof watch --prometheus PORT`: the current window's figures as Prometheus metrics, served by
prometheus_client on 127.0.0.1 unless `--prometheus-addr` names another address.

Figures only: no command line, environment, path or host name is ever a metric or a label (a
metrics port on a shared cluster is readable by anyone who can reach it). The registry is our
own, so prometheus_client's default process and platform collectors are not served either. The
only labels are phase names and NVML throttle reason names, both fixed vocabularies.
"""

from __future__ import annotations

from gpuprof.errors import GpuprofError
from gpuprof.measure.nvml import THROTTLE_REASONS
from gpuprof.stats import PHASES

PREFIX = "gpuprof_watch_"
# (name, help, where in a window event): one gauge per figure a window carries
GAUGES = (
    ("window", "Number of the last closed window", ("window",)),
    ("last_step", "Index of the last step of the last closed window", ("steps", 1)),
    ("window_steps", "Steps in the last closed window", ("n_steps",)),
    ("step_seconds", "Typical step of the last window (mean of its regular steps), seconds", ("step_s",)),
    ("step_median_seconds", "Median step of the last window, seconds", ("median_s",)),
    ("step_p90_seconds", "90th percentile step of the last window, seconds", ("p90_s",)),
    ("tokens_per_second", "Tokens per second at the last window's typical step", ("tokens_per_s",)),
    ("mfu_ratio", "Model FLOPs utilisation of the last window (0-1); NaN when not measured", ("mfu",)),
    ("own_cpu_cores", "CPU cores this run used over the last window", ("host", "own_cpu_cores")),
    ("others_cpu_cores", "CPU cores other processes used over the last window", ("host", "others_cpu_cores")),
    ("read_bytes_per_second", "Bytes per second this process read from storage over the last window",
     ("host", "read_bytes_s")),
    ("rss_bytes", "Resident memory of this process at the end of the last window", ("host", "rss_bytes")),
    ("gpu_util_percent", "NVML GPU utilisation, mean over the last window", ("nvml", "gpu_util_pct")),
    ("gpu_sm_clock_mhz", "NVML SM clock, mean over the last window", ("nvml", "sm_clock_mhz")),
    ("gpu_temperature_celsius", "NVML GPU temperature, highest in the last window", ("nvml", "temp_c")),
    ("gpu_memory_used_bytes", "NVML GPU memory used, highest in the last window", ("nvml", "mem_used_bytes")),
    ("gpu_power_watts", "NVML power draw, mean over the last window", ("nvml", "power_w")),
)


def _get(event: dict, path: tuple):
    x = event
    for k in path:
        if isinstance(x, dict):
            x = x.get(k)
        elif isinstance(x, list) and isinstance(k, int) and -len(x) <= k < len(x):
            x = x[k]
        else:
            return None
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class Exporter:
    """The metrics server. `start()` binds (a port in use is a one-line GpuprofError, before the
    run); `update(window_event)`, `changed()`, `stop()`."""

    def __init__(self, port: int, addr: str = "127.0.0.1"):
        if not 0 < port < 65536:
            raise GpuprofError(f"--prometheus {port}: a port is 1-65535")
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise GpuprofError("--prometheus needs prometheus_client (pip install prometheus_client)") from None
        self.port, self.addr = port, addr
        self._server = self._thread = None
        self._build()

    def _build(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges = {name: Gauge(PREFIX + name, help_, registry=self.registry) for name, help_, _ in GAUGES}
        self._share = Gauge(PREFIX + "phase_share", "Share of the last window's typical step in each phase (0-1)",
                            ["phase"], registry=self.registry)
        self._seconds = Gauge(PREFIX + "phase_seconds", "Seconds of the last window's typical step in each phase",
                              ["phase"], registry=self.registry)
        self._throttle = Gauge(PREFIX + "gpu_throttle_share",
                               "Share of the last window's NVML samples with each clock-event reason set",
                               ["reason"], registry=self.registry)
        self._changes = Counter(PREFIX + "changes", "Changes of the typical step detected so far",
                                registry=self.registry)
        # torchrun: the rank last named as fallen behind, by a change of this rank's (NaN: none yet)
        self._behind = Gauge(PREFIX + "straggler_rank", "The rank last named as having fallen behind "
                             "(a change of this rank's matched live with the other ranks'); NaN until one is",
                             registry=self.registry)
        self._behind.set(float("nan"))

    def start(self) -> None:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.port, addr=self.addr, registry=self.registry)
        except OSError as exc:
            words = exc.strerror or str(exc)
            raise GpuprofError(f"--prometheus {self.port}: cannot listen on {self.addr}:{self.port} ({words})") from None

    def update(self, event: dict) -> None:
        """The gauges of a closed window (a figure the window lacks is removed, not left stale)."""
        for name, _, path in GAUGES:
            g, v = self._gauges[name], _get(event, path)
            if v is None:
                g.set(float("nan"))
            else:
                g.set(float(v))
        phases = event.get("phases") or {}
        for p in PHASES:
            if p in phases:
                self._share.labels(phase=p).set(phases[p]["share"])
                self._seconds.labels(phase=p).set(phases[p]["seconds"])
        shares = (event.get("nvml") or {}).get("throttle_share") or {}
        for r in THROTTLE_REASONS.values():
            if r in shares:
                self._throttle.labels(reason=r).set(shares[r])

    def changed(self) -> None:
        self._changes.inc()

    def straggler(self, rank: int) -> None:
        self._behind.set(float(rank))

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def check_ports(first: int, count: int, addr: str) -> None:
    """One line and exit 2 (GpuprofError) unless ports first..first+count-1 can be listened on at
    `addr` now (a data-parallel watch: one per local rank)."""
    import socket

    if not (0 < first and first + count - 1 <= 65535):
        raise GpuprofError(f"--prometheus {first}: ports {first}-{first + count - 1} are not all port numbers")
    for port in range(first, first + count):
        try:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr, port))
        except OSError as exc:
            raise GpuprofError(f"--prometheus {first}: local rank {port - first} needs port {port}, and "
                               f"{addr}:{port} cannot be listened on ({exc.strerror or exc})") from None
