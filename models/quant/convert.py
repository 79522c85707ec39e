"""Convert a bf16 HF checkpoint into a converted (LQ) directory (`checkpoint_format.py`).

`convert(src, out, recipe, progress)` validates SRC (`Checkpoint.open`, headers only), plans the
output from the specs alone (each tensor's stored dtype and shape from `recipes.tensor_bits` and
`layout.packed_bytes`, the shards, hence every header), then streams the tensors in canonical
order: a tensor the recipe quantizes is read in blocks of whole rows (a bank expert by expert),
quantized and packed by `quantize_block` (`numpy_block`: `quantizer.quantize` and `layout.pack`,
the specification; `lampo convert` passes the GPU's `lampo._native.LqBlockQuantizer`, bit for bit
the same) and written at once; a bf16 tensor is copied byte for byte. The source's tensor bytes are hashed (sha256) as they are read. Tensors the
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

import numpy as np

from lampo.models.bf16 import from_bf16
from lampo.models.checkpoint import Checkpoint
from lampo.models.checkpoint_parts import Assembled
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


QuantizeBlock = Callable[[np.ndarray, int], bytes]  # (bf16 bits [rows, k], bits) -> the rows' packed tiles


def numpy_block(rows: np.ndarray, bits: int) -> bytes:
    """The packed tiles of a block of whole rows by the numpy quantizer and packer."""
    codes, scales = quantize(from_bf16(rows), bits)
    return layout.pack(codes, scales, bits).tobytes()


def convert(src: str | Path, out: str | Path, recipe_name: str,
            progress: Callable[[Progress], None] | None = None, shard_bytes: int = SHARD_BYTES,
            quantize_block: QuantizeBlock = numpy_block) -> LqFormat:
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
        digest = _write_shards(ck, tensors, work, shard_bytes, progress, quantize_block)
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
                  progress: Callable[[Progress], None] | None, quantize_block: QuantizeBlock) -> str:
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
                for source, packed in _blocks(ck, name, tensors[name], quantize_block):
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


def _blocks(ck: Checkpoint, name: str, t: LqTensor, quantize_block: QuantizeBlock) -> Iterator[tuple[bytes, bytes]]:
    """(source bytes, output bytes) of one tensor, block by block in file order."""
    source = ck.source(name)
    if isinstance(source, Assembled):
        yield from _assembled_blocks(ck, source, t, quantize_block)
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
                yield data, quantize_block(np.frombuffer(data, "<u2").reshape(-1, k), t.bits)


def _block_rows(k: int) -> int:
    """Rows of k columns quantized per block: whole tiles of about BLOCK_ELEMENTS."""
    return max(layout.TILE_ROWS, BLOCK_ELEMENTS // k // layout.TILE_ROWS * layout.TILE_ROWS)


def _assembled_blocks(ck: Checkpoint, source: Assembled, t: LqTensor,
                      quantize_block: QuantizeBlock) -> Iterator[tuple[bytes, bytes]]:
    """`_blocks` of a tensor assembled from parts (FP8 matrices, experts' matrices): each part's
    stored bytes go with its first block; its rows, as bf16, are quantized (or copied) in blocks.
    A part holds whole tiles of rows (every part of a bank is whole experts' rows)."""
    rows = _block_rows(t.shape[-1])
    for data, bf16 in source.row_blocks(ck.view):
        for first in range(0, bf16.shape[0], rows):
            block = np.ascontiguousarray(bf16[first:first + rows])
            yield (data if first == 0 else b""), (quantize_block(block, t.bits) if t.quantized else block.tobytes())
