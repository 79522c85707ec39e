"""Run LQ GEMV launches for Nsight Compute (tests/gpu/run.sh kernel): one call per shape and width,
random packed weights, so `ncu -k regex:gemv_lq` profiles each launch alone.

    python3 tests/gpu/op_profile.py OUT,IN,BITS[,T] ...
"""

from __future__ import annotations

import sys

import numpy as np

from lampo import _native_ops as ops
from lampo.models.quant import layout


def main(argv: list[str]) -> int:
    rng = np.random.default_rng(0)
    for spec in argv:
        out, inn, bits, *rest = (int(v) for v in spec.split(","))
        T = rest[0] if rest else 1
        packed = rng.integers(0, 256, layout.packed_bytes(out, inn, bits), dtype=np.uint8)
        x = rng.integers(0x3c00, 0x3c80, (T, inn), dtype=np.uint16)
        ops.gemv_lq(packed, bits, out, inn, x, False)
        print(f"gemv_lq [{out},{inn}] bits={bits} T={T}: launched", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
