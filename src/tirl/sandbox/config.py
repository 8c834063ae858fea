"""The `sandbox:` config section: where snippets run (in-process warm pool or remote servers) and their limits."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Literal

from tirl.core.bounds import MAX_COUNT, MAX_PROCESSES, MAX_RETRIES, MAX_STEPS, check_counts

Isolation = Literal["bwrap", "unshare", "none"]
# Strongest first: a config asking for one of these never silently gets a later one.
ISOLATION_ORDER: tuple[str, ...] = ("bwrap", "unshare", "none")
MAX_TIMEOUT_S = 86400.0  # a day: longer per-run timeouts are surely a unit mistake
MAX_MEMORY_MB = 2**20  # 1 TiB: the worker's wire header carries the limit in MB in 32 bits


@dataclass
class SandboxConfig:
    """Limits of one run plus how runs are executed. Memory is what a snippet may add to the warm interpreter."""

    backend: Literal["local", "remote"] = "local"  # local: warm pool in this process; remote: `urls`
    isolation: Isolation = "bwrap"  # local backend; "none" needs the explicit opt-in and warns loudly
    cgroups: Literal["auto", "required", "off"] = "auto"  # per-worker pids/memory cgroups where writable
    timeout_s: float = 5.0
    cpu_time_s: int = (
        0  # RLIMIT_CPU per process; 0 = the run's own timeout + 1 s (SandboxFusion bounds CPU so)
    )
    memory_mb: int = 1024
    # `tirl sandbox serve`: the most a request's `run_timeout` / `memory_limit_MB` may ask for (timeout_s and
    # memory_mb are what a request without them gets); the server's workers are sized for max_memory_mb
    max_timeout_s: float = 120.0
    max_memory_mb: int = 4096
    max_output_bytes: int = 2**20  # per stream: SandboxFusion returns up to 1 MiB of each
    seccomp: bool = True  # the syscall filter (seccomp.py) on every snippet; needs libseccomp + pyseccomp
    max_file_bytes: int = 16 * 2**20
    # `fetch_files`: the most bytes one run's reply carries (each listed path counted, spellings of one file too);
    # paths beyond it are left out and named in the result's `files_skipped`
    max_fetch_bytes: int = 32 * 2**20
    max_processes: int = 64  # per run (RLIMIT_NPROC for the snippet's uid; pids cgroup per worker)
    max_workers: int = 0  # warm workers per tier (local) or concurrent requests (remote); 0 = CPU count, 32
    max_runs_per_worker: int = 1000  # a worker is replaced after this many runs (and after any kill)
    max_queue: int = 1024  # runs waiting for a worker beyond this raise SandboxOverloaded (HTTP 429)
    python: str = ""  # interpreter; "" = the one running tirl
    import_site: bool = True  # False passes -S: faster start, but no site-packages (no numpy, sympy)
    # Two tiers of warm workers (see routing.py): every worker imports `preload` once, free for snippets; the heavy
    # tier also imports `preload_heavy` and runs the snippets that import one of those (forking a larger
    # interpreter costs ~5x more, so the rest go to the light tier). Empty `preload_heavy` = one tier only.
    preload: tuple[str, ...] = ("math",)
    preload_heavy: tuple[str, ...] = ("numpy", "sympy")
    urls: tuple[str, ...] = ()  # remote backend: tirl or SandboxFusion servers, used round-robin
    request_timeout_s: float = 30.0  # remote: HTTP timeout on top of the run's own timeout
    retries: int = 3  # remote: retries with exponential back-off on timeouts, 5xx and 429
    # remote: a file holding the servers' bearer token ("" = $TIRL_SANDBOX_TOKEN when set, else none)
    auth_token_file: str = ""

    def __post_init__(self) -> None:
        self._check_limits()
        self._check_pool()
        self._check_remote()
        check_counts(self, "sandbox", {  # the rest are bounded in _check_limits
            "cpu_time_s": (0, int(MAX_TIMEOUT_S)), "max_output_bytes": (1, 2**30), "max_file_bytes": (0, 2**36),
            "max_processes": (1, MAX_COUNT), "max_workers": (0, MAX_PROCESSES), "max_runs_per_worker": (1, MAX_STEPS),
            "max_queue": (0, MAX_COUNT), "retries": (0, MAX_RETRIES),
        })  # fmt: skip

    def _check_limits(self) -> None:
        """A run's limits, and the ceilings a server's request may ask for."""
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.cpu_time_s < 0:
            raise ValueError(
                f"cpu_time_s must be >= 0 (0 = the run's timeout; rlimits count whole seconds), got {self.cpu_time_s}"
            )
        if self.memory_mb < 32:
            raise ValueError(
                f"memory_mb must be >= 32 (the interpreter alone needs ~20 MB), got {self.memory_mb}"
            )
        for key, most in (("timeout_s", MAX_TIMEOUT_S), ("max_timeout_s", MAX_TIMEOUT_S)):
            if not getattr(self, key) <= most:  # a unit mistake; beyond, every run would fail with a 500
                raise ValueError(f"{key} must be <= {most:.0f} (a day), got {getattr(self, key)}")
        for key in ("memory_mb", "max_memory_mb"):
            if not 32 <= getattr(self, key) <= MAX_MEMORY_MB:  # the worker protocol carries 32 bits of MB
                raise ValueError(f"{key} must be 32-{MAX_MEMORY_MB} (1 TiB), got {getattr(self, key)}")
        if self.max_timeout_s < self.timeout_s:
            raise ValueError(
                f"max_timeout_s ({self.max_timeout_s:g}) is below timeout_s ({self.timeout_s:g}): the ceiling a "
                "request may ask for must be at least the default; raise sandbox.max_timeout_s"
            )
        if self.max_memory_mb < self.memory_mb:
            raise ValueError(
                f"max_memory_mb ({self.max_memory_mb}) is below memory_mb ({self.memory_mb}): the ceiling a "
                "request may ask for must be at least the default; raise sandbox.max_memory_mb"
            )
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")
        if self.max_file_bytes < 0:
            raise ValueError(f"max_file_bytes must be >= 0, got {self.max_file_bytes}")
        if not 0 <= self.max_fetch_bytes <= 2**30:  # the reply is held in memory (base64: 4/3 of it) and sent
            raise ValueError(f"max_fetch_bytes must be 0-{2**30} (1 GiB), got {self.max_fetch_bytes}")
        if self.max_processes < 1:
            raise ValueError(f"max_processes must be >= 1, got {self.max_processes}")

    def _check_pool(self) -> None:
        """The warm pool: workers, queue, preloads, interpreter and isolation."""
        if self.max_workers < 0:
            raise ValueError(f"max_workers must be >= 0 (0 = automatic), got {self.max_workers}")
        if self.max_runs_per_worker < 1:
            raise ValueError(f"max_runs_per_worker must be >= 1, got {self.max_runs_per_worker}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        for key in ("preload", "preload_heavy"):
            for name in getattr(self, key):
                if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
                    raise ValueError(f"{key}: {name!r} is not a module name")
        both = sorted(set(self.preload) & set(self.preload_heavy))
        if both:
            raise ValueError(f"{both} in both preload and preload_heavy; list each module once")
        if self.python and shutil.which(self.python) is None:
            raise ValueError(f"python interpreter {self.python!r} not found or not executable")
        if self.isolation not in ISOLATION_ORDER:
            raise ValueError(f"isolation must be one of {list(ISOLATION_ORDER)}, got {self.isolation!r}")

    def _check_remote(self) -> None:
        """The remote backend: its servers and how requests to them are retried."""
        if self.backend == "remote" and not self.urls:
            raise ValueError("backend 'remote' needs sandbox.urls (one or more http://host:port)")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"sandbox.urls: {url!r} is not an http(s) URL")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
