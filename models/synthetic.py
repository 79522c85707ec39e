"""Synthetic checkpoints: a real HF-format directory (config.json, safetensors shards, index) with
random weights of a sane scale, for tests and benchmarks of any model shape without the download.

Weights (every tensor of `tensor_specs.expected_tensors`, nothing else):
- matrices, incl. each fused expert bank: N(0, 1/sqrt(fan_in)), fan_in = last dim, so every
  projection of an O(1) input stays O(1) through any depth;
- embedding N(0, 1) (the residual stream starts O(1); every use is normed first);
- zero-centred RMSNorm weights (`*layernorm`, `q_norm`, `k_norm`, final and MTP norms)
  N(0, 0.1), so a reader that forgets the "+1" is caught;
- GDN gated-norm weight (plain w) 1 + N(0, 0.1);
- `A_log` = log(U(1, 16)); `dt_bias` N(-2, 0.5), so decays exp(g) spread over ~0.1..0.9 and the
  recurrent state carries information across many tokens;
- conv1d weights N(0, 0.5).

Determinism: each tensor is drawn from its own PCG64 stream seeded by a stable hash of (seed,
name), in fixed-size blocks, so the values do not depend on the shard size or tensor order.
Bounded RAM: the shard plan and each header are computed from the specs before any data is drawn;
then tensors are generated and written one block at a time (never a whole tensor in memory).
One shard is written as `model.safetensors`; more as `model-0000i-of-0000N.safetensors` plus
`model.safetensors.index.json`, as HF `save_pretrained` does. `jobs` > 1 writes that many shards at
once, one process each, with the same bytes: a process draws ~0.15 GB/s of bf16 (the normal draws
and the rounding; ~6 minutes for the 27B alone) or ~0.6 GB/s of packed LQ tiles.

With a recipe (`recipe="q5"`) the checkpoint is written in Lampo's converted (LQ) format directly,
as `lampo convert` would lay it out (lampo-format.json, packed U8 tensors), without quantizing
anything: each tensor the recipe quantizes gets uniformly random codes and fp16 scales
s (1 + 0.1 u), u ~ U(-1, 1), with s chosen so the weights have the standard deviation of the
bf16 rule above (uniform codes have standard deviation sqrt((4^b - 1) / 12)). This writes the
full-size quantized checkpoints for the benchmarks in seconds per GB.

CLI: `python -m lampo.models.synthetic PRESET OUT_DIR [--layers N] [--seed S] [--shard-mb M]
[--no-mtp] [--tokenizer PATH] [--recipe q5|q4] [--jobs N]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from lampo.models.bf16 import round_bf16, to_bf16
from lampo.models.config import ModelConfig
from lampo.models.safetensors_io import build_header
from lampo.models.tensor_specs import BF16, EMBED, F32, FINAL_NORM, MTP_PREFIX, TensorSpec, expected_tensors

BLOCK_ELEMENTS = 1 << 20  # values drawn and written per step
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_ZERO_CENTRED_SUFFIXES = ("layernorm.weight", "q_norm.weight", "k_norm.weight")
_ZERO_CENTRED_NAMES = (
    FINAL_NORM,
    MTP_PREFIX + "pre_fc_norm_embedding.weight",
    MTP_PREFIX + "pre_fc_norm_hidden.weight",
    MTP_PREFIX + "norm.weight",
)


@dataclass(frozen=True)
class Init:
    """value = loc + scale * draw, draw ~ N(0, 1); or log(U(low, high)) when `log_uniform`."""

    loc: float = 0.0
    scale: float = 1.0
    log_uniform: tuple[float, float] | None = None


def init_for(name: str, spec: TensorSpec) -> Init:
    """The random distribution of one tensor (see the module docstring)."""
    if name == EMBED:
        return Init(0.0, 1.0)
    if name in _ZERO_CENTRED_NAMES or name.endswith(_ZERO_CENTRED_SUFFIXES):
        return Init(0.0, 0.1)
    if name.endswith("linear_attn.norm.weight"):
        return Init(1.0, 0.1)
    if name.endswith("linear_attn.A_log"):
        return Init(log_uniform=(1.0, 16.0))
    if name.endswith("linear_attn.dt_bias"):
        return Init(-2.0, 0.5)
    if name.endswith("linear_attn.conv1d.weight"):
        return Init(0.0, 0.5)
    if len(spec.shape) >= 2:
        return Init(0.0, float(spec.shape[-1]) ** -0.5)
    raise ValueError(f"synthetic: no initialisation rule for 1-D tensor {name!r}")


def tensor_seed(seed: int, name: str) -> int:
    """A stable 64-bit seed for one tensor (independent of Python's hash randomisation)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "little")


def tensor_blocks(name: str, spec: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    """The tensor's values in row-major order as float32 blocks of at most BLOCK_ELEMENTS."""
    init = init_for(name, spec)
    rng = np.random.Generator(np.random.PCG64(tensor_seed(seed, name)))
    left = spec.numel
    while left:
        n = min(BLOCK_ELEMENTS, left)
        if init.log_uniform:
            block = np.log(rng.uniform(*init.log_uniform, size=n)).astype(np.float32)
        else:
            block = rng.standard_normal(n, dtype=np.float32)
            block *= np.float32(init.scale)
            block += np.float32(init.loc)
        yield block
        left -= n


def synthetic_tensor(name: str, spec: TensorSpec, seed: int = 0) -> np.ndarray:
    """One whole tensor as float32 (rounded through `spec.dtype`), exactly as written to disk."""
    flat = np.concatenate(list(tensor_blocks(name, spec, seed)))
    return (round_bf16(flat) if spec.dtype == BF16 else flat).reshape(spec.shape)


def _encode(block: np.ndarray, dtype: str) -> np.ndarray:
    return to_bf16(block) if dtype == BF16 else block.astype("<f4")


def plan_shards(specs: dict[str, TensorSpec], shard_bytes: int) -> list[list[str]]:
    """Greedy split in order: a shard closes when the next tensor would overflow it (a tensor
    bigger than the limit gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, spec in specs.items():
        if shards[-1] and size + spec.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += spec.nbytes
    return shards


def shard_names(count: int, single: bool = True) -> list[str]:
    """The file names of `count` shards as HF `save_pretrained` writes them (one shard is
    `model.safetensors` when `single`)."""
    if count == 1 and single:
        return [SINGLE_NAME]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_index(out: Path, files: list[str], shards: list[list[str]], specs: dict[str, TensorSpec]) -> None:
    """`model.safetensors.index.json` of the shards `files` holding the tensors `shards` of `specs`."""
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs.values())},
             "weight_map": {name: fname for fname, names in zip(files, shards) for name in names}}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def packed_blocks(name: str, spec: TensorSpec, bits: int, seed: int) -> Iterator[bytes]:
    """The random packed LQ tiles of a tensor of logical `spec` at `bits` (module docstring), in
    blocks of whole tiles."""
    from lampo.models.quant import layout

    rng = np.random.Generator(np.random.PCG64(tensor_seed(seed, name)))
    *banks, n, k = spec.shape
    tiles = int(np.prod(banks, dtype=np.int64)) * (n // layout.TILE_ROWS) * (k // layout.TILE_COLS)
    size = layout.tile_bytes(bits)
    scale = init_for(name, spec).scale / np.sqrt((4.0**bits - 1) / 12)
    per_block = max(1, BLOCK_ELEMENTS // size)
    for first in range(0, tiles, per_block):
        count = min(per_block, tiles - first)
        block = np.empty((count, size), dtype=np.uint8)
        block[:, : size - 2 * layout.TILE_ROWS] = rng.integers(0, 256, (count, size - 2 * layout.TILE_ROWS),
                                                               dtype=np.uint8)
        scales = scale * (1 + 0.1 * rng.uniform(-1, 1, (count, layout.TILE_ROWS)))
        block[:, size - 2 * layout.TILE_ROWS:] = scales.astype("<f2").view(np.uint8)
        yield block.tobytes()


def _write_shard(path: Path, names: list[str], specs: dict[str, TensorSpec], seed: int,
                 packed: dict[str, tuple[TensorSpec, int]]) -> None:
    """Write one shard file holding `names` (each tensor packed when in `packed`)."""
    header, _ = build_header((n, specs[n].dtype, specs[n].shape) for n in names)
    with open(path, "wb") as f:
        f.write(header)
        for name in names:
            if name in packed:
                for block in packed_blocks(name, *packed[name], seed):
                    f.write(block)
                continue
            for block in tensor_blocks(name, specs[name], seed):
                f.write(_encode(block, specs[name].dtype).data)


def write_checkpoint(
    out_dir: Path | str,
    cfg: ModelConfig,
    seed: int = 0,
    shard_mb: float = 2048,
    with_mtp: bool = True,
    tokenizer: Path | str | None = None,
    vector_dtype: str = BF16,
    recipe: str | None = None,
    jobs: int = 1,
) -> Path:
    """Write a synthetic checkpoint of `cfg` into `out_dir` (created; earlier model files there are
    replaced) and return its path. `shard_mb`: shard size limit in MB (10^6 bytes). `tokenizer`: a
    tokenizer.json to copy in. `vector_dtype`: BF16 or F32 for
    the 1-D tensors that may be either (real checkpoints differ). `recipe`: write the converted
    (LQ) format of that recipe instead (module docstring). `jobs`: shards written at once."""
    if vector_dtype not in (BF16, F32):
        raise ValueError(f"synthetic: vector_dtype must be {BF16!r} or {F32!r}, got {vector_dtype!r}")
    if shard_mb <= 0:
        raise ValueError(f"synthetic: shard_mb must be positive, got {shard_mb}")
    if jobs < 1:
        raise ValueError(f"synthetic: jobs must be >= 1, got {jobs}")
    tok = None if tokenizer is None else Path(tokenizer)
    if tok is not None and not tok.is_file():
        raise FileNotFoundError(f"tokenizer file {tok} not found")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("model-*-of-*.safetensors"), out / SINGLE_NAME, out / INDEX_NAME, out / "lampo-format.json"]:
        old.unlink(missing_ok=True)

    specs = {
        name: TensorSpec(spec.shape, vector_dtype, spec.allowed_dtypes) if spec.accepts(vector_dtype) else spec
        for name, spec in expected_tensors(cfg, include_mtp=with_mtp).items()
    }
    packed: dict[str, tuple[TensorSpec, int]] = {}
    fmt = None
    if recipe is not None:
        from lampo.models.quant.checkpoint_format import LqFormat, LqTensor
        from lampo.models.quant.recipes import get_recipe, tensor_bits

        bits = tensor_bits(get_recipe(recipe), cfg)
        tensors = {n: LqTensor(bits[n], s.shape) for n, s in specs.items()}
        packed = {n: (specs[n], t.bits) for n, t in tensors.items() if t.quantized}
        fmt = LqFormat(recipe, tensors, f"synthetic seed {seed}", ())
        specs = {n: t.stored_spec(specs[n]) for n, t in tensors.items()}
    shards = plan_shards(specs, int(shard_mb * 1_000_000))
    files = shard_names(len(shards))
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n", encoding="utf-8")
    work = [(out / fname, names, {n: specs[n] for n in names}, seed, {n: packed[n] for n in names if n in packed})
            for fname, names in zip(files, shards)]
    if jobs == 1 or len(work) == 1:
        for args in work:
            _write_shard(*args)
    else:
        with ProcessPoolExecutor(min(jobs, len(work))) as pool:
            list(pool.map(_write_shard, *zip(*work)))  # list(): a worker's error is raised here
    if len(shards) > 1:
        write_index(out, files, shards, specs)
    if tok is not None:
        shutil.copyfile(tok, out / "tokenizer.json")
    if fmt is not None:  # last, as lampo convert: the directory is a model only once it is complete
        from lampo.models.quant.checkpoint_format import FORMAT_FILE

        (out / FORMAT_FILE).write_text(fmt.to_json(), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    from lampo.models.presets import PRESETS, get_preset

    p = argparse.ArgumentParser(
        prog="python -m lampo.models.synthetic",
        description="Write a random-weight checkpoint of a preset's shapes in HF format.",
    )
    p.add_argument("preset", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--layers", type=int, help="keep only the first N layers (full-width shapes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-mb", type=float, default=2048, help="shard size limit in MB (default 2048)")
    p.add_argument("--no-mtp", action="store_true", help="leave out the MTP module's tensors")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json to copy into the checkpoint")
    p.add_argument("--recipe", help="write the converted LQ format of this recipe (random codes and scales)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="shards written at once, one process each (default 1)")
    args = p.parse_args(argv)
    try:
        cfg = get_preset(args.preset)
        if args.layers is not None:
            if not 1 <= args.layers <= cfg.num_hidden_layers:
                raise ValueError(f"synthetic: --layers must be in 1..{cfg.num_hidden_layers}, got {args.layers}")
            cfg = cfg.with_layers(args.layers)
        out = write_checkpoint(args.out_dir, cfg, seed=args.seed, shard_mb=args.shard_mb,
                               with_mtp=not args.no_mtp, tokenizer=args.tokenizer, recipe=args.recipe,
                               jobs=args.jobs)
    except ValueError as e:  # ConfigError included; messages carry their own prefix
        print(e, file=sys.stderr)
        return 2
    except OSError as e:
        print(f"synthetic: {e}", file=sys.stderr)
        return 2
    n_bytes = sum(f.stat().st_size for f in out.glob("model*.safetensors"))
    print(f"wrote {cfg.name or args.preset} ({cfg.num_hidden_layers} layers) to {out}: {n_bytes / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
