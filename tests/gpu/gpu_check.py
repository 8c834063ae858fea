"""`make gpu-check`: pytest over every test marked `gpu`, and a check that checked nothing fails.

Without a CUDA GPU every gpu test skips, and pytest exits 0 ("11 skipped"): a check that ran nothing would pass.
So with no CUDA device this says "no CUDA GPU: nothing was checked" and exits NOTHING_CHECKED (3) without running
pytest; with one, pytest runs in this process with a plugin that counts the outcomes, and a run where no test
passed and none failed (all skipped, or none collected) exits 3 as well. pytest's own failures (1) and usage
errors (2, 4) are returned as they are. Run from the repository root: `python tests/gpu/gpu_check.py [pytest args]`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

NOTHING_CHECKED = 3
PYTEST_ARGS = ("-q", "-m", "gpu", "tests", "-rs")
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED


class Outcomes:
    """A pytest plugin counting passed, failed and skipped tests."""

    def __init__(self) -> None:
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.passed += 1


def verdict(code: int, outcomes: Outcomes) -> tuple[int, str | None]:
    """The exit code of the check from pytest's and the counted outcomes, and why it checked nothing (or None)."""
    if code not in (0, NO_TESTS_COLLECTED) or outcomes.failed or outcomes.passed:
        return int(code), None
    return NOTHING_CHECKED, f"no test marked gpu ran ({outcomes.skipped} skipped): nothing was checked"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: Sequence[str] = (), run: Callable[..., int] | None = None) -> int:
    """The check's exit code; `run` is pytest.main (a test passes another)."""
    if not cuda_available():
        print("gpu-check: no CUDA GPU: nothing was checked (run it on a machine with one)", file=sys.stderr)
        return NOTHING_CHECKED
    if run is None:
        import pytest

        run = pytest.main
    outcomes = Outcomes()
    code, why = verdict(run([*PYTEST_ARGS, *argv], plugins=[outcomes]), outcomes)
    if why:
        print(f"gpu-check: {why}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
