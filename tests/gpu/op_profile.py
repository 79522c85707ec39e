"""Run single launches for Nsight Compute (tests/gpu/run.sh kernel): an LQ GEMV per OUT,IN,BITS[,T]
(random packed weights, `ncu -k regex:gemv_lq`), or the split-KV decode attention per
attn:NQ,NKV,L,TQ (NQ query heads, NKV KV heads, L live keys, TQ query tokens; a synthetic INT8
cache; the engine's form for that call, `ncu -k regex:attn_int8_kernel`: the combine after it is
another kernel), so that ncu profiles each alone.

    python3 tests/gpu/op_profile.py OUT,IN,BITS[,T] ... attn:NQ,NKV,L,TQ ...
"""

from __future__ import annotations

import sys

import numpy as np

from lampo import _native_ops as ops
from lampo.models.quant import layout


def main(argv: list[str]) -> int:
    rng = np.random.default_rng(0)
    for spec in argv:
        if spec.startswith("attn:"):
            nq, nkv, length, Tq = (int(v) for v in spec[len("attn:") :].split(","))
            ops.bench_attn_decode(nq, nkv, length, Tq, 1)
            print(f"attn_decode_int8 nq={nq} nkv={nkv} L={length} Tq={Tq}: launched", file=sys.stderr)
            continue
        out, inn, bits, *rest = (int(v) for v in spec.split(","))
        T = rest[0] if rest else 1
        packed = rng.integers(0, 256, layout.packed_bytes(out, inn, bits), dtype=np.uint8)
        x = rng.integers(0x3c00, 0x3c80, (T, inn), dtype=np.uint16)
        ops.gemv_lq(packed, bits, out, inn, x, False)
        print(f"gemv_lq [{out},{inn}] bits={bits} T={T}: launched", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
