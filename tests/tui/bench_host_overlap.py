"""Host overlap benchmark: does the chat keep the GPU busy while it streams a reply?

The GPU is modelled, the host is real. `DeviceModel` is a virtual GPU that runs what the host
queues in order, each item for the time a full-size model's kernel work took on an H200 (the
`PROFILES` below: the plain step, the MTP draft chain and the verify window of the 35B-A3B and
the 27B at q5 and 8,192 tokens of context, from docs/benchmarks.md); `TimedEngine` is the fake
native engine of test_engine_cuda_cpu.py on that device, whose "model" emits a fixed reply (a
Markdown document in the real tokenizer's ids) and whose MTP layer drafts it with each draft
right with probability `accept`. Everything above the native module is the real code:
`CudaBackend`, the generation loop, the speculative rounds and their policy, the stream decoder,
and with `--ui` the chat session and the Textual app (headless), whose rendering shares the
interpreter with the generation thread. Every engine call releases the GIL as the pybind module
does (`py::gil_scoped_release`), and a call that waits for the device sleeps until the work is
done.

Reported per profile and mode (plain decoding, speculative rounds at a fixed k, the default
`auto`): tokens per second delivered to the consumer, the device's busy share between the first
decode step and the last, and the tokens per second the device work alone would give. Busy below
100 % is time the GPU would sit idle waiting for the host.

Run as a script (numbers for docs/benchmarks.md):
    python tests/tui/bench_host_overlap.py [--tokens 3000] [--ui] [--repeat N] [--json FILE]
As CPU tests (small sizes; they assert completeness, not speed):
    pytest tests/tui/bench_host_overlap.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `helpers` and the fake native module, also when run as a script
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import test_engine_cuda_cpu as fake  # noqa: E402
from helpers import real_tokenizer  # noqa: E402
from helpers.flood_backend import _DOCUMENT  # noqa: E402

from lampo.chat_session import ChatSession  # noqa: E402
from lampo.engine.cuda import CudaBackend  # noqa: E402
from lampo.engine.process_backend import ProcessBackend  # noqa: E402
from lampo.engine.protocol import Done, GenerationRequest  # noqa: E402
from lampo.engine.speculation import parse_speculation  # noqa: E402
from lampo.models.presets import get_preset  # noqa: E402
from lampo.models.sampling_params import GREEDY, SamplingParams  # noqa: E402
from lampo.models.synthetic import write_checkpoint  # noqa: E402
from lampo.settings import Settings  # noqa: E402
from lampo.store import Store  # noqa: E402
from lampo.tui.app import LampoApp  # noqa: E402


@dataclass(frozen=True)
class Profile:
    """Device milliseconds of one model's work (H200, q5, 8,192 tokens of context, the MTP module
    held): the plain step, the MTP chain per draft, and the verify window (with its accept and
    the kept rows' rebuild) by its number of tokens."""

    step_ms: float
    draft_ms: float
    window_ms: dict[int, float]


# f7666b8 on an H200 (docs/benchmarks.md, "On an H200: f7666b8's windows and rounds"): steps, 4-
# and 5-token windows, chains of 3 and 4 drafts (per draft: their mean). The 2- and 3-token
# windows scale the 4-token one by the ratios 72ea37f measured (1.31 / 1.62 / 1.87 plain steps
# for 2 / 3 / 4 tokens on the 35B-A3B; the 27B's 1.08 / 1.18 / 1.25).
PROFILES = {
    "35b-a3b": Profile(1.933, 0.133, {2: 3.390 * 1.31 / 1.87, 3: 3.390 * 1.62 / 1.87, 4: 3.390, 5: 3.861}),
    "27b": Profile(6.609, 0.272, {2: 7.974 * 1.08 / 1.25, 3: 7.974 * 1.18 / 1.25, 4: 7.974, 5: 8.351}),
}


SPIN_S = 0.0003  # a wait's spinning tail (with the GIL; the engine's synchronize spins without it)


class DeviceModel:
    """A virtual GPU: queued work runs in order, each item for its cost. `idle_s` counts the time
    between the first item's start and the last one's end during which nothing was queued."""

    def __init__(self):
        self.free_at: float | None = None
        self.first_start: float | None = None
        self.busy_s = self.idle_s = 0.0

    def queue(self, ms: float) -> float:
        """Queue `ms` of work now; returns when it ends (perf_counter seconds)."""
        now = time.perf_counter()
        if self.free_at is None:
            self.first_start, start = now, now
        else:
            start = max(now, self.free_at)
            self.idle_s += start - self.free_at
        self.free_at = start + ms / 1000.0
        self.busy_s += ms / 1000.0
        return self.free_at

    @staticmethod
    def wait(until: float) -> None:
        """Block until `until`, as a stream synchronize does: asleep without the GIL, then (a
        sleep wakes 0.1-0.2 ms late) spinning through the last SPIN_S."""
        asleep = until - time.perf_counter() - SPIN_S  # read once: a second read may be past `until`
        if asleep > 0:
            time.sleep(asleep)
        while time.perf_counter() < until:
            pass


class TimedEngine(fake.FakeEngine):
    """The fake engine on a `DeviceModel`: the reply is `native.reply` (then the stop id), MTP
    drafts are its next tokens, each replaced by another id with probability 1 - `native.accept`;
    prefill costs no device time (only decoding is measured)."""

    def begin_generation(self):
        super().begin_generation()
        self.reply_start = None

    def _sample(self) -> int:
        if self.reply_start is None:
            self.reply_start = len(self.history)
        return self._sample_at(len(self.history))

    def decode_submit(self, token=-1):
        super().decode_submit(token)
        self.done_at = self.native.device.queue(self.native.profile.step_ms)
        time.sleep(0)  # the call drops the GIL

    def decode_collect(self):
        self.native.device.wait(self.done_at)
        return super().decode_collect()

    def mtp_draft(self, token, k):
        done = self.native.device.queue(self.native.profile.draft_ms * k)
        at = len(self.history) + 1  # the first draft's position (the history, then `token`)
        drafts = []
        for i in range(k):
            true = self._sample_at(at + i)
            drafts.append(true if self.native.rng.random() < self.native.accept else true + 1)
        self.native.device.wait(done)
        return np.asarray(drafts, np.int32)

    def _sample_at(self, position: int) -> int:
        """The reply's token at `position` of the history (the stop id past its end)."""
        i = position - self.reply_start
        reply = self.native.reply
        return reply[i] if i < len(reply) else fake.STOP

    def verify(self, ids, mtp_drafts=False):
        done = self.native.device.queue(self.native.profile.window_ms[len(ids)])
        tokens = super().verify(ids, mtp_drafts)
        self.native.device.wait(done)
        return tokens

    def accept(self, keep):
        super().accept(keep)
        time.sleep(0)


class TimedNative(fake.FakeNative):
    def __init__(self, profile: Profile, reply: list[int], accept: float, seed: int = 0):
        super().__init__(get_preset("tiny-dense"))
        self.profile, self.reply, self.accept = profile, reply, accept
        self.rng = random.Random(seed)
        self.device = DeviceModel()

    def Engine(self, config, tensor_names, tensor_bits, **options):  # noqa: N802 (mirrors the class)
        return TimedEngine(self, config, tensor_names, tensor_bits, **options)


def reply_ids(tokenizer, n_tokens: int) -> list[int]:
    """`n_tokens` ids of a Markdown reply (the UI benchmark's document, repeated)."""
    ids = tokenizer.encode(_DOCUMENT)
    return (ids * (n_tokens // len(ids) + 1))[:n_tokens]


def document_ids(n_tokens: int) -> list[int]:
    """`n_tokens` ids of a document the reply does not quote (seeded ids of Latin-script text's range)."""
    return [int(t) for t in np.random.default_rng(0).integers(0, 98_304, n_tokens)]


def timed_backend(checkpoint: Path, profile: Profile, mode: str, n_tokens: int, accept: float,
                  say=None, document: int = 0) -> CudaBackend:
    tokenizer = real_tokenizer()
    native = TimedNative(profile, reply_ids(tokenizer, n_tokens), accept)
    return CudaBackend(checkpoint, context_max=32768 + document, native=native, tokenizer=tokenizer,
                       speculation=parse_speculation({"plain": "off"}.get(mode, mode)), say=say)


class ReportingBackend:
    """A backend whose `close` writes its device's account to `path` (JSON), so that a backend in
    a process of its own can report it."""

    def __init__(self, backend: CudaBackend, path: Path):
        self._backend, self._path = backend, path
        self.info, self.generate, self.reset = backend.info, backend.generate, backend.reset

    def close(self) -> None:
        native = self._backend._native
        engine = native.engines[-1]
        self._path.write_text(json.dumps(device_account(native, engine.history[engine.reply_start:])))
        self._backend.close()


def reporting_backend(path: Path, args: tuple, say) -> ReportingBackend:
    """In the backend's process: a timed backend that reports its device when it closes."""
    return ReportingBackend(timed_backend(*args, say=say), path)


def device_account(native: TimedNative, ids: list[int]) -> dict:
    device = native.device
    return {"ids": list(ids), "reply": native.reply, "busy_s": device.busy_s, "idle_s": device.idle_s,
            "first_start": device.first_start, "free_at": device.free_at}


def run_loop(checkpoint: Path, profile: Profile, mode: str, n_tokens: int, accept: float, document: int = 0) -> dict:
    """The generation loop drained in this thread (what `lampo chat --plain` and pipes do), the
    prompt led by `document` ids of a document (prompt-lookup drafts search it every round)."""
    backend = timed_backend(checkpoint, profile, mode, n_tokens, accept, document=document)
    request = GenerationRequest((*document_ids(document), *real_tokenizer().encode("Write me a long answer.")),
                                SamplingParams(**{**GREEDY.to_dict(), "max_tokens": n_tokens + 8}))
    done = None
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Done):
            done = event
    native = backend._native
    engine = native.engines[-1]
    return report(device_account(native, engine.history[engine.reply_start:]), mode, accept, done, "loop") | {
        "document": document}


def run_ui(checkpoint: Path, profile: Profile, mode: str, n_tokens: int, accept: float, home: Path,
           own_process: bool) -> dict:
    """The chat app (headless) streaming the reply: the session's worker thread and the UI thread,
    with the backend in this process or (`own_process`) in a ProcessBackend, as `lampo chat` runs it."""
    return asyncio.run(_run_ui(checkpoint, profile, mode, n_tokens, accept, home, own_process))


async def _run_ui(checkpoint, profile, mode, n_tokens, accept, home, own_process) -> dict:
    path = home / f"device-{mode}-{own_process}.json"
    args = (checkpoint, profile, mode, n_tokens, accept)
    if own_process:
        backend = ProcessBackend(partial(reporting_backend, path, args))
    else:
        backend = reporting_backend(path, args, None)
    session = await reply_in_app(backend, real_tokenizer(), home, "Write me a long answer.", n_tokens + 8)
    backend.close()
    return report(json.loads(path.read_text()), mode, accept, session.last_done,
                  "ui, backend in its own process" if own_process else "ui")


async def reply_in_app(backend, tokenizer, home: Path, message: str, max_tokens: int) -> ChatSession:
    """The chat app (headless, 120 x 40) sends `message` and streams the backend's greedy reply to
    the end; returns the session (its store closed)."""
    session = ChatSession(backend, tokenizer, Store(home / f"app-{time.monotonic_ns()}.sqlite3"),
                          sampling=SamplingParams(**{**GREEDY.to_dict(), "max_tokens": max_tokens}), thinking=False)
    app = LampoApp(session, Settings(), export_dir=home)
    async with app.run_test(size=(120, 40)) as pilot:
        app.prompt.load_text(message)
        app.prompt.action_submit()
        while not app.generating:
            await asyncio.sleep(0.001)
        while app.generating:
            await asyncio.sleep(0.02)
        await app.workers.wait_for_complete()
        await pilot.pause()
    session.store.close()
    return session


def report(account: dict, mode: str, accept: float, done, consumer: str) -> dict:
    """Delivered tokens per second over the device's span from the first decode step to the last."""
    ids, n = account["ids"], len(account["ids"])
    seconds = account["free_at"] - account["first_start"]
    busy, idle = account["busy_s"], account["idle_s"]
    return {"consumer": consumer, "mode": mode, "accept": accept, "tokens": n,
            "complete": done is not None and done.reason == "stop" and ids[:len(account["reply"])] == account["reply"],
            "seconds": round(seconds, 3), "delivered_tok_per_s": round(n / seconds, 1),
            "device_busy_share": round(busy / (busy + idle), 4),
            "device_only_tok_per_s": round(n / busy, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=3000)
    p.add_argument("--accept", type=float, default=0.8)
    p.add_argument("--modes", default="plain,mtp:3", help="speculation settings (plain: off), comma-separated")
    p.add_argument("--profiles", default=",".join(PROFILES))
    p.add_argument("--ui", action="store_true", help="also stream through the chat app (headless)")
    p.add_argument("--document", type=int, default=0,
                   help="ids of an unquoted document before the loop's request (the device times stay the 8,192-token ones)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every measurement, one after another")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        checkpoint = write_checkpoint(home / "tiny-dense", get_preset("tiny-dense"), seed=0)
        for round_ in range(1, args.repeat + 1):
            for name in args.profiles.split(","):
                for mode in args.modes.split(","):
                    runs = [run_loop(checkpoint, PROFILES[name], mode, args.tokens, args.accept, args.document)]
                    if args.ui:
                        runs += [run_ui(checkpoint, PROFILES[name], mode, args.tokens, args.accept, home, own)
                                 for own in (False, True)]
                    for r in runs:
                        r |= {"profile": name, "round": round_}
                        rows.append(r)
                        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "tokens": args.tokens, "accept": args.accept}, indent=1))
    return 0


# ---- CPU tests: the harness is sound (complete replies, the device accounted), small sizes ----
def test_the_loop_streams_the_whole_reply_and_accounts_the_device(tiny_dense_dir):
    for mode in ("plain", "mtp:3"):
        r = run_loop(tiny_dense_dir, PROFILES["35b-a3b"], mode, 120, 0.8)
        assert r["complete"] and r["tokens"] == 120
        assert 0.0 < r["device_busy_share"] <= 1.0


@pytest.mark.parametrize("own_process", [False, True])
def test_the_app_streams_the_whole_reply(tiny_dense_dir, tmp_path, own_process):
    r = run_ui(tiny_dense_dir, PROFILES["35b-a3b"], "mtp:3", 120, 0.8, tmp_path, own_process)
    assert r["complete"] and r["tokens"] == 120 and 0.0 < r["device_busy_share"] <= 1.0


if __name__ == "__main__":
    sys.exit(main())
