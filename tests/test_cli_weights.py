"""`--weights` and `--vram-limit` on the command line: the sizes a user types, the formats there
are, and what the reference engine (which runs checkpoints as stored) says about them."""

from __future__ import annotations

import argparse

import pytest

from lampo import bench
from lampo.cli import build_parser, vram_bytes

GIB = 1 << 30


@pytest.mark.parametrize("text, want", [("24GiB", 24 * GIB), ("24G", 24 * GIB), ("23.5", int(23.5 * GIB)),
                                        ("24GB", 24 * 10**9), ("800MiB", 800 << 20), (" 31 gib ", 31 * GIB)])
def test_vram_sizes(text, want):
    assert vram_bytes(text) == want


@pytest.mark.parametrize("text", ["", "0", "-4GiB", "24TiB", "lots", "GiB"])
def test_bad_vram_sizes_say_what_is_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="a size such as 24GiB"):
        vram_bytes(text)


def test_chat_takes_a_weight_format_and_a_limit():
    args = build_parser().parse_args(["chat", "--weights", "q4", "--vram-limit", "23GiB"])
    assert (args.weights, args.vram_limit) == ("q4", 23 * GIB)
    assert build_parser().parse_args(["chat"]).weights == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["chat", "--weights", "q3"])


def test_the_reference_bench_notes_that_the_format_applies_to_cuda(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert bench.main(["--preset", "tiny-dense", "--random-weights", "--backend", "reference", "--weights", "q5",
                       "--prompt", "8", "--depths", "0", "--decode-tokens", "2", "--json", str(out)]) == 0
    assert "--weights and --vram-limit apply to the CUDA engine" in capsys.readouterr().out
