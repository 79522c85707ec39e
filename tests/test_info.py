"""`lampo info`: model summary, parameter counts and memory plan for presets, configs, checkpoints."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from lampo.info import describe, main
from lampo.models.presets import CONFIG_DIR, get_preset


def test_35b_a3b_preset():
    text = describe("qwen3.6-35b-a3b")
    for expected in ("qwen3_5_moe", "40 (30 Gated DeltaNet + 10 full attention)", "256 experts, top-8",
                     "248,320 rows", "34,660,610,688", "844,640,768", "2,946,429,568 (2.95 B)",
                     "262,144 tokens", "2.58 GiB", "60.0 MiB", "64.56 GiB", "20.18 GiB", "~5 bpw"):
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
    assert "GPU memory plan at 32,768 tokens" in describe(tmp_path)


def test_main(capsys):
    assert main(["tiny-moe", "--context", "8192"]) == 0
    assert "8 experts, top-2" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys):
    for argv in (["no-such-model"], ["tiny-moe", "--context", "0"], ["tiny-moe", "--context", "9999999"],
                 [str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("lampo info: ") and "\n" not in err
