"""`model.autocast: auto`: bf16 only where it pays: the device multiplies bf16 natively (the CPU's flags) and, on a
CPU, the model is wide enough."""

import pytest
import torch

from tirl.models import precision
from tirl.models.loading import ModelConfig


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, True),
        ({"amx_bf16", "amx_tile"}, True),
        ({"avx2", "fma"}, False),
        (set(), False),
    ],
)
def test_auto_follows_the_cpu_flags(monkeypatch, flags, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    assert precision.native_bf16("cpu") is native
    assert ModelConfig(autocast="auto").autocast_dtype(576) == (torch.bfloat16 if native else None)
    assert ModelConfig(autocast="auto").autocast_dtype(192) is None  # too narrow to pay on a CPU
    assert ModelConfig(autocast="auto", dtype="bfloat16").autocast_dtype(576) is None  # weights already bf16
    assert ModelConfig(autocast="none").autocast_dtype(576) is None
    assert ModelConfig(autocast="bfloat16").autocast_dtype(64) == torch.bfloat16  # as asked, at any width


def test_cpu_flags_are_read_from_cpuinfo():
    flags = precision.cpu_flags()
    assert isinstance(flags, frozenset)
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert ("avx2" in text) == ("avx2" in flags)


def test_bfloat16_still_needs_float32_weights():
    with pytest.raises(ValueError, match="needs model.dtype=float32"):
        ModelConfig(autocast="bfloat16", dtype="bfloat16")


def test_cpu_description_names_the_cpu_and_only_the_flags_that_decide_precision(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"fma", "avx2", "avx512_bf16", "sse4_2"}))
    d = precision.cpu_description()
    assert (
        d["flags"] == ["avx2", "avx512_bf16"] and d["cores"] >= 1 and isinstance(d["cpu"], str) and d["cpu"]
    )
    assert d["vendor"] == precision.cpu_vendor() and isinstance(d["vendor"], str)
