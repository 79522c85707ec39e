"""CudaBackend and `lampo bench` logic that needs no GPU: the native module is replaced by a fake
whose "model" is a deterministic function of the token history, so prefix reuse, snapshots,
stopping, cancellation and error recovery can be checked exactly."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace

import numpy as np
import pytest

from helpers import TagTokenizer
from lampo import bench
from lampo.engine.cuda import CudaBackend, EngineUnavailable, create_engine, load_weights
from lampo.engine.protocol import ContextOverflow, Done, GenerationRequest, PrefillProgress, TokenEvent
from lampo.engine.speculation import Speculation
from lampo.models.checkpoint import Checkpoint
from lampo.models.config import ModelConfig
from lampo.models.presets import get_preset
from lampo.models.sampling_params import GREEDY
from lampo.models.tensor_specs import engine_tensor_names, expected_tensors

STOP = 248046
GIB = 1 << 30
MTP_MISS_EVERY = 5  # the fake MTP layer drafts one token off at every fifth position


# ---- the fake native module -------------------------------------------------------------------
class FakeCudaError(RuntimeError):
    pass


def next_token(history: list[int]) -> int:
    """The fake model: the next token is a fixed function of everything fed so far."""
    return 1000 + sum((i + 1) * t for i, t in enumerate(history)) % 997


class FakeEngine:
    def __init__(self, native: "FakeNative", config: ModelConfig, tensor_names: dict[str, str],
                 tensor_bits: dict[str, int], *, context_max: int, prefill_chunk: int, snapshot_slots: int,
                 vram_limit: int, verify_rows: int = 0):
        self.has_mtp = "mtp.fc" in tensor_names  # the MTP module asked for (its roles named)
        self.real_vocab_size, self.draft_vocab = config.real_vocab_size, 0
        assert isinstance(config, ModelConfig) and tensor_names == engine_tensor_names(config, self.has_mtp)
        self.native, self.config, self.tensor_bits, self.vram_limit = native, config, tensor_bits, vram_limit
        self.context_max, self.prefill_chunk, self.snapshot_slots = context_max, prefill_chunk, snapshot_slots
        self.verify_rows, self.verified = verify_rows, None  # (start, rows) of the last verify
        self.loaded: list[str] = []
        self.stored_bits: dict[str, int] = {}
        self.history: list[int] = []
        self.slots: dict[int, list[int]] = {}
        self.pending = -1
        self.queued, self.fed = 0, -1
        self.calls: list[tuple] = []
        native.engines.append(self)

    def weight_specs(self):
        return [(n, s.shape, s.dtype) for n, s in expected_tensors(self.native.cfg, include_mtp=self.has_mtp).items()]

    def load_tensor(self, name, array, bits=0):
        self.loaded.append(name)
        self.stored_bits[name] = bits

    def load_tensor_fp8(self, name, parts, block_rows, block_cols):
        self.load_tensor(name, None)

    def finish_loading(self):
        self.calls.append(("finish_loading",))

    def nonfinite_census(self):
        self.calls.append(("nonfinite_census",))
        return []

    @property
    def position(self) -> int:
        return len(self.history)

    def reset(self):
        self.calls.append(("reset",))
        self.history = []

    def snapshot(self, slot):
        self.calls.append(("snapshot", slot, self.position))
        self.slots[slot] = list(self.history)

    def restore(self, slot):
        self.calls.append(("restore", slot))
        self.history = list(self.slots[slot])

    def set_sampling(self, *args):
        self.calls.append(("set_sampling", *args))
        self.temperature, self.seed = args[0], args[-1]

    def begin_generation(self):
        self.step = 0  # the sampler's RNG step, as the engine's d_step

    def prefill(self, ids, sample):
        assert 1 <= len(ids) <= self.prefill_chunk and ids.dtype == np.int32
        assert self.position + len(ids) <= self.context_max
        self.calls.append(("prefill", len(ids), bool(sample)))
        self.verified = None
        self.history += [int(t) for t in ids]
        self.pending = self._sample() if sample else -1
        return self.pending

    def decode_submit(self, token=-1):  # like the engine's queued step, it runs (here) when collected
        assert self.queued == 0, "the backend keeps at most one step queued"
        assert token >= 0 or self.pending >= 0, "no sample to feed"
        self.queued, self.fed = 1, (self.pending if token < 0 else token)
        self.verified = None

    def decode_collect(self):
        assert self.queued == 1
        self.queued = 0
        if self.native.fail_at_decode is not None and len(self.history) >= self.native.fail_at_decode:
            self.native.fail_at_decode = None
            raise FakeCudaError("attn_decode_int8: an illegal memory access was encountered")
        self.history.append(self.fed)
        self.pending = self._sample()
        return self.pending

    def verify(self, ids, mtp_drafts=False):  # each row's sampled token, row after row; kept until the next forward
        assert 2 <= len(ids) <= self.verify_rows and ids.dtype == np.int32 and self.queued == 0
        assert not mtp_drafts or self.has_mtp, "MTP drafts need the module"
        self.calls.append(("verify", len(ids)))
        self.mtp_verified = mtp_drafts
        start, tokens = len(self.history), []
        for t in ids:
            self.history.append(int(t))
            tokens.append(self._sample())
        self.verified = (start, len(ids))
        return np.asarray(tokens, np.int32)

    def accept(self, keep):
        start, rows = self.verified
        assert 1 <= keep <= rows
        self.calls.append(("accept", keep))
        del self.history[start + keep:]  # the rows not kept; `pending` stays

    def mtp_draft(self, token, k):
        """The model's own continuation of the history and `token`, except that every draft at a
        position divisible by MTP_MISS_EVERY is off by one: some rounds keep all, some stop early."""
        assert self.has_mtp and self.queued == 0 and self.history, "MTP drafts start from a trunk row"
        self.calls.append(("mtp_draft", k))
        self.verified = None
        history, drafts = self.history + [int(token)], []
        for _ in range(k):
            t = next_token(history)
            drafts.append(t + 1 if len(history) % MTP_MISS_EVERY == 0 else t)
            history.append(drafts[-1])
        return np.asarray(drafts, np.int32)

    def _sample(self) -> int:
        """The model's token; with a temperature, it or one of the two after it (0.6 / 0.3 / 0.1),
        drawn from an RNG keyed by the seed and the step, one step per draw."""
        if self.native.stop_at is not None and len(self.history) >= self.native.stop_at:
            return STOP
        token = next_token(self.history)
        if getattr(self, "temperature", 0.0) > 0.0:
            token += int(np.random.default_rng([self.seed, self.step]).choice(3, p=[0.6, 0.3, 0.1]))
            self.step += 1
        return token

    def healthy(self):
        return self.native.healthy


class FakeNative:
    CudaError = FakeCudaError

    def __init__(self, cfg, free=100 * GIB, total=141 * GIB):
        self.cfg, self.free, self.total = cfg, free, total
        self.engines: list[FakeEngine] = []
        self.fail_at_decode: int | None = None
        self.stop_at: int | None = None
        self.healthy = True
        self.device_resets = 0

    def Engine(self, config, tensor_names, tensor_bits, **options):  # noqa: N802 (mirrors the class)
        return FakeEngine(self, config, tensor_names, tensor_bits, **options)

    def mem_info(self):
        return self.free, self.total

    def reset_device(self):
        self.device_resets += 1


@pytest.fixture
def backend(tiny_dense_dir):
    """A backend of plain decode steps (the verify rounds of the default, auto, have their own
    tests in test_engine_cuda_speculative.py)."""
    native = FakeNative(get_preset("tiny-dense"))
    b = CudaBackend(tiny_dense_dir, context_max=64, prefill_chunk=4, snapshot_slots=2, native=native,
                    tokenizer=TagTokenizer(), speculation=Speculation("off"))
    return b, native


def run(b: CudaBackend, prompt, max_tokens=5, snapshot_at=(), cancel=None):
    req = GenerationRequest(tuple(prompt), GREEDY.__class__(**{**GREEDY.to_dict(), "max_tokens": max_tokens}),
                            snapshot_at=snapshot_at)
    events = list(b.generate(req, cancel or threading.Event()))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    ids = [i for e in events if isinstance(e, TokenEvent) for i in e.ids]
    return events, ids


def fresh_generation(prompt, n):
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return out


# ---- setup ------------------------------------------------------------------------------------
def test_a_converted_checkpoint_loads_as_stored(tiny_dense_dir, tmp_path):
    from lampo.models.quant.convert import convert
    from lampo.models.quant.engine_formats import engine_tensor_bits

    convert(tiny_dense_dir, tmp_path / "q5", "q5")
    native = FakeNative(get_preset("tiny-dense"))
    b = CudaBackend(tmp_path / "q5", native=native, tokenizer=TagTokenizer())
    engine = native.engines[-1]
    ck = Checkpoint.open(tmp_path / "q5")
    assert b.weight_format == "q5"
    assert engine.has_mtp  # auto drafts with the module: its matrices load as stored too
    assert engine.tensor_bits == engine_tensor_bits(ck.config, {n: t.bits for n, t in ck.lq.tensors.items()}, True)
    assert engine.tensor_bits  # some matrices stay LQ in the engine
    for name in engine.loaded:  # every tensor arrives as stored, packed ones with their width
        packed = ck.quantized(name)
        assert engine.stored_bits[name] == (packed.bits if packed else 0)
    assert any(engine.stored_bits.values())


def test_a_bf16_checkpoint_is_quantized_while_loading_unless_bf16_is_asked(tiny_dense_dir):
    from lampo.models.quant.engine_formats import recipe_tensor_bits

    cfg = get_preset("tiny-dense")
    native = FakeNative(cfg)
    assert CudaBackend(tiny_dense_dir, native=native, tokenizer=TagTokenizer()).weight_format == "q5"
    assert native.engines[-1].tensor_bits == recipe_tensor_bits(native.engines[-1].config, "q5", True)  # MTP too
    assert not any(native.engines[-1].stored_bits.values())  # bf16 arrives; the engine quantizes
    assert CudaBackend(tiny_dense_dir, native=native, tokenizer=TagTokenizer(), weights="bf16").weight_format == "bf16"
    assert native.engines[-1].tensor_bits == {}
    assert CudaBackend(tiny_dense_dir, native=native, tokenizer=TagTokenizer(), weights="q4").weight_format == "q4"


def test_a_converted_checkpoint_is_not_quantized_again(tiny_dense_dir, tmp_path):
    from lampo.models.quant.convert import convert

    convert(tiny_dense_dir, tmp_path / "q5", "q5")
    native = FakeNative(get_preset("tiny-dense"))
    with pytest.raises(EngineUnavailable, match="already quantized \\(q5\\).*--recipe q4"):
        CudaBackend(tmp_path / "q5", native=native, tokenizer=TagTokenizer(), weights="q4")
    b = CudaBackend(tmp_path / "q5", native=native, tokenizer=TagTokenizer(), weights="bf16")  # dequantized on load
    assert b.weight_format == "bf16" and native.engines[-1].tensor_bits == {}


def test_auto_weights_take_the_best_recipe_that_fits_the_card_or_the_limit():
    from lampo.engine.cuda import resolve_weights

    cfg = get_preset("qwen3.6-35b-a3b")
    sizes = dict(context_max=cfg.max_position_embeddings, snapshot_slots=0)
    assert resolve_weights(FakeNative(cfg, free=120 * GIB), cfg, "auto", None, **sizes)[0] == "q5"
    assert resolve_weights(FakeNative(cfg, free=22 * GIB), cfg, "auto", None, **sizes)[0] == "q4"
    assert resolve_weights(FakeNative(cfg, free=120 * GIB), cfg, "auto", None, vram_limit=22 * GIB, **sizes)[0] == "q4"


def test_the_vram_limit_caps_the_plan_and_reaches_the_engine():
    cfg = get_preset("qwen3.6-35b-a3b")
    with pytest.raises(EngineUnavailable, match="not enough GPU memory.*--vram-limit 20.00 GiB"):
        create_engine(FakeNative(cfg, free=120 * GIB), cfg, context_max=cfg.max_position_embeddings, weights="q4",
                      vram_limit=20 * GIB)
    engine = create_engine(FakeNative(cfg, free=120 * GIB), cfg, context_max=cfg.max_position_embeddings, weights="q4",
                           vram_limit=23 * GIB)
    assert engine.vram_limit == 23 * GIB


def test_memory_plan_refusal_names_the_plan_and_a_context_that_fits():
    cfg = get_preset("qwen3.6-35b-a3b")
    with pytest.raises(EngineUnavailable) as e:
        create_engine(FakeNative(cfg, free=67 * GIB), cfg, context_max=cfg.max_position_embeddings)
    msg = str(e.value)
    assert "not enough GPU memory" in msg and "try --context" in msg
    assert "KV cache (trunk)" in msg and "weights (text)" in msg
    suggested = int(re.search(r"--context (\d+)", msg).group(1))
    assert 0 < suggested < cfg.max_position_embeddings
    engine = create_engine(FakeNative(cfg, free=67 * GIB), cfg, context_max=suggested)  # the suggestion fits
    assert engine.context_max == suggested and engine.snapshot_slots == 4
    assert engine.config is cfg  # the engine takes the parsed config itself


def test_load_weights_walks_the_shards_and_skips_mtp(tiny_dense_dir):
    ck = Checkpoint.open(tiny_dense_dir, include_mtp=False)
    native = FakeNative(ck.config)
    engine = native.Engine(ck.config, engine_tensor_names(ck.config), {}, context_max=64, prefill_chunk=4,
                           snapshot_slots=1, vram_limit=0)
    seen = []
    n = load_weights(engine, ck, lambda done, total: seen.append((done, total)))
    expected = [name for _path, names in ck.shards() for name in names]
    assert engine.loaded == expected and not any(name.startswith("mtp.") for name in engine.loaded)
    assert set(engine.loaded) == {name for name, _s, _d in engine.weight_specs()}
    assert seen[-1] == (n, n) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    assert engine.calls[-2:] == [("finish_loading",), ("nonfinite_census",)]


def test_an_fp8_checkpoint_reaches_the_engine_as_its_bf16_twin(tiny_moe_dir, tmp_path):
    """Tensors stored as FP8 throughout reach the engine as codes and scales (the GPU decodes them) and
    decode to the twin's bf16 arrays; the rest reach it as the twin's arrays."""
    from helpers.fp8_checkpoints import bf16_twin
    from lampo.models.fp8 import dequantize_bf16
    from lampo.models.fp8_release import publish_fp8

    fp8 = publish_fp8(tiny_moe_dir, tmp_path / "fp8", block=(64, 64))
    twin = bf16_twin(fp8, tmp_path / "twin")
    arrays, as_fp8 = [], {}
    for model_dir in (fp8, twin):
        ck = Checkpoint.open(model_dir)
        native = FakeNative(ck.config)
        engine = native.Engine(ck.config, engine_tensor_names(ck.config, True), {}, context_max=64, prefill_chunk=4,
                               snapshot_slots=1, vram_limit=0)
        got = {}
        engine.load_tensor = lambda name, array, bits=0: got.setdefault(name, (np.array(array), bits))

        def load_fp8(name, parts, block_rows, block_cols, got=got):
            as_fp8[name] = len(parts)
            decoded = [dequantize_bf16(codes, scales, (block_rows, block_cols)) for codes, scales in parts]
            got.setdefault(name, (np.concatenate(decoded), 0))

        engine.load_tensor_fp8 = load_fp8
        seen = []
        n = load_weights(engine, ck, lambda done, total: seen.append((done, total)))
        assert n == ck.total_bytes and seen[-1] == (n, n)
        assert set(got) == {name for name, _s, _d in engine.weight_specs()}
        arrays.append(got)
    bank = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert as_fp8[bank] == 2 * get_preset("tiny-moe").num_experts  # each expert's gate and up matrices
    assert "model.language_model.embed_tokens.weight" not in as_fp8  # bf16 in the release
    for name, (array, bits) in arrays[1].items():
        assert bits == 0 and arrays[0][name][1] == 0
        np.testing.assert_array_equal(arrays[0][name][0].reshape(array.shape), array, err_msg=name)


# ---- generation -------------------------------------------------------------------------------
def test_generation_streams_the_model_and_reuses_the_prefix(backend):
    b, native = backend
    engine = native.engines[0]
    p1 = list(range(1, 11))
    events, ids = run(b, p1, max_tokens=5, snapshot_at=(6,))
    assert ids == fresh_generation(p1, 5)
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "".join(f"<{i}>" for i in ids)
    assert [c for c in engine.calls if c[0] == "prefill"] == [("prefill", 4, False), ("prefill", 2, False),
                                                             ("prefill", 4, True)]
    assert ("snapshot", 0, 6) in engine.calls
    assert events[-1].reason == "length" and events[-1].stats.predicted_n == 5
    assert [e.done for e in events if isinstance(e, PrefillProgress)] == [4, 6, 10]

    # next turn continues the current state: only the new tokens are prefilled
    p2 = p1 + ids + [7, 8]
    engine.calls.clear()
    events, ids2 = run(b, p2, max_tokens=3)
    assert ids2 == fresh_generation(p2, 3)
    assert events[-1].stats.cached_n == len(p1) + len(ids) - 1  # the last reply token was never fed
    assert sum(c[1] for c in engine.calls if c[0] == "prefill") == 3

    # a prompt diverging after position 6 resumes from the snapshot
    p3 = p1[:6] + [42, 43]
    engine.calls.clear()
    events, ids3 = run(b, p3, max_tokens=3)
    assert ("restore", 0) in engine.calls and events[-1].stats.cached_n == 6
    assert ids3 == fresh_generation(p3, 3)


def test_overflow_is_refused_before_any_work(backend):
    b, native = backend
    native.engines[0].calls.clear()
    with pytest.raises(ContextOverflow) as e:
        b.generate(GenerationRequest(tuple(range(65))), threading.Event())
    assert e.value.context_max == 64 and native.engines[0].calls == []


def test_stop_id_and_context_end(backend):
    b, native = backend
    native.stop_at = 12  # the model emits <|im_end|> once 12 tokens are in the state
    events, ids = run(b, list(range(1, 11)), max_tokens=50)
    assert events[-1].reason == "stop" and len(ids) == 2 and STOP not in ids
    native.stop_at = None
    b.reset()
    events, ids = run(b, list(range(1, 61)), max_tokens=50)
    assert events[-1].reason == "context" and len(ids) == 4  # prompt + reply == context_max


def test_cancel_between_prefill_chunks_keeps_the_prefilled_state(backend):
    b, _native = backend
    cancel = threading.Event()
    prompt = list(range(1, 15))
    events = []
    for e in b.generate(GenerationRequest(tuple(prompt)), cancel):
        events.append(e)
        if isinstance(e, PrefillProgress):
            cancel.set()
    assert events[-1].reason == "cancelled" and not any(isinstance(e, TokenEvent) for e in events)
    events, _ = run(b, prompt, max_tokens=1)
    assert events[-1].stats.cached_n == 4  # resumed after the one chunk that ran


@pytest.mark.parametrize("healthy", [True, False])
def test_cuda_error_ends_the_call_and_the_backend_recovers(backend, healthy):
    b, native = backend
    native.fail_at_decode = 12
    native.healthy = healthy
    events, ids = run(b, list(range(1, 11)), max_tokens=10)
    done = events[-1]
    assert done.reason == "error" and "attn_decode_int8" in done.error and len(ids) == 3
    assert native.device_resets == (0 if healthy else 1)
    assert len(native.engines) == (1 if healthy else 2)  # rebuilt (and reloaded) after a sticky error
    native.healthy = True
    prompt = list(range(1, 11))
    events, ids = run(b, prompt, max_tokens=4)
    assert events[-1].reason == "length" and events[-1].stats.cached_n == 0 and ids == fresh_generation(prompt, 4)


# ---- lampo bench ------------------------------------------------------------------------------
def test_bench_arguments_and_workload_planning():
    args = bench.build_parser().parse_args(["--preset", "qwen3.6-35b-a3b", "--random-weights",
                                            "--prompt", "8192,65_536", "--depths", "0,300_000"])
    assert args.prompt == [8192, 65536] and args.depths == [0, 300_000]
    cfg, model_dir = bench.resolve_model(args)
    assert model_dir is None and cfg.num_hidden_layers == 40
    w = bench.plan_workload(args, cfg, cuda=True)
    assert w.context_max == cfg.max_position_embeddings and w.prompts == [8192, 65536]
    assert w.depths[0] == 0 and w.depths[1] < cfg.max_position_embeddings and "lowered" in w.notes[0]
    assert w.depths[1] + bench.WARMUP_STEPS + w.decode_tokens + w.profile_steps + 1 <= w.context_max
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--prompt", "8k"])
    with pytest.raises(ValueError, match="--random-weights"):
        bench.resolve_model(bench.build_parser().parse_args(["--preset", "tiny-dense"]))
    cpu = bench.plan_workload(bench.build_parser().parse_args([]), get_preset("tiny-moe"), cuda=False)
    assert cpu.prompts == [64] and cpu.decode_tokens == 8 and cpu.profile_steps == 0


def test_bench_default_depths_reach_the_models_context():
    args = bench.build_parser().parse_args(["--preset", "qwen3.6-35b-a3b", "--random-weights"])
    cfg, _ = bench.resolve_model(args)
    tail = bench.WARMUP_STEPS + 128 + args.profile_steps + 1
    w = bench.plan_workload(args, cfg, cuda=True)
    assert w.context_max == cfg.max_position_embeddings
    assert w.depths == [0, 8192, 65536, cfg.max_position_embeddings - tail]
    short = replace(cfg, max_position_embeddings=32_768)  # 65,536 and the model's 32,768 both lowered
    args.prompt = [8192]
    w = bench.plan_workload(args, short, cuda=True)
    assert w.context_max == 32_768 and w.depths == [0, 8192, 32_768 - tail]


def test_bench_marks_runs_with_omitted_ops(monkeypatch):
    """LAMPO_OMIT_OPS (a timing diagnostic of the CUDA engine) is stated in the report, never silent."""
    args = bench.build_parser().parse_args(["--preset", "tiny-moe", "--random-weights"])
    cfg, _ = bench.resolve_model(args)
    assert not any("LAMPO_OMIT_OPS" in n for n in bench.plan_workload(args, cfg, cuda=True).notes)
    monkeypatch.setenv("LAMPO_OMIT_OPS", "norms,moe_router")
    notes = bench.plan_workload(args, cfg, cuda=True).notes
    assert any(n.startswith("LAMPO_OMIT_OPS=norms,moe_router:") and "meaningless" in n for n in notes)
    assert not any("LAMPO_OMIT_OPS" in n for n in bench.plan_workload(args, cfg, cuda=False).notes)


def test_bytes_per_token_roofline_terms():
    cfg = get_preset("qwen3.6-35b-a3b")
    b0, b1 = bench.bytes_per_token(cfg, 0), bench.bytes_per_token(cfg, cfg.max_position_embeddings)
    assert 5.8e9 < b0["weights"] < 6.0e9  # ~2.95 B active params in bf16
    assert b0["kv_cache"] == 0 and 2.7e9 < b1["kv_cache"] < 2.8e9  # INT8 + fp16 scales, 10 layers
    assert b0["gdn_state"] == b1["gdn_state"] > 2 * 60 * (1 << 20)


def test_bench_runs_on_the_reference_backend(tiny_moe_dir, tmp_path):
    out = tmp_path / "bench.json"
    rc = bench.main(["--model", str(tiny_moe_dir), "--backend", "reference", "--prompt", "5",
                     "--depths", "0,6", "--decode-tokens", "2", "--chunk", "4", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["backend"] == "reference" and r["prefill"][0]["tokens"] == 5
    assert [d["depth"] for d in r["decode"]] == [1, 6]
    assert all(d["tokens_per_second"] > 0 for d in r["decode"])
    assert r["command"].startswith("lampo bench --model")
