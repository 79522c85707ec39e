"""The engine front: everything between a chat and a model engine.

- `protocol`: the `Backend` protocol, its `GenerationRequest` and the events it streams (tokens,
  prefill progress, stats, done);
- `loop`: the one generation loop every backend runs (prefix reuse, chunked prefill, queued
  decode steps, events) over an engine's `EngineSteps`;
- `prefix_cache`: which held state (current or a snapshot slot) a new prompt resumes from;
- `cuda`: `CudaBackend` on the C++/CUDA engine (`lampo._native`), with the memory plan check and
  the weight loading;
- `reference`: `ReferenceBackend` on the numpy reference model (CPU), with speculative decoding;
- `speculation`: the speculative decoding setting (drafter and draft count) a backend takes;
- `picker`: which of the two runs (`lampo chat` and `lampo bench` alike).
"""
