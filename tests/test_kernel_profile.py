"""tests/gpu/kernel_profile.py's summary of Nsight Compute's raw CSV (the GPU side runs on the device)."""

from __future__ import annotations

import pytest

CSV = """==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","launch__grid_size","launch__block_size","launch__registers_per_thread"
"","","nsecond","byte","byte","","","register/thread"
"0","void (anonymous namespace)::gemv_kernel<1, __nv_bfloat16>(const bf16 *)","17,184","50,615,296","27,904","772","256","72"
"1","void (anonymous namespace)::gemv_kernel<1, __nv_bfloat16>(const bf16 *)","9,440","16,802,048","0","512","256","72"
"2","rmsnorm_kernel(float *)","4,000","23,808","0","1","256","32"
==PROF== Disconnected
"""


@pytest.fixture(scope="module")
def mod(gpu_script):
    return gpu_script("kernel_profile")


def test_table_groups_kernels_and_converts_units(mod, tmp_path):
    path = tmp_path / "ncu.csv"
    path.write_text(CSV, encoding="utf-8")
    text = mod.table(str(path), graph_ms=0.05)
    lines = text.splitlines()
    assert lines[0].startswith("3 kernels, isolated time 0.031 ms, DRAM 0.067 GB")
    assert "isolated kernels sum to 61.2% of it" in lines[1]
    gemv = next(line for line in lines if "gemv_kernel" in line)
    fields = gemv.split()
    assert fields[:5] == ["gemv_kernel", "2", "26.6", "13.31", "33.72"]  # launches, us total, us each, MB each
    assert lines.index(gemv) < next(i for i, line in enumerate(lines) if "rmsnorm_kernel" in line)


def test_metrics_argument_lists_what_the_table_reads(mod, capsys):
    assert mod.main(["metrics"]) == 0
    printed = capsys.readouterr().out.strip().split(",")
    assert {mod.TIME, mod.READ, mod.WRITE, "launch__grid_size"} <= set(printed)
