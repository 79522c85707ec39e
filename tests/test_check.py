"""`lampo check` without a GPU: its comparisons against engines built from the numpy reference (a
faithful one passes; one whose rows, routing report, graphed step or speculative replies are off
fails, naming how far), a case that raises, and a machine without the CUDA engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lampo import check, cli
from lampo.engine.cuda import EngineUnavailable
from lampo.engine.protocol import Done, Stats
from lampo.models.bf16 import from_bf16
from lampo.models.presets import get_preset
from lampo.models.quant.quality import synthetic_weights
from lampo.models.quant.round_trip import round_trip
from lampo.models.reference.ffn import Routing
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import write_checkpoint
from lampo.models.tensor_specs import expected_tensors


FULL = Done("length", Stats(draft_n=60, draft_n_accepted=2, draft_rounds=20))  # a reply run to its end


class ReferenceEngine:
    """The calls `lampo check` makes of a CUDA engine, answered by the numpy reference. `noise`
    perturbs every row (MTP drafts' too), `step_noise` only the graphed decode steps,
    `wrong_experts` shifts the reported routing by one expert."""

    def __init__(self, cfg, weights, noise=0.0, step_noise=0.0, wrong_experts=False):
        self.cfg, self.ref, self.drafter = cfg, ReferenceModel(cfg, weights), ReferenceModel(cfg, weights)
        self.noise, self.step_noise, self.wrong_experts = noise, step_noise, wrong_experts
        self.rng = np.random.default_rng(7)
        self.slots, self.chosen, self.row, self.fed = {}, None, None, []

    def _out(self, row, noise):
        row = np.array(row, np.float32)
        real = row[: self.cfg.real_vocab_size]
        real += noise * real.std() * self.rng.standard_normal(real.shape).astype(np.float32)
        self.row = row
        return int(np.argmax(real))

    def reset(self):
        self.ref.reset()
        self.fed = []

    def set_sampling(self, *params):
        pass

    def begin_generation(self):
        pass

    def prefill(self, ids, last):
        routing = Routing()
        row = self.ref.prefill(list(ids), last_only=True, routing=routing)
        self.fed += [int(t) for t in ids]
        if routing.chosen:
            chosen = np.stack(routing.chosen)
            self.chosen = (chosen + 1) % self.cfg.num_experts if self.wrong_experts else chosen
        return self._out(row, self.noise)

    def decode(self, token):
        self.fed.append(int(token))
        return self._out(self.ref.decode(int(token)), self.noise + self.step_noise)

    def mtp_draft(self, token, k):
        drafts = []
        for _ in range(k):  # each draft the argmax of its chain step, as the engine's greedy chain
            row = self.drafter.mtp_chain(self.fed, token, [*drafts, 0])[-1]
            drafts.append(self._out(row, self.noise))
        return drafts

    def routing(self):
        return self.chosen

    def logits(self):
        return self.row

    def snapshot(self, slot):
        self.slots[slot] = (self.ref.snapshot(), list(self.fed))

    def restore(self, slot):
        snap, fed = self.slots[slot]
        self.ref.restore(snap)
        self.fed = list(fed)


class LoadedEngine(ReferenceEngine):
    """A faithful engine as `run_case` makes one: built by the native module's Engine call, fed by
    `load_weights`, quantizing the tensors its `bits` name while they load (as the GPU does)."""

    def __init__(self, cfg, names, bits, *, context_max, prefill_chunk, snapshot_slots, verify_rows):
        self.cfg, self.bits, self.weights, self.recording = cfg, dict(bits), {}, []
        self.specs = expected_tensors(cfg, include_mtp=True)

    def weight_specs(self):
        return [(n, s.shape, s.dtype) for n, s in self.specs.items()]

    def load_tensor(self, name, array, bits=0):
        w = (from_bf16(array) if array.dtype == np.uint16 else np.asarray(array, np.float32)).reshape(self.specs[name].shape)
        self.weights[name] = round_trip(w, self.bits[name]) if name in self.bits else w

    def finish_loading(self):
        ReferenceEngine.__init__(self, self.cfg, self.weights)

    def nonfinite_census(self):
        return []

    def set_record_routing(self, on):
        self.recording.append(on)


class LoadingNative:
    Engine = LoadedEngine


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_a_case_end_to_end_on_a_written_checkpoint(preset, tmp_path, monkeypatch):
    """bf16 and q5: the oracle gets the weights the engine computes with (the numpy quantizer's
    round trip for q5, the MTP layer's included), so a faithful engine's rows agree to rounding,
    not to the quantization error, and the speculative check gets the case's directory and weights."""
    model_dir = write_checkpoint(tmp_path / preset, get_preset(preset), seed=1)
    replies = []

    def greedy_reply(native, directory, weights, speculation, prompt):
        replies.append((directory, weights, speculation.mode))
        return list(range(check.REPLY)), FULL

    monkeypatch.setattr(check, "greedy_reply", greedy_reply)
    for weights in ("bf16", "q5"):
        rows, step, mtp, spec = check.run_case(LoadingNative, model_dir, weights)
        assert [r.check for r in (rows, step, mtp, spec)] == ["rows", "graphed step", "MTP drafts", "speculative"]
        assert rows.ok and max(rows.values["rel_l2"]) < 1e-5, rows.line()
        assert mtp.ok and max(mtp.values["rel_l2"]) < 1e-5, mtp.line()
        assert step.ok and spec.ok and rows.case == f"{preset} {weights}"
    assert replies == [(model_dir, w, m) for w in ("bf16", "q5") for m in ("off", "mtp")]


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def model(request):
    cfg = get_preset(request.param)
    return cfg, synthetic_weights(cfg, seed=3, mtp=True)


def test_a_faithful_engine_passes(model):
    cfg, weights = model
    engine, ref = ReferenceEngine(cfg, weights), ReferenceModel(cfg, weights)
    rows = check.check_rows("case", engine, ref, cfg)
    assert rows.ok and rows.check == "rows" and len(rows.values["rel_l2"]) == 1 + check.STEPS, rows.line()
    assert max(rows.values["rel_l2"]) < 1e-6 and min(rows.values["top5_kept"]) == 5
    assert rows.line().startswith("ok  ")
    step = check.check_graphed_step("case", engine, cfg)
    assert step.ok and step.values["rel_l2"] < 1e-6, step.line()
    mtp = check.check_mtp_drafts("case", engine, ref, cfg)
    assert mtp.ok and len(mtp.values["rel_l2"]) == check.DRAFTS and max(mtp.values["rel_l2"]) < 1e-6, mtp.line()


def test_mtp_drafts_off_by_more_than_the_bound_fail():
    cfg = get_preset("tiny-dense")
    weights = synthetic_weights(cfg, seed=3, mtp=True)
    result = check.check_mtp_drafts("case", ReferenceEngine(cfg, weights, noise=0.1), ReferenceModel(cfg, weights), cfg)
    assert not result.ok and min(result.values["rel_l2"]) > 4e-2, result.line()


def test_rows_off_by_more_than_the_bound_fail(model):
    cfg, weights = model
    result = check.check_rows("case", ReferenceEngine(cfg, weights, noise=0.1), ReferenceModel(cfg, weights), cfg)
    assert not result.ok and result.line().startswith("FAIL")
    assert max(result.values["rel_l2"]) > 4e-2
    assert "worst relative L2 error" in result.detail and "(at most 4e-02)" in result.detail


def test_the_reference_replays_the_experts_the_engine_reports():
    """An engine that computes the right rows but reports other experts than it used fails: the
    oracle runs the reported ones."""
    cfg = get_preset("tiny-moe")
    weights = synthetic_weights(cfg, seed=3, mtp=True)
    result = check.check_rows("case", ReferenceEngine(cfg, weights, wrong_experts=True),
                              ReferenceModel(cfg, weights), cfg)
    assert not result.ok, result.line()


def test_a_graphed_step_that_differs_from_the_prefill_path_fails():
    cfg = get_preset("tiny-dense")
    weights = synthetic_weights(cfg, seed=3, mtp=True)
    engine = ReferenceEngine(cfg, weights, step_noise=1e-2)
    assert check.check_rows("case", engine, ReferenceModel(cfg, weights), cfg).ok  # prefills are exact
    step = check.check_graphed_step("case", engine, cfg)
    assert not step.ok and step.values["rel_l2"] > 1e-3, step.line()


@pytest.mark.parametrize("plain, drafted, gap, ok, says", [
    ((list(range(64)), FULL), (list(range(64)), FULL), None, True,
     "all 64 tokens equal (20 rounds verified 60 drafts, kept 2)"),
    ((list(range(64)), FULL), (list(range(10)) + [0] * 54, FULL), 0.02, True,
     "the first 10 of 64 tokens equal, then the plain path's two candidates lie 0.020 standard deviations apart "
     "(a near-tie: under 0.1)"),
    ((list(range(64)), FULL), (list(range(10)) + [0] * 54, FULL), 0.5, False, "(not a near-tie: at least 0.1)"),
    ((list(range(64)), FULL), (list(range(60)), Done("error", Stats(), "CUDA error: an illegal memory access")), None,
     False, "the mtp:3 reply stopped after 60 of 64 tokens (error: CUDA error: an illegal memory access)"),
    (([], Done("stop", Stats())), ([], Done("stop", Stats())), None, False, "the plain reply stopped after 0 of 64"),
    ((list(range(64)), FULL), (list(range(64)), Done("length", Stats())), None, False,
     "the mtp:3 reply verified no drafts (0 rounds verified 0 drafts, kept 0)"),
])
def test_speculative_replies_must_equal_the_plain_one_to_their_end(plain, drafted, gap, ok, says):
    replies = {"off": plain, "mtp": drafted}
    asked, gaps = [], []

    def reply(speculation):
        asked.append((speculation.mode, speculation.drafts))
        return replies[speculation.mode]

    def tie_gap(prefix, a, b):
        gaps.append((prefix, a, b))
        return gap

    result = check.check_speculative("case", reply, tie_gap)
    assert result.ok is ok and says in result.detail, result.line()
    assert asked == [("off", None), ("mtp", check.DRAFTS)]
    assert gaps == ([] if gap is None else [(list(range(10)), 10, 0)])


def test_the_tie_gap_is_read_on_the_plain_path():
    """plain_tie_gap feeds the prompt and the reply's prefix and measures the two candidates in
    standard deviations of that row (the reference's own row here)."""
    cfg = get_preset("tiny-dense")
    weights = synthetic_weights(cfg, seed=3, mtp=True)
    prompt, prefix = (5, 6, 7, 8), [9, 10]
    gap = check.plain_tie_gap(ReferenceEngine(cfg, weights), cfg, prompt)(prefix, 3, 4)
    row = ReferenceModel(cfg, weights).prefill([*prompt, *prefix])[-1][: cfg.real_vocab_size]
    assert gap == pytest.approx(abs(row[3] - row[4]) / row.std(), rel=1e-5)


def test_a_case_that_raises_is_one_failed_line_and_the_others_still_run(monkeypatch, tmp_path):
    def run_case(native, model_dir, weights):
        if weights == "q5":
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        return [check.Result(f"{model_dir.name} {weights}", "rows", True, "fine")]

    monkeypatch.setattr(check, "write_model", lambda workdir, preset: workdir / preset)
    monkeypatch.setattr(check, "run_case", run_case)
    said = []
    results = check.run_checks(object(), tmp_path, say=said.append)
    assert [(r.case, r.check, r.ok) for r in results] == [
        ("tiny-dense bf16", "rows", True), ("tiny-dense q5", "error", False),
        ("tiny-moe bf16", "rows", True), ("tiny-moe q5", "error", False)]
    assert said[1] == "FAIL  tiny-dense q5    error         RuntimeError: CUDA error: no kernel image is available for execution on the device"


def test_without_the_cuda_engine_there_is_nothing_to_check(monkeypatch, capsys):
    def unavailable():
        raise EngineUnavailable("the CUDA engine is not built in this install (no module named lampo._native)")

    monkeypatch.setattr("lampo.engine.cuda.load_native", unavailable)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lampo check: the CUDA engine is not built in this install") and "nothing to check" in err


class DeviceOnly:
    cuda_architectures = "86,120"

    @staticmethod
    def device_info():
        return {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "sm_count": 128, "memory": 24 << 30,
                "device_code": "8.9"}


def test_a_build_for_an_older_architecture_is_named():
    class Jit(DeviceOnly):
        cuda_architectures = "89"

        @staticmethod
        def device_info():
            return {"name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0", "sm_count": 170,
                    "memory": 32 << 30, "device_code": "8.9"}

    assert check.device_line(Jit) == (
        "NVIDIA GeForce RTX 5090: compute capability 12.0, 170 SMs, 32.0 GiB; engine built for 89; its kernels "
        "run from code for 8.9, compiled by the driver for this GPU (LAMPO_CUDA_ARCH=120 at install builds for it)")


def test_a_build_this_gpu_cannot_load_names_its_fix(monkeypatch, capsys):
    class Unloadable(DeviceOnly):
        @staticmethod
        def device_info():
            raise RuntimeError("this GPU (compute capability 8.9) cannot load the engine's kernels, which were "
                               "built for other GPUs: reinstall Lampo with LAMPO_CUDA_ARCH=89 (README, Requirements)")

    monkeypatch.setattr("lampo.engine.cuda.load_native", Unloadable)
    assert check.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lampo check: this GPU (compute capability 8.9) cannot load") and "LAMPO_CUDA_ARCH=89" in err


@pytest.mark.parametrize("failed", [False, True])
def test_the_report_and_its_json(monkeypatch, capsys, tmp_path, failed):
    monkeypatch.setattr("lampo.engine.cuda.load_native", DeviceOnly)
    results = [check.Result("tiny-dense bf16", "rows", True, "fine"),
               check.Result("tiny-moe q5", "graphed step", not failed, "close", {"rel_l2": 2e-4})]
    monkeypatch.setattr(check, "run_checks", lambda native, workdir: results)
    out_file = tmp_path / "report" / "check.json"
    assert check.main(["--json", str(out_file)]) == (1 if failed else 0)
    out = capsys.readouterr().out
    device = ("NVIDIA GeForce RTX 4090: compute capability 8.9, 128 SMs, 24.0 GiB; engine built for 86,120")
    assert out.splitlines()[0] == device
    assert ("1 of 2 checks passed: please report the failed lines" in out) if failed else ("2 of 2 checks passed\n" in out)
    report = json.loads(out_file.read_text())
    assert report["device"] == device and report["results"][1]["values"] == {"rel_l2": 2e-4}
