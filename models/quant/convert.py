"""Convert a bf16 HF checkpoint into a converted (LQ) directory (`checkpoint_format.py`).

`convert(src, out, recipe, progress)` validates SRC (`Checkpoint.open`, headers only), plans the
output from the specs alone (each tensor's stored dtype and shape from `recipes.tensor_bits` and
`layout.packed_bytes`, the shards, hence every header), then streams the tensors in canonical
order: a tensor the recipe quantizes is read in blocks of whole rows (a bank expert by expert),
quantized and packed by a `BlockQuantizer` (`NumpyBlockQuantizer`: `quantizer.quantize` and
`layout.pack`, the specification; `lampo convert` passes the GPU's `lampo._native.LqBlockQuantizer`,
bit for bit the same) and written at once; the rows of an FP8 matrix go to it as their codes and
block scales (decoded on the GPU there, by `fp8.dequantize_bf16` in numpy); a bf16 tensor is copied
byte for byte. The source's tensor bytes are hashed (sha256) as they are read. Tensors the
text engine does not use (`Checkpoint.ignored`) are left out.

Memory is bounded by one block of at most BLOCK_ELEMENTS weights whatever the model's size (a
few hundred MB of quantizer and packer temporaries at most): no tensor is ever held whole, each
block's bytes go straight to the shard file, and the source is read with plain reads, not memory
maps, so nothing stays resident.

Atomic: everything is written into the sibling `OUT.partial-<pid>`, the format file last, then
renamed to OUT. OUT must not exist. Any error or interrupt removes the partial directory.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from lampo.models.bf16 import from_bf16
from lampo.models.checkpoint import Checkpoint
from lampo.models.checkpoint_parts import Assembled, Fp8Matrix, View, part_bf16
from lampo.models.fp8 import dequantize_bf16
from lampo.models.quant import layout
from lampo.models.quant.checkpoint_format import FORMAT_FILE, LqFormat, LqTensor, partial_dir
from lampo.models.quant.quantizer import quantize
from lampo.models.quant.recipes import get_recipe, tensor_bits
from lampo.models.safetensors_io import build_header
from lampo.models.synthetic import plan_shards, shard_names, write_index

SHARD_BYTES = 2 << 30
BLOCK_ELEMENTS = 1 << 22  # weights quantized and packed per step
COPY_BYTES = 64 << 20  # bytes per step of a bf16 copy
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja", "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json")


class ConvertError(ValueError):
    """A conversion that cannot start or finish; the message is one line."""


@dataclass(frozen=True)
class Progress:
    tensors_done: int
    tensors_total: int
    bytes_done: int  # source bytes read
    bytes_total: int


class BlockQuantizer(Protocol):
    """Blocks of whole rows (16n of them, 64k columns) in, their packed LQ tiles out."""

    def quantize(self, rows: np.ndarray, bits: int) -> bytes:
        """rows: bf16 bits [16n, 64k]."""

    def quantize_fp8(self, codes: np.ndarray, scales: np.ndarray, block_rows: int, block_cols: int,
                     bits: int) -> bytes:
        """The rows of an FP8 matrix: codes uint8 [16n, 64k], their block scales float32 (the first
        row a block's first)."""


class NumpyBlockQuantizer:
    """The specification: `quantizer.quantize` and `layout.pack`, FP8 rows decoded by
    `fp8.dequantize_bf16` first."""

    def quantize(self, rows: np.ndarray, bits: int) -> bytes:
        codes, scales = quantize(from_bf16(rows), bits)
        return layout.pack(codes, scales, bits).tobytes()

    def quantize_fp8(self, codes: np.ndarray, scales: np.ndarray, block_rows: int, block_cols: int,
                     bits: int) -> bytes:
        return self.quantize(dequantize_bf16(codes, scales, (block_rows, block_cols)), bits)


NUMPY_QUANTIZER = NumpyBlockQuantizer()


def convert(src: str | Path, out: str | Path, recipe_name: str,
            progress: Callable[[Progress], None] | None = None, shard_bytes: int = SHARD_BYTES,
            quantizer: BlockQuantizer = NUMPY_QUANTIZER) -> LqFormat:
    """Write the converted checkpoint of SRC at `recipe_name` into OUT; its format on success."""
    recipe = get_recipe(recipe_name)
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise ConvertError(f"{out} already exists: choose a new output directory")
    ck = Checkpoint.open(src)
    if ck.lq is not None:
        raise ConvertError(f"{ck.model_dir} is already converted (recipe {ck.lq.recipe}): convert the bf16 checkpoint")
    bits = tensor_bits(recipe, ck.config)
    tensors = {n: LqTensor(bits[n], ck.spec(n).shape) for n in ck.names()}
    work = partial_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work.mkdir()
    try:
        for name in SIDE_FILES:
            if (ck.model_dir / name).is_file():
                shutil.copyfile(ck.model_dir / name, work / name)
        digest = _write_shards(ck, tensors, work, shard_bytes, progress, quantizer)
        fmt = LqFormat(recipe.name, tensors, digest, tuple(p.name for p, _ in ck.shards()))
        (work / FORMAT_FILE).write_text(fmt.to_json(), encoding="utf-8")
        if out.exists():
            raise ConvertError(f"{out} appeared while converting: the conversion is left out")
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return fmt


def _write_shards(ck: Checkpoint, tensors: dict[str, LqTensor], work: Path, shard_bytes: int,
                  progress: Callable[[Progress], None] | None, quantizer: BlockQuantizer) -> str:
    """Write the shards and the index; the sha256 of the source tensors' bytes."""
    specs = {n: t.stored_spec(ck.spec(n)) for n, t in tensors.items()}
    shards = plan_shards(specs, shard_bytes)
    files = shard_names(len(shards), single=False)
    hasher = hashlib.sha256()
    tensors_done = bytes_done = 0
    for fname, names in zip(files, shards):
        header, _ = build_header((n, specs[n].dtype, specs[n].shape) for n in names)
        planned = len(header) + sum(specs[n].nbytes for n in names)
        with open(work / fname, "wb") as f:
            f.write(header)
            for name in names:
                for source, packed in _blocks(ck, name, tensors[name], quantizer):
                    hasher.update(source)
                    f.write(packed)
                    bytes_done += len(source)
                    if progress:
                        progress(Progress(tensors_done, len(tensors), bytes_done, ck.total_bytes))
                tensors_done += 1
            if f.tell() != planned:
                raise ConvertError(f"{fname}: wrote {f.tell():,} bytes where the header plans {planned:,}")
    write_index(work, files, shards, specs)
    if progress:
        progress(Progress(tensors_done, len(tensors), bytes_done, ck.total_bytes))
    return hasher.hexdigest()


def _blocks(ck: Checkpoint, name: str, t: LqTensor, quantizer: BlockQuantizer) -> Iterator[tuple[bytes, bytes]]:
    """(source bytes, output bytes) of one tensor, block by block in file order."""
    source = ck.source(name)
    if isinstance(source, Assembled):
        yield from assembled_blocks(ck.view, source, t, quantizer)
        return
    stored = source
    with open(stored.path, "rb") as f:
        f.seek(stored.start)

        def read(n: int) -> bytes:
            data = f.read(n)
            if len(data) != n:
                raise ConvertError(f"{stored.path.name}: tensor {name!r} ends early (the file changed while converting)")
            return data

        if not t.quantized:
            for start in range(0, stored.nbytes, COPY_BYTES):
                data = read(min(COPY_BYTES, stored.nbytes - start))
                yield data, data
            return
        *banks, n, k = t.shape
        rows = _block_rows(k)
        for _ in range(math.prod(banks)):
            for first in range(0, n, rows):
                data = read(min(rows, n - first) * k * 2)
                yield data, quantizer.quantize(np.frombuffer(data, "<u2").reshape(-1, k), t.bits)


def _block_rows(k: int) -> int:
    """Rows of k columns quantized per block: whole tiles of about BLOCK_ELEMENTS."""
    return max(layout.TILE_ROWS, BLOCK_ELEMENTS // k // layout.TILE_ROWS * layout.TILE_ROWS)


def assembled_blocks(view: View, source: Assembled, t: LqTensor,
                     quantizer: BlockQuantizer) -> Iterator[tuple[bytes, bytes]]:
    """`_blocks` of a tensor assembled from parts (FP8 matrices, experts' matrices): each part's
    stored bytes go with its first block; its rows are quantized (or copied as bf16) in blocks, an
    FP8 part's as codes and scales in blocks of whole weight blocks. A part holds whole tiles of
    rows (every part of a bank is whole experts' rows)."""
    rows = _block_rows(t.shape[-1])
    for data, part in source.stored_parts(view):
        if t.quantized and isinstance(part, Fp8Matrix):
            blocks = _fp8_blocks(view, part, rows, t.bits, quantizer)
        else:
            blocks = _bf16_blocks(part_bf16(part, view), rows, t, quantizer)
        for i, packed in enumerate(blocks):
            yield (data if i == 0 else b""), packed


def _bf16_blocks(bf16: np.ndarray, rows: int, t: LqTensor, quantizer: BlockQuantizer) -> Iterator[bytes]:
    for first in range(0, bf16.shape[0], rows):
        block = np.ascontiguousarray(bf16[first:first + rows])
        yield quantizer.quantize(block, t.bits) if t.quantized else block.tobytes()


def _fp8_blocks(view: View, part: Fp8Matrix, rows: int, bits: int, quantizer: BlockQuantizer) -> Iterator[bytes]:
    """The packed blocks of an FP8 part, each of whole weight blocks' rows (and whole tiles)."""
    block_rows, block_cols = part.block
    step = math.lcm(layout.TILE_ROWS, block_rows)
    step = max(step, rows // step * step)
    codes, scales = view(part.codes), part.scales_f32(view)
    for first in range(0, codes.shape[0], step):
        last = min(first + step, codes.shape[0])
        yield quantizer.quantize_fp8(np.ascontiguousarray(codes[first:last]),
                                     np.ascontiguousarray(scales[first // block_rows:-(-last // block_rows)]),
                                     block_rows, block_cols, bits)
