"""The demo checkpoint: a tiny random-weight Qwen3.6-shaped MoE, so Lampo runs with no download.

`ensure_demo_checkpoint()` writes it once into `paths.cache_dir()/demo-qwen3.6-tiny` (preset
`tiny-moe`, fixed seed, the real Qwen3.6 tokenizer; ~150 MB) atomically: it is built in a temp
dir beside the target and renamed into place, and the `LAMPO_DEMO` marker file is written last,
so a half-written directory is never taken for the demo. It talks gibberish; UIs must say so
(`BackendInfo.is_demo`, set from `is_demo_checkpoint`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lampo import paths

DEMO_DIR_NAME = "demo-qwen3.6-tiny"
DEMO_PRESET = "tiny-moe"
DEMO_SEED = 20260101
MARKER = "LAMPO_DEMO"
# Random weights rarely sample a stop token, so demo replies are capped (said at start-up;
# /set max_tokens still overrides it per chat).
DEMO_MAX_TOKENS = 256
MARKER_TEXT = (f"Lampo demo checkpoint: preset {DEMO_PRESET}, seed {DEMO_SEED}, RANDOM weights "
               "(the replies are gibberish). Safe to delete; Lampo recreates it.\n")


def demo_dir() -> Path:
    return paths.cache_dir() / DEMO_DIR_NAME


def is_demo_checkpoint(model_dir: str | Path) -> bool:
    return (Path(model_dir) / MARKER).is_file()


def ensure_demo_checkpoint() -> Path:
    """The demo checkpoint's directory, created on first use."""
    target = demo_dir()
    if is_demo_checkpoint(target):
        return target
    from lampo.models.presets import get_preset
    from lampo.models.synthetic import write_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_DIR_NAME}.tmp-", dir=target.parent))
    try:
        write_checkpoint(tmp, get_preset(DEMO_PRESET), seed=DEMO_SEED, tokenizer=paths.tokenizer_file())
        (tmp / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        if target.exists() and not is_demo_checkpoint(target):  # an unmarked leftover
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError:
        if not is_demo_checkpoint(target):  # not merely another process winning the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
