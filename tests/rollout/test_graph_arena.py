"""The shapes and buffers of the static decode (`tirl.rollout.engines.torch.graph_arena`): buckets, capacities within 25% of
the need with four per doubling, the budget by device, and views of one flat buffer for any bucket x capacity
that fits."""

from __future__ import annotations

from collections import defaultdict

import torch

from tirl.rollout.engines.torch.graph_arena import GIB, MIN_COLUMNS, Arena, bucket, budget_bytes, columns
from tirl.rollout.engines.torch.kv_cache import InPlaceCache


def test_buckets_are_powers_of_two_up_to_the_cap():
    assert [bucket(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [bucket(n, 6) for n in (4, 5, 6)] == [4, 6, 6]


def test_capacities_waste_under_a_quarter_with_four_per_doubling():
    assert [columns(n) for n in (1, MIN_COLUMNS, 129, 257, 1000, 1100, 2049, 4096)] == [
        128, 128, 160, 320, 1024, 1280, 2560, 4096
    ]  # fmt: skip
    per_octave = defaultdict(set)
    for n in range(1, 9000):
        c = columns(n)
        assert n <= c and (c == MIN_COLUMNS or c < 1.25 * n), (n, c)
        per_octave[(n - 1).bit_length()].add(c)
    assert max(len(cs) for cs in per_octave.values()) == 4


def test_the_budget_is_the_key_or_a_cpu_gib():
    assert budget_bytes(0.5, torch.device("cpu")) == GIB // 2
    assert budget_bytes(0.0, torch.device("cpu")) == GIB


def test_views_of_one_buffer_hold_fewer_longer_rows_and_keep_row_order():
    cache = InPlaceCache(8)
    k, v = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)  # (rows, heads, positions, head size)
    cache.update(k, v, 0)
    slot = 2 * 2 * 4 * 2 + 1  # keys and values of one layer in bf16, one mask byte
    a = Arena.allocate(cache, torch.bfloat16, budget=64 * slot, rows=8, max_cols=1024, vocab=10)
    assert a.slots == 64 and a.keys[0].dtype == a.values[0].dtype == torch.bfloat16
    (k8, _), (k2, _) = a.kv(8, 8)[0], a.kv(2, 32)[0]
    assert k8.shape == (8, 2, 8, 4) and k2.shape == (2, 2, 32, 4)
    assert a.keys[0].data_ptr() == k8.data_ptr() == k2.data_ptr()
    (k4, _) = a.kv(4, 8)[0]
    k8[3].fill_(1.0)
    assert torch.equal(k4[3], k8[3])  # a smaller bucket of the same capacity starts with the same rows
