"""Republish a bf16 checkpoint in the layout of Qwen's `*-FP8` releases, for tests and benchmarks of
Lampo's FP8 reading (no FP8 checkpoint can be downloaded here).

What the releases hold, and this writes:
- config.json with `quantization_config` {quant_method "fp8", fmt "e4m3", activation_scheme
  "dynamic", weight_block_size [128, 128], modules_to_not_convert [the matrices kept in bf16]};
- each projection matrix as F8_E4M3 codes plus `<name>_scale_inv` F32 block scales
  (`lampo.models.fp8.quantize_blocks`); the embedding, the LM head, the GDN `in_proj_a` /
  `in_proj_b`, the MoE router and shared-expert gate and the MTP `fc` stay bf16, as do the norms,
  the conv weights, `A_log` and `dt_bias`;
- the routed experts as each expert's own `gate_proj` / `up_proj` / `down_proj` matrices
  (`tensor_specs.expert_parts`), not the fused banks of the bf16 release;
- the other files of the source directory (tokenizer, chat template) copied.

Each tensor is read whole, so memory grows with the largest tensor: meant for tiny and cut-down
checkpoints. CLI: `python -m lampo.models.fp8_release SRC_DIR OUT_DIR [--shard-mb M] [--block B]`
(`--block 0`: bf16 weights, only the expert banks split into experts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lampo.models.bf16 import from_bf16, to_bf16
from lampo.models.checkpoint import INDEX_NAME, Checkpoint
from lampo.models.fp8 import FP8, dequantize_bf16, quantize_blocks, scale_name
from lampo.models.safetensors_io import build_header
from lampo.models.synthetic import plan_shards, shard_names, write_index
from lampo.models.tensor_specs import BF16, EMBED, F32, LM_HEAD, MATRIX_DTYPES, MTP_PREFIX, TensorSpec, expert_parts

BF16_MATRICES = (EMBED, LM_HEAD, MTP_PREFIX + "fc.weight")  # matrices the releases keep in bf16
BF16_LEAVES = ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight", "mlp.gate.weight",
               "mlp.shared_expert_gate.weight")


def is_fp8(name: str, spec: TensorSpec) -> bool:
    """Whether the releases store `name` (a tensor of the bf16 layout, or an expert's part) in FP8."""
    return (spec.allowed_dtypes == MATRIX_DTYPES and len(spec.shape) == 2 and name not in BF16_MATRICES
            and not name.endswith(BF16_LEAVES))


def release_parts(name: str, spec: TensorSpec, w: np.ndarray) -> Iterator[tuple[str, TensorSpec, np.ndarray]]:
    """(name, spec, values) of each tensor the releases store for the bf16-layout tensor `name` of
    `spec` and values `w`: its experts' matrices for an expert bank, else the tensor itself."""
    parts = expert_parts(name, spec)
    if parts is None:
        yield name, spec, w
        return
    rows = w.reshape(-1, spec.shape[-1])
    for i, (part, part_spec) in enumerate(parts):
        n = part_spec.shape[0]
        yield part, part_spec, rows[i * n:(i + 1) * n]


def fp8_round_trip(name: str, spec: TensorSpec, w: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """The values Lampo reads for `name` from an FP8 release of the weights `w` (float32): `w`
    itself where the release keeps it in bf16."""
    out = []
    for part, part_spec, values in release_parts(name, spec, w):
        if is_fp8(part, part_spec):
            values = from_bf16(dequantize_bf16(*quantize_blocks(values, block), block))
        out.append(values)
    return np.concatenate(out).reshape(w.shape) if len(out) > 1 else out[0]


def _release_tensors(ck: Checkpoint, block: tuple[int, int] | None) -> Iterator[tuple[str, str, np.ndarray]]:
    """(name, dtype, data) of every tensor of the FP8 layout (bf16 throughout without a `block`),
    in checkpoint order."""
    for name in ck.names():
        spec = ck.spec(name)
        for part, part_spec, values in release_parts(name, spec, ck.tensor_f32(name)):
            if block is not None and is_fp8(part, part_spec):
                codes, scales = quantize_blocks(values, block)
                yield part, FP8, codes
                yield scale_name(part), F32, scales
            else:
                yield part, spec.dtype, (to_bf16(values) if spec.dtype == BF16 else values.astype("<f4"))


def publish_fp8(src: Path | str, out: Path | str, block: tuple[int, int] | None = (128, 128),
                shard_mb: float = 2048) -> Path:
    """Write the FP8-release layout of the bf16 checkpoint `src` into `out` (a new directory);
    `block` None keeps every weight bf16 and only splits the expert banks into experts."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists")
    with Checkpoint.open(src) as ck:
        if ck.lq is not None or ck.fp8_block is not None:
            raise ValueError(f"fp8_release: {ck.model_dir} is not a bf16 checkpoint")
        tensors = {name: (dtype, data) for name, dtype, data in _release_tensors(ck, block)}
        kept = [n.removesuffix(".weight") for n, (d, data) in tensors.items()
                if d != FP8 and not n.endswith("_scale_inv") and np.ndim(data) == 2]
        out.mkdir(parents=True)
        for extra in ck.model_dir.iterdir():
            if extra.is_file() and not extra.name.endswith(".safetensors") and extra.name != INDEX_NAME:
                shutil.copyfile(extra, out / extra.name)
    if block is not None:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "modules_to_not_convert": kept, "weight_block_size": list(block)}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    specs = {n: TensorSpec(tuple(np.shape(data)), dtype) for n, (dtype, data) in tensors.items()}
    shards = plan_shards(specs, int(shard_mb * 1_000_000))
    files = shard_names(len(shards))
    for fname, names in zip(files, shards):
        header, _ = build_header((n, specs[n].dtype, specs[n].shape) for n in names)
        with open(out / fname, "wb") as f:
            f.write(header)
            for n in names:
                f.write(np.ascontiguousarray(tensors[n][1]).data)
    if len(shards) > 1:
        write_index(out, files, shards, specs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lampo.models.fp8_release",
                                description="Republish a bf16 checkpoint in the layout of Qwen's FP8 releases.")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--block", type=int, default=128,
                   help="the square weight block (default 128; 0 keeps bf16 and only splits the expert banks)")
    p.add_argument("--shard-mb", type=float, default=2048, help="shard size limit in MB (default 2048)")
    args = p.parse_args(argv)
    try:
        out = publish_fp8(args.src, args.out, (args.block, args.block) if args.block else None, args.shard_mb)
    except (ValueError, OSError) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
