"""tests/gpu/probe_expert_reads.py's access patterns (the reads themselves need an NVIDIA GPU)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def p(gpu_script):
    return gpu_script("probe_expert_reads")


def test_down_blocks_read_eight_rows_of_every_selected_expert(p):
    experts = np.array([5, 200, 17, 3, 99, 250, 0, 64, 128])
    starts, per_block, run_vecs = p.down_runs(experts, bank=0, tiled=False)
    row_bytes = p.I * p.BF16
    assert per_block == p.SLOTS and run_vecs * p.VEC == 8 * row_bytes
    block3 = starts.reshape(-1, per_block)[3] * p.VEC
    assert list((block3 - experts * p.H * row_bytes) // row_bytes) == [24] * p.SLOTS
    assert starts.size // per_block == p.H // 8  # one block per 8 output rows, as moe_down_gemv


def test_tiled_down_keeps_a_block_within_one_2_mib_stretch_and_reads_the_same_bytes(p):
    experts = np.arange(0, 256, 29)[: p.SLOTS]
    plain = p.down_runs(experts, bank=0, tiled=False)
    tiled = p.down_runs(experts, bank=0, tiled=True)
    assert plain[0].size * plain[2] == tiled[0].size * tiled[2]
    spans = np.ptp(tiled[0].reshape(-1, tiled[1]), axis=1) * p.VEC + tiled[2] * p.VEC
    assert spans.max() <= 2 << 20
    assert len(set(tiled[0].tolist())) == tiled[0].size  # no run read twice


def test_gate_up_blocks_read_a_gate_run_and_the_matching_up_run(p):
    experts = np.arange(p.SLOTS)
    starts, per_block, run_vecs = p.gate_up_runs(experts, bank=0)
    runs = starts.reshape(p.SLOTS, -1, per_block) * p.VEC
    assert runs.shape[1] == p.I // 16  # 16 row pairs per block: 288 blocks for 9 slots
    assert np.all(runs[:, :, 1] - runs[:, :, 0] == p.I * p.H * p.BF16)  # up rows start I rows later
    assert run_vecs * p.VEC == 16 * p.H * p.BF16
    layer_bytes = starts.size * run_vecs * p.VEC
    assert layer_bytes == p.SLOTS * 2 * p.I * p.H * p.BF16
