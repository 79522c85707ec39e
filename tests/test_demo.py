"""The demo checkpoint: created once, atomically, marked, and labelled as a demo by the backend."""

import pytest
from helpers import seed_lampo_home

from lampo import demo
from lampo.models.checkpoint import Checkpoint
from lampo.engine.reference import ReferenceBackend


@pytest.fixture
def home(tmp_path, monkeypatch):
    seed_lampo_home(tmp_path)
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    return tmp_path


def leftovers(home):
    return [p.name for p in (home / "cache").iterdir() if p.name != "tokenizer"]


def test_created_once_in_the_cache_dir_and_marked(home):
    path = demo.ensure_demo_checkpoint()
    assert path == home / "cache" / "demo-qwen3.6-tiny" and demo.is_demo_checkpoint(path)
    assert "RANDOM weights" in (path / demo.MARKER).read_text()
    ck = Checkpoint.open(path)
    assert ck.config.is_moe and ck.config.hidden_size == 128 and (path / "tokenizer.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert demo.ensure_demo_checkpoint() == path
    assert (path / "config.json").stat().st_mtime_ns == stamp  # not rewritten
    assert leftovers(home) == [path.name]  # no temp dirs left
    backend = ReferenceBackend(path)
    assert backend.info.is_demo and backend.info.context_max == ck.config.max_position_embeddings


def test_a_failed_write_leaves_nothing_behind(home, monkeypatch):
    import lampo.models.synthetic as synthetic

    def broken(out_dir, *args, **kwargs):
        (out_dir / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(synthetic, "write_checkpoint", broken)
    with pytest.raises(OSError, match="disk full"):
        demo.ensure_demo_checkpoint()
    assert leftovers(home) == []


def test_losing_the_race_to_another_process_is_fine(home, monkeypatch):
    import lampo.models.synthetic as synthetic

    real = synthetic.write_checkpoint

    def racing(out_dir, *args, **kwargs):
        winner = demo.demo_dir()
        winner.mkdir()
        (winner / demo.MARKER).write_text("the other process")
        return real(out_dir, *args, **kwargs)

    monkeypatch.setattr(synthetic, "write_checkpoint", racing)
    assert demo.ensure_demo_checkpoint() == demo.demo_dir()
    assert (demo.demo_dir() / demo.MARKER).read_text() == "the other process"
    assert leftovers(home) == [demo.DEMO_DIR_NAME]


def test_plain_directories_are_not_demos(tmp_path):
    assert not demo.is_demo_checkpoint(tmp_path)
