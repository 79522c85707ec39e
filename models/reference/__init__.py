"""The numpy fp32 reference forward of Qwen3.5/3.6 (the oracle for every CUDA kernel).

Op modules, each a small family of pure functions with its contract in the module docstring:
`norms`, `rope`, `attention`, `kv_int8`, `gated_deltanet`, `ffn`; `layers` assembles one decoder
layer, `mtp` the MTP module, `state` the caches and snapshots, `model.ReferenceModel` the whole model.
"""
