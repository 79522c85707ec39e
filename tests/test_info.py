"""`lampo info`: model summary, parameter counts and memory plan for presets, configs, checkpoints."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lampo.info import describe, main
from lampo.models.presets import CONFIG_DIR, get_preset


def test_35b_a3b_preset():
    text = describe("qwen3.6-35b-a3b")
    for expected in ("qwen3_5_moe", "40 (30 Gated DeltaNet + 10 full attention)", "256 experts, top-8",
                     "248,320 rows", "34,660,610,688", "844,640,768", "2,946,429,568 (2.95 B)",
                     "262,144 tokens", "2.58 GiB", "60.0 MiB", "64.56 GiB", "20.07 GiB", "17.28 GiB"):
        assert expected in text, expected


def test_27b_config_file():
    text = describe(CONFIG_DIR / "qwen3.6-27b.json", context_max=131_072)
    for expected in ("dense SwiGLU, width 17,408", "64 (48 Gated DeltaNet + 16 full attention)",
                     "26,895,998,464", "424,699,392", "25.62 B", "131,072 tokens", "4.12 GiB", "144 MiB"):
        assert expected in text, expected


def test_checkpoint_directory(tiny_dense_dir: Path):
    text = describe(tiny_dense_dir, context_max=4096)
    assert "71 tensors in 1 file" in text and "with MTP" in text and "0 tensors ignored" in text
    assert "4,096 tokens" in text


def test_the_plan_defaults_to_the_models_context(tmp_path: Path):
    cfg = replace(get_preset("tiny-dense"), max_position_embeddings=32_768)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert "GPU memory plan of `lampo chat` at 32,768 tokens" in describe(tmp_path)


def test_main(capsys):
    assert main(["tiny-moe", "--context", "8192"]) == 0
    assert "8 experts, top-2" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys):
    for argv in (["no-such-model"], ["tiny-moe", "--context", "0"], ["tiny-moe", "--context", "9999999"],
                 [str(tmp_path)], *(["tiny-moe", "--vram", v] for v in ("0", "-1", "0.5", "nan", "inf", "24GiB", ""))):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("lampo info: ") and "\n" not in err


def test_the_plan_has_a_column_per_weight_format():
    table = describe("qwen3.6-35b-a3b").split("GPU memory plan")[1].splitlines()
    assert table[1].split() == ["bf16", "q5", "q4"]
    assert table[-1].split() == ["total", "70.06", "GiB", "24.51", "GiB", "21.63", "GiB"]


def _advice(model: str, vram: float) -> list[str]:
    return describe(model, vram=vram).split("\n\n")[-1].splitlines()


@pytest.mark.parametrize("model,vram,lines", [
    ("qwen3.6-35b-a3b", 24, ["A card of 24 GiB (23.50 GiB for Lampo, 0.50 GiB kept for the driver and display):",
                             "  bf16  does not fit: needs 67.24 GiB even at 1,024 tokens",
                             "  q5    fits up to 167,936 tokens; 262,144 would need 24.51 GiB",
                             "  q4    fits at 262,144 tokens: 21.63 GiB of 23.50 GiB",
                             "recommended: q4, the best format that fits at 262,144 tokens"]),
    ("qwen3.6-35b-a3b", 32, ["recommended: q5, the best format that fits at 262,144 tokens"]),
    ("qwen3.6-27b", 32, ["  q5    fits at 262,144 tokens: 26.20 GiB of 31.50 GiB",
                         "recommended: q5, the best format that fits at 262,144 tokens"]),
    ("qwen3.6-35b-a3b", 80, ["  bf16  fits at 262,144 tokens: 70.06 GiB of 79.50 GiB",
                             "recommended: bf16, the best format that fits at 262,144 tokens"]),
    ("qwen3.6-27b", 20, ["  q5    fits up to 61,440 tokens; 262,144 would need 26.20 GiB",
                         "  q4    fits up to 116,736 tokens; 262,144 would need 24.35 GiB",
                         "recommended: q4 with --context 116736 (no format fits at 262,144 tokens; "
                         "q4 allows the longest context)"]),
    ("qwen3.6-27b", 8, ["  q4    does not fit: needs 15.62 GiB even at 1,024 tokens",
                        "recommended: none: no weight format fits in 7.50 GiB, even at 1,024 tokens"]),
])
def test_vram_advice(model, vram, lines):
    advice = _advice(model, vram)
    assert len(advice) == 5
    for line in lines:
        assert line in advice, line


def test_vram_with_a_context(capsys):
    assert main(["qwen3.6-27b", "--vram", "24", "--context", "65536"]) == 0
    advice = capsys.readouterr().out.split("\n\n")[-1].splitlines()
    assert advice[1:] == ["  bf16  does not fit: needs 52.64 GiB even at 1,024 tokens",
                          "  q5    fits at 65,536 tokens: 19.63 GiB of 23.50 GiB",
                          "  q4    fits at 65,536 tokens: 17.78 GiB of 23.50 GiB",
                          "recommended: q5, the best format that fits at 65,536 tokens"]


def test_a_reader_that_stops_early_ends_the_report_quietly():
    import subprocess
    import sys

    code = ("import sys; from lampo.cli import main; "
            "sys.stdout = open(sys.stdout.fileno(), 'w', buffering=1, closefd=False); "
            "sys.exit(main(['info', 'qwen3.6-35b-a3b']))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in (0, 141) and "Traceback" not in err, err
