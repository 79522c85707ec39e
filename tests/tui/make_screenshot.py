"""Write docs/screenshot.svg: the real app on the demo checkpoint, through a Pilot run.

Everything on it is real: the numpy reference backend on CPU runs the random-weight demo
checkpoint (hence the gibberish reply and the DEMO label), the HUD shows what that run measured,
and the attachment chip counts the repository README with the real tokenizer.

    python tests/tui/make_screenshot.py [OUT.svg]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


async def shoot(out: Path) -> None:
    from lampo.chat_session import ChatSession
    from lampo.demo import ensure_demo_checkpoint
    from lampo.models.sampling_params import SamplingParams
    from lampo.models.tokenizer import Tokenizer
    from lampo.engine.reference import ReferenceBackend
    from lampo.settings import Settings
    from lampo.store import Store
    from lampo.tui.app import LampoApp

    demo = ensure_demo_checkpoint()
    tokenizer = Tokenizer.from_checkpoint(demo)
    backend = ReferenceBackend(demo, tokenizer=tokenizer)
    store = Store()
    session = ChatSession(backend, tokenizer, store, thinking=False,
                          sampling=SamplingParams(temperature=0.7, seed=7, max_tokens=60))
    app = LampoApp(session, Settings(), export_dir=out.parent)
    async with app.run_test(size=(120, 34)) as pilot:
        app.prompt.cursor_blink = False
        app.prompt.load_text("Give me three tips for writing fast CUDA kernels.")
        await pilot.press("enter")
        while app.generating:
            await pilot.pause(0.2)
        app.attach_file(str(REPO / "README.md"))
        while not app.attachments:
            await pilot.pause(0.1)
        app.prompt.load_text("Summarise this file in two sentences.")
        await pilot.pause(1.0)  # the pending-token count
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))
    store.close()
    backend.close()


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "screenshot.svg"
    with tempfile.TemporaryDirectory() as home:
        os.environ["LAMPO_HOME"] = home  # demo checkpoint, settings and chats stay out of the user's
        asyncio.run(shoot(out))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
