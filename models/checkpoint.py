"""Open and validate a HF checkpoint directory of the Qwen3.5/3.6 family, then hand out its
tensors as zero-copy memory maps.

`Checkpoint.open(model_dir)` reads `config.json`, then `model.safetensors.index.json` (sharded) or
`model.safetensors` (single file), and parses every header before any tensor data is touched. It
checks that each tensor of `tensor_specs.expected_tensors` is present once with the expected shape
and an accepted dtype, and that its bytes lie inside its file. Every problem raises
`CheckpointError` with one line naming the file and tensor. Tensors the text engine does not use
(`model.visual.*`, anything unknown) are skipped and counted in `ignored`. MTP: when all `mtp.*`
tensors are absent the checkpoint opens without them (`has_mtp` False, see `notes`); a partial MTP
module is an error.

FP8 checkpoints (Qwen's `*-FP8` releases, `lampo.models.fp8`): a matrix may be stored as F8_E4M3
codes with its `_scale_inv` block scales, when config.json's quantization_config says so; and a
fused expert bank may be stored as its experts' own matrices, bf16 or FP8
(`tensor_specs.expert_parts`). Such a tensor is read back assembled (`checkpoint_parts`): `raw`
gives it as bf16 bits, the bf16 rounding of the dequantized weights, and `spec` says BF16.

A directory converted by `lampo convert` (holding `lampo-format.json`, `quant/checkpoint_format.py`)
opens the same way: the format file is read and checked first, each quantized tensor must be U8 of
exactly its packed size, `lq` holds the format and `quantized(name)` a tensor's width and logical
shape; `tensor_f32` dequantizes. A `*.partial-<pid>` directory (an unfinished conversion) is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lampo.models.bf16 import from_bf16
from lampo.models.checkpoint_parts import Assembled, Fp8Matrix, Part
from lampo.models.config import ConfigError, ModelConfig, load_config
from lampo.models.fp8 import FP8, Fp8ConfigError, read_fp8_block, scale_name, scale_shape
from lampo.models.quant.checkpoint_format import (
    PACKED_DTYPE,
    FormatError,
    LqFormat,
    LqTensor,
    dequantize,
    is_partial,
    read_format,
    stored_specs,
)
from lampo.models.safetensors_io import SafetensorsError, StoredTensor, read_header
from lampo.models.tensor_specs import BF16, F32, MATRIX_DTYPES, TensorSpec, expected_tensors, expert_parts, is_mtp

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_NUMPY_DTYPES = {BF16: np.dtype("<u2"), F32: np.dtype("<f4"), PACKED_DTYPE: np.dtype("u1"), FP8: np.dtype("u1")}
_SCALE_DTYPES = (F32, BF16)
Source = StoredTensor | Assembled  # how a tensor the engine uses is stored


class CheckpointError(ValueError):
    """A checkpoint Lampo cannot load; the message is one line naming the file and tensor."""


def _fail(msg: str) -> CheckpointError:
    return CheckpointError(f"checkpoint: {msg}")


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _shard_files(model_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files in order, and the index's weight_map (None for a single file)."""
    index_path = model_dir / INDEX_NAME
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _fail(f"{INDEX_NAME} is not valid JSON ({e})") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise _fail(f"{INDEX_NAME} has no valid 'weight_map' object")
        files = []
        for fname in sorted(set(weight_map.values())):
            path = model_dir / fname
            if Path(fname).name != fname:
                raise _fail(f"{INDEX_NAME} names shard {fname!r}, which is not a plain file name")
            if not path.is_file():
                raise _fail(f"{INDEX_NAME} names shard {fname}, which is missing from {model_dir}")
            files.append(path)
        return files, weight_map
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return [single], None
    raise _fail(f"{model_dir} has neither {INDEX_NAME} nor {SINGLE_NAME}")


