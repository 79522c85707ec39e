"""`lampo convert HF_DIR OUT_DIR [--recipe q5|q4] [--quantizer auto|cuda|numpy]`: write the ~5 bpw (LQ) checkpoint of a bf16 one.

The work is `lampo.models.quant.convert.convert`, quantizing on the GPU where the CUDA engine
runs (`auto`, the default; bit for bit the numpy quantizer, which `numpy` forces and which `auto`
falls back to; the final line says which ran); this module parses the arguments, draws the
progress line on stderr (tensors, bytes, rate; redrawn in place at most 10 times a second on a
terminal, only the final line otherwise) and turns every error into one line (exit status 2;
130 after Ctrl-C, which leaves nothing behind).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from lampo.engine.cuda import EngineUnavailable
from lampo.models.quant.convert import NUMPY_QUANTIZER, BlockQuantizer, Progress, convert
from lampo.models.quant.recipes import RECIPES

QUANTIZERS = ("auto", "cuda", "numpy")

REDRAW_S = 0.1


class ProgressLine:
    """The progress of a conversion as one line on `stream`."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._live = stream.isatty()
        self._start = self._drawn = time.monotonic()
        self.last: Progress | None = None

    def __call__(self, p: Progress) -> None:
        self.last = p
        now = time.monotonic()
        if self._live and now - self._drawn >= REDRAW_S:
            self._drawn = now
            self._stream.write("\r" + self.text(p, now - self._start) + "\x1b[K")
            self._stream.flush()

    @staticmethod
    def text(p: Progress, elapsed: float) -> str:
        rate = p.bytes_done / elapsed if elapsed > 0 else 0.0
        return (f"{p.tensors_done}/{p.tensors_total} tensors, {p.bytes_done / 1e9:.2f}/{p.bytes_total / 1e9:.2f} GB, "
                f"{rate / 1e6:.0f} MB/s, {elapsed:.0f} s")

    def finish(self, outcome: str) -> None:
        """The final line (none when nothing was converted)."""
        if self.last is None:
            return
        line = f"{self.text(self.last, time.monotonic() - self._start)}: {outcome}"
        self._stream.write(f"\r{line}\x1b[K\n" if self._live else f"{line}\n")
        self._stream.flush()


def block_quantizer(kind: str) -> tuple[BlockQuantizer, str]:
    """The quantizer of `--quantizer kind` and where it runs: the GPU's for cuda (EngineUnavailable
    without one) and for auto where the CUDA engine runs, else numpy's."""
    if kind != "numpy":
        from lampo.engine.cuda import load_native

        try:
            return load_native().LqBlockQuantizer(), "on the GPU"
        except EngineUnavailable as e:
            if kind == "cuda":
                raise EngineUnavailable(f"{e}; --quantizer numpy quantizes on the CPU") from None
    return NUMPY_QUANTIZER, "with numpy on the CPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lampo convert", description=__doc__.splitlines()[0])
    p.add_argument("hf_dir", metavar="HF_DIR", help="the bf16 checkpoint (Hugging Face format)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the converted checkpoint's directory (must not exist)")
    p.add_argument("--recipe", default="q5", metavar="NAME",
                   help="; ".join(f"{r.name}: {r.summary}" for r in RECIPES.values()) + " (default: q5)")
    p.add_argument("--quantizer", choices=QUANTIZERS, default="auto",
                   help="where the weights are quantized: auto (the GPU where the CUDA engine runs, else numpy), "
                        "cuda, numpy (the same bytes either way)")
    args = p.parse_args(argv)
    bar = ProgressLine(sys.stderr)
    try:
        quantizer, where = block_quantizer(args.quantizer)
        fmt = convert(args.hf_dir, args.out_dir, args.recipe, progress=bar, quantizer=quantizer)
    except KeyboardInterrupt:
        bar.finish("interrupted, nothing written")
        return 130
    except (ValueError, OSError, EngineUnavailable) as e:  # CheckpointError, ConvertError, a recipe, no GPU
        bar.finish("failed")
        print(f"lampo convert: {e}", file=sys.stderr)
        return 2
    bar.finish(f"wrote {args.out_dir} ({fmt.recipe}), quantized {where}")
    return 0
