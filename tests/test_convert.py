"""`lampo convert`: every quantized tensor is exactly quantize + pack of its source, bf16 tensors
are copied byte for byte, the format file describes both; the output appears whole or not at all;
refusals are one line; the command line end to end with bounded memory, then `lampo chat` and
`lampo info` on its output."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import seed_lampo_home, tokenizer_json

from lampo.cli import main
from lampo.convert import ProgressLine
from lampo.models.checkpoint import INDEX_NAME, Checkpoint, CheckpointError
from lampo.models.presets import get_preset
from lampo.models.quant import convert as convert_module
from lampo.models.quant.checkpoint_format import FORMAT_FILE, read_format
from lampo.models.quant.convert import ConvertError, Progress, convert
from lampo.models.quant.layout import packed_bytes, values
from lampo.models.quant.quantizer import quantize
from lampo.models.quant.recipes import BF16, get_recipe, tensor_bits
from lampo.models.synthetic import write_checkpoint

# The tiny presets with a 512-row vocabulary: a conversion takes well under a second.
MICRO = replace(get_preset("tiny-dense"), vocab_size=512, name="micro-dense")
MICRO_MOE = replace(get_preset("tiny-moe"), vocab_size=512, name="micro-moe")
GATE_UP = "model.language_model.layers.0.mlp.experts.gate_up_proj"
PEAK_RSS_MIB = 512  # converting the tiny-moe's 31.8M-weight embedding whole would take over 1 GiB


@pytest.fixture(scope="module")
def micro_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("micro")
    return {cfg.name: write_checkpoint(root / cfg.name, cfg, seed=1) for cfg in (MICRO, MICRO_MOE)}


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


def _expected(w: np.ndarray, bits: int) -> np.ndarray:
    """What a tensor at `bits` must dequantize to: values(quantize(matrix)) of each matrix."""
    n, k = w.shape[-2:]
    return np.stack([values(*quantize(m, bits), bits) for m in w.reshape(-1, n, k)]).reshape(w.shape)


@pytest.mark.parametrize("cfg,recipe", [(MICRO_MOE, "q5"), (MICRO, "q4")])
def test_round_trip(micro_dirs, tmp_path, cfg, recipe):
    fmt = convert(micro_dirs[cfg.name], tmp_path / "out", recipe)
    src, out = Checkpoint.open(micro_dirs[cfg.name]), Checkpoint.open(tmp_path / "out")
    bits = tensor_bits(get_recipe(recipe), cfg)
    assert out.names() == src.names() and out.lq == fmt and out.config == src.config
    for name in src.names():
        shape = src.spec(name).shape
        assert fmt.tensors[name].bits == bits[name] and fmt.tensors[name].shape == shape
        if bits[name] == BF16:
            assert out.quantized(name) is None and out.spec(name) == src.spec(name)
            assert out.raw(name).tobytes() == src.raw(name).tobytes()
        else:
            assert out.spec(name).dtype == "U8"
            assert out.spec(name).shape == (*shape[:-2], packed_bytes(*shape[-2:], bits[name]))
            np.testing.assert_array_equal(out.tensor_f32(name), _expected(src.tensor_f32(name), bits[name]))
    quantized = [n for n in src.names() if bits[n] != BF16]
    assert "model.language_model.embed_tokens.weight" in quantized and "lm_head.weight" in quantized
    assert (GATE_UP in quantized) == cfg.is_moe and len(quantized) < len(src.names())


def test_format_file_and_side_files(micro_dirs, tmp_path):
    src_dir = Path(shutil.copytree(micro_dirs[MICRO.name], tmp_path / "src"))
    (src_dir / "tokenizer_config.json").write_text("{}")
    convert(src_dir, tmp_path / "out", "q5")
    out = tmp_path / "out"
    assert (out / "tokenizer_config.json").read_text() == "{}"
    assert (out / "config.json").read_bytes() == (src_dir / "config.json").read_bytes()
    doc = json.loads((out / FORMAT_FILE).read_text())
    src = Checkpoint.open(src_dir)
    digest = hashlib.sha256(b"".join(src.raw(n).tobytes() for n in src.names())).hexdigest()
    assert (doc["format"], doc["version"], doc["recipe"]) == ("lampo-lq", 1, "q5")
    assert doc["source"] == {"sha256": digest, "files": ["model.safetensors"]}
    assert list(doc["tensors"]) == src.names()
    assert doc["tensors"]["lm_head.weight"] == {"bits": 6, "shape": [512, 128]}
    assert doc["tensors"]["model.language_model.layers.0.linear_attn.in_proj_a.weight"] == {"bits": "bf16", "shape": [2, 128]}


def test_small_shards_hold_the_same_bytes(micro_dirs, tmp_path):
    convert(micro_dirs[MICRO_MOE.name], tmp_path / "one", "q4")
    convert(micro_dirs[MICRO_MOE.name], tmp_path / "many", "q4", shard_bytes=200_000)
    one, many = Checkpoint.open(tmp_path / "one"), Checkpoint.open(tmp_path / "many")
    assert len(many.shards()) > 3 and (tmp_path / "many" / INDEX_NAME).is_file()
    for name in one.names():
        assert one.raw(name).tobytes() == many.raw(name).tobytes()


@pytest.mark.parametrize("fault", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_a_failure_midway_leaves_nothing(micro_dirs, tmp_path, monkeypatch, fault):
    calls = []

    def failing(w, bits):
        calls.append(1)
        if len(calls) == 5:
            raise fault
        return quantize(w, bits)

    monkeypatch.setattr(convert_module, "quantize", failing)
    out = tmp_path / "out"
    with pytest.raises(type(fault)):
        convert(micro_dirs[MICRO_MOE.name], out, "q5")
    assert len(calls) == 5 and _leftovers(out) == []


def test_refusals_are_one_line(micro_dirs, tmp_path):
    src = micro_dirs[MICRO.name]
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConvertError, match="already exists"):
        convert(src, tmp_path / "taken", "q5")
    with pytest.raises(ValueError, match="unknown recipe 'q3': the recipes are q5, q4"):
        convert(src, tmp_path / "out", "q3")
    with pytest.raises(CheckpointError, match="is not a directory"):
        convert(tmp_path / "nowhere", tmp_path / "out", "q5")
    convert(src, tmp_path / "once", "q4")
    with pytest.raises(ConvertError, match="already converted .recipe q4."):
        convert(tmp_path / "once", tmp_path / "twice", "q5")
    assert _leftovers(tmp_path / "out") == [] and _leftovers(tmp_path / "twice") == []


@pytest.mark.parametrize("out_name,argv_tail,expected", [
    ("out", ["--recipe", "q3"], "unknown recipe 'q3'"),
    ("taken", [], "already exists"),
])
def test_cli_errors(micro_dirs, tmp_path, capsys, out_name, argv_tail, expected):
    (tmp_path / "taken").mkdir()
    assert main(["convert", str(micro_dirs[MICRO.name]), str(tmp_path / out_name), *argv_tail]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lampo convert: ") and expected in err and err.count("\n") == 1


def test_cli_converts_with_a_final_line_off_a_terminal(micro_dirs, tmp_path, capsys):
    assert main(["convert", str(micro_dirs[MICRO_MOE.name]), str(tmp_path / "out"), "--recipe", "q4"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("\n") == 1
    assert f"{len(Checkpoint.open(tmp_path / 'out').names())}/" in err and f"wrote {tmp_path / 'out'} (q4)" in err


def test_the_quantizer_option_names_where_it_ran_and_cuda_without_a_gpu_is_one_line(micro_dirs, tmp_path, capsys,
                                                                                     monkeypatch):
    from lampo.engine import cuda

    def no_gpu():
        raise cuda.EngineUnavailable("no CUDA device is visible")

    monkeypatch.setattr(cuda, "load_native", no_gpu)
    src = str(micro_dirs[MICRO.name])
    assert main(["convert", src, str(tmp_path / "a"), "--quantizer", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == "lampo convert: no CUDA device is visible; --quantizer numpy quantizes on the CPU\n"
    assert not (tmp_path / "a").exists()
    for kind in ("auto", "numpy"):  # auto falls back to numpy where the engine cannot run
        assert main(["convert", src, str(tmp_path / kind), "--quantizer", kind]) == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.rstrip().endswith("(q5), quantized with numpy on the CPU")


def test_progress_line_redraws_in_place_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream, clock = Tty(), iter([0.0, 1.0, 1.05, 2.0, 3.0])
    monkeypatch.setattr("lampo.convert.time.monotonic", lambda: next(clock))
    bar = ProgressLine(stream)
    bar(Progress(1, 4, 1_000_000_000, 4_000_000_000))  # at 1 s: drawn
    bar(Progress(2, 4, 2_000_000_000, 4_000_000_000))  # 0.05 s later: not redrawn
    bar(Progress(3, 4, 3_000_000_000, 4_000_000_000))
    bar.finish("done")
    lines = stream.getvalue().split("\r")[1:]
    assert lines[0].startswith("1/4 tensors, 1.00/4.00 GB, 1000 MB/s") and "2/4" not in stream.getvalue()
    assert lines[1].startswith("3/4 tensors") and lines[2].endswith(": done\x1b[K\n")


# ---- end to end on the tiny-moe preset (the real vocabulary, with the tokenizer) ---------------
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child forked from a big pytest
# process would report the parent's size.
RUN_CONVERT = "import sys; from lampo.cli import main; rc = main(sys.argv[1:]); " \
              "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))); sys.exit(rc)"


@pytest.fixture(scope="module")
def tiny_converted(tmp_path_factory) -> tuple[Path, int]:
    """tiny-moe converted at q5 by `lampo convert` in a subprocess: (directory, peak RSS in KiB)."""
    root = tmp_path_factory.mktemp("tiny")
    src = write_checkpoint(root / "src", get_preset("tiny-moe"), seed=0, tokenizer=tokenizer_json())
    r = subprocess.run([sys.executable, "-c", RUN_CONVERT, "convert", str(src), str(root / "q5")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return root / "q5", int(r.stdout)


@pytest.mark.slow
def test_cli_end_to_end_in_bounded_memory(tiny_converted):
    out, peak_kib = tiny_converted
    assert peak_kib < PEAK_RSS_MIB * 1024
    assert read_format(out).recipe == "q5" and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "tokenizer.json", FORMAT_FILE, INDEX_NAME, "model-00001-of-00001.safetensors"])


@pytest.mark.slow
def test_chat_and_info_run_on_the_converted_directory(tiny_converted, tmp_path, capsys):
    out, _ = tiny_converted
    home = seed_lampo_home(tmp_path / "home")
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text("[sampling]\ntemperature = 0.0\nmax_tokens = 4\n")
    env = {**os.environ, "LAMPO_HOME": str(home), "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "lampo", "chat", "--model", str(out), "--backend", "reference",
                        "--no-think"], input="Say hi.", capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "4 tokens" in r.stderr
    assert main(["info", str(out)]) == 0
    assert "converted, LQ recipe q5" in capsys.readouterr().out