class Checkpoint:
    """A validated checkpoint. Build it with `Checkpoint.open`."""

    def __init__(self, model_dir: Path, config: ModelConfig, tensors: dict[str, Source],
                 files: list[Path], has_mtp: bool, ignored: tuple[str, ...], notes: tuple[str, ...],
                 lq: LqFormat | None = None, fp8_block: tuple[int, int] | None = None):
        self.model_dir = model_dir
        self.config = config
        self.has_mtp = has_mtp
        self.ignored = ignored  # names present in the files but not used by the text engine
        self.notes = notes  # human-readable remarks, e.g. that the MTP module is absent
        self.lq = lq  # the format of a converted (LQ) checkpoint, None for a HF one
        self.fp8_block = fp8_block  # the FP8 weight block of an FP8 checkpoint, else None
        self._tensors = tensors  # in canonical (expected_tensors) order
        self._files = files
        self._maps: dict[Path, np.memmap] = {}

    # ---- opening and validation ----------------------------------------------------------
    @classmethod
    def open(cls, model_dir: str | Path, include_mtp: bool = True) -> "Checkpoint":
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise _fail(f"{model_dir} is not a directory")
        if is_partial(model_dir):
            raise _fail(f"{model_dir} is an unfinished `lampo convert` output: delete it and convert again")
        try:
            config = load_config(model_dir)
            lq = read_format(model_dir)
        except (ConfigError, FormatError) as e:
            raise _fail(str(e)) from None
        files, weight_map = _shard_files(model_dir)

        stored: dict[str, StoredTensor] = {}
        for path in files:
            try:
                header = read_header(path)
            except SafetensorsError as e:
                raise _fail(str(e)) from None
            for t in header:
                if t.name in stored:
                    raise _fail(f"{path.name}: tensor {t.name!r} also appears in {stored[t.name].path.name}")
                if weight_map is not None and weight_map.get(t.name, path.name) != path.name:
                    raise _fail(f"{path.name}: tensor {t.name!r} is mapped to {weight_map[t.name]} by {INDEX_NAME}")
                stored[t.name] = t
        if weight_map is not None:
            for name, fname in weight_map.items():
                if name not in stored:
                    raise _fail(f"{fname}: tensor {name!r} is listed in {INDEX_NAME} but not in the shard")

        expected = expected_tensors(config, include_mtp=include_mtp)
        notes: list[str] = []
        has_mtp = any(is_mtp(n) for n in expected)
        if has_mtp and not any(is_mtp(n) and n in stored for n in expected):
            has_mtp = False
            expected = {n: s for n, s in expected.items() if not is_mtp(n)}
            notes.append("no MTP weights (mtp.*) in the checkpoint: speculative decoding is unavailable")
        fp8_block = None
        if lq is not None:
            try:
                expected = stored_specs(lq, expected)
            except FormatError as e:
                raise _fail(str(e)) from None
        else:
            try:
                fp8_block = read_fp8_block(model_dir)
            except Fp8ConfigError as e:
                raise _fail(str(e)) from None
        tensors: dict[str, Source] = {}
        missing = []
        for name, spec in expected.items():
            source = cls._resolve(model_dir, name, spec, stored, fp8_block)
            if source is None:
                missing.append(name)
            else:
                tensors[name] = source
        cls._check_present(model_dir, expected, missing)
        used = {t.name for s in tensors.values() for t in (s.stored if isinstance(s, Assembled) else (s,))}
        ignored = tuple(n for n in stored if n not in used)
        return cls(model_dir, config, tensors, files, has_mtp, ignored, tuple(notes), lq, fp8_block)

    @classmethod
    def _resolve(cls, model_dir: Path, name: str, spec: TensorSpec, stored: dict[str, StoredTensor],
                 fp8_block: tuple[int, int] | None) -> Source | None:
        """How `name` is stored (checked against `spec`): as itself, as an FP8 matrix, or as its
        experts' matrices; None when it is not there at all."""
        t = stored.get(name)
        if t is not None:
            if t.dtype != FP8:
                cls._check_tensor(t, spec)
                return t
            return Assembled(name, spec.shape, (cls._fp8(t, spec, stored, fp8_block),))
        parts = expert_parts(name, spec)
        if parts is None or not any(p in stored for p, _spec in parts):
            return None
        absent = [(p, s) for p, s in parts if p not in stored]
        if absent:
            (first, part_spec), more = absent[0], len(absent) - 1
            raise _fail(f"{model_dir.name}: tensor {first!r} ({part_spec.dtype} {_shape(part_spec.shape)}) is missing"
                        f"{f' (and {more} more)' if more else ''}: the expert bank {name!r} is stored as "
                        f"its experts' matrices, {len(parts) - len(absent)} of {len(parts)} present")
        resolved: list[Part] = []
        for p, part_spec in parts:
            t = stored[p]
            if t.dtype == FP8:
                resolved.append(cls._fp8(t, part_spec, stored, fp8_block))
            else:
                cls._check_tensor(t, part_spec)
                resolved.append(t)
        return Assembled(name, spec.shape, tuple(resolved))

    @staticmethod
    def _fp8(t: StoredTensor, spec: TensorSpec, stored: dict[str, StoredTensor],
             block: tuple[int, int] | None) -> Fp8Matrix:
        """An F8_E4M3 tensor with its block scales, checked."""
        where = f"{t.path.name}: tensor {t.name!r} is {FP8}"
        if block is None:
            raise _fail(f"{where}, but config.json has no fp8 quantization_config (weight_block_size)")
        if spec.allowed_dtypes != MATRIX_DTYPES or len(spec.shape) != 2:
            raise _fail(f"{where}; Lampo reads FP8 matrices only, and this tensor is not one "
                        f"(expected {spec.dtype} {_shape(spec.shape)})")
        if t.shape != spec.shape:
            raise _fail(f"{t.path.name}: tensor {t.name!r} has shape {_shape(t.shape)}, expected {_shape(spec.shape)}")
        scales = stored.get(scale_name(t.name))
        want = scale_shape(spec.shape, block)
        if scales is None:
            raise _fail(f"{where}, but its block scales {scale_name(t.name)!r} (F32 {_shape(want)}) are missing")
        if scales.dtype not in _SCALE_DTYPES or scales.shape != want:
            raise _fail(f"{scales.path.name}: tensor {scales.name!r} is {scales.dtype} {_shape(scales.shape)}, expected "
                        f"F32 or BF16 {_shape(want)} (the scales of {block[0]}x{block[1]} blocks)")
        return Fp8Matrix(t, scales, block)

    @staticmethod
    def _check_present(model_dir: Path, expected: dict[str, TensorSpec], missing: list[str]) -> None:
        if not missing:
            return
        first, more = missing[0], len(missing) - 1
        spec = expected[first]
        extra = f" (and {more} more)" if more else ""
        if is_mtp(first):
            n_mtp = sum(is_mtp(n) for n in expected)
            raise _fail(
                f"{model_dir.name}: the MTP module is incomplete: tensor {first!r} "
                f"({spec.dtype} {_shape(spec.shape)}) is missing{extra}; "
                f"{n_mtp - len(missing)} of {n_mtp} mtp.* tensors present"
            )
        raise _fail(f"{model_dir.name}: tensor {first!r} ({spec.dtype} {_shape(spec.shape)}) is missing{extra}")

    @staticmethod
    def _check_tensor(t: StoredTensor, spec: TensorSpec) -> None:
        if spec.dtype == PACKED_DTYPE:
            Checkpoint._check_packed(t, spec)
        if t.shape != spec.shape:
            raise _fail(f"{t.path.name}: tensor {t.name!r} has shape {_shape(t.shape)}, expected {_shape(spec.shape)}")
        if not spec.accepts(t.dtype):
            allowed = " or ".join(sorted(spec.allowed_dtypes))
            raise _fail(f"{t.path.name}: tensor {t.name!r} has dtype {t.dtype}, expected {allowed}")

    @staticmethod
    def _check_packed(t: StoredTensor, spec: TensorSpec) -> None:
        """A quantized tensor: U8 (before the shape: not a bf16 tensor left as it was), of exactly its
        packed size."""
        if t.dtype != PACKED_DTYPE:
            raise _fail(f"{t.path.name}: tensor {t.name!r} has dtype {t.dtype}, expected {PACKED_DTYPE} (packed weights)")
        if t.nbytes != spec.nbytes:
            raise _fail(f"{t.path.name}: tensor {t.name!r} holds {t.nbytes:,} bytes of packed weights, "
                        f"expected {spec.nbytes:,}")

    # ---- queries -------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The tensors the text engine uses, in canonical order (embedding, layers, norm,
        lm_head, MTP)."""
        return list(self._tensors)

    def spec(self, name: str) -> TensorSpec:
        """Shape and the dtype `raw` gives for `name`: as stored, or BF16 for an assembled tensor."""
        t = self.source(name)
        dtype = BF16 if isinstance(t, Assembled) else t.dtype
        return TensorSpec(t.shape, dtype, frozenset({dtype}))

    def quantized(self, name: str) -> LqTensor | None:
        """Width and logical shape of a quantized tensor; None for one stored as in HF."""
        t = self.lq.tensors[name] if self.lq is not None and name in self._tensors else None
        return t if t is not None and t.quantized else None

    def source(self, name: str) -> Source:
        """How `name` is stored: one stored tensor (file, byte range, dtype and shape), or the parts
        it is assembled from."""
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"checkpoint: no tensor {name!r} in {self.model_dir}") from None

    def stored(self, name: str) -> StoredTensor:
        """Where `name`'s bytes lie, for a tensor stored whole (`source` for any)."""
        t = self.source(name)
        if isinstance(t, Assembled):
            raise TypeError(f"checkpoint: tensor {name!r} is assembled from {len(t.parts)} stored parts")
        return t

    def path_of(self, name: str) -> Path:
        """The safetensors file holding `name` (its first part)."""
        t = self.source(name)
        return (t.first if isinstance(t, Assembled) else t).path

    def shards(self) -> list[tuple[Path, list[str]]]:
        """(file, the used tensors in it in file order) for each file holding any, in file order,
        for shard-by-shard loading; an assembled tensor is listed with its first part."""
        by_file: dict[Path, list[tuple[int, str]]] = {p: [] for p in self._files}
        for name, t in self._tensors.items():
            first = t.first if isinstance(t, Assembled) else t
            by_file[first.path].append((first.start, name))
        return [(p, [name for _start, name in sorted(ts)]) for p, ts in by_file.items() if ts]

    @property
    def total_bytes(self) -> int:
        """Bytes of all used tensors, as stored."""
        return sum(t.nbytes for t in self._tensors.values())

    # ---- data ----------------------------------------------------------------------------
    def view(self, t: StoredTensor) -> np.ndarray:
        """Zero-copy read-only view of one stored tensor's bytes: BF16 as uint16 bits, F32 as
        float32, U8 (packed LQ weights) and F8_E4M3 (FP8 codes) as uint8."""
        mm = self._maps.get(t.path)
        if mm is None:
            mm = self._maps[t.path] = np.memmap(t.path, dtype=np.uint8, mode="r")
        return np.asarray(mm[t.start:t.end]).view(_NUMPY_DTYPES[t.dtype]).reshape(t.shape)

    def raw(self, name: str) -> np.ndarray:
        """`name` as `view` gives it, or for an assembled tensor a new array of bf16 bits."""
        t = self.source(name)
        return t.bf16(self.view) if isinstance(t, Assembled) else self.view(t)

    def tensor_f32(self, name: str) -> np.ndarray:
        """The tensor as float32 (a new array for BF16 and for a quantized tensor, dequantized to
        its logical shape; the read-only map itself for F32)."""
        raw, lq = self.raw(name), self.quantized(name)
        if lq is not None:
            return dequantize(raw, lq)
        return from_bf16(raw) if raw.dtype == np.uint16 else raw

    def close(self) -> None:
        """Drop the memory maps (arrays handed out earlier keep their own reference)."""
        self._maps.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
