"""A checkpoint whose tokenizer has ids beyond the model's vocabulary is refused at load, naming both
files and both sizes, before any weight is read (issue case 7: it loaded, and the first reply
failed with "prefill: token id 248045 at index 0 is outside the vocabulary [0, 32768)")."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import tokenizer_json
from helpers.nonfinite import BF16_NAN, plant
from lampo.engine.cuda import CudaBackend
from lampo.models.presets import get_preset
from lampo.models.synthetic import write_checkpoint
from lampo.models.tokenizer import REAL_VOCAB_SIZE, Tokenizer, TokenizerError
from lampo.engine.reference import ReferenceBackend

SMALL = replace(get_preset("tiny-dense"), vocab_size=32_768, name="small-vocab")


def _config_dir(tmp_path: Path, cfg) -> Path:
    """A folder with only config.json and the real tokenizer.json: all `from_checkpoint` reads."""
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    shutil.copyfile(tokenizer_json(), tmp_path / "tokenizer.json")
    return tmp_path


def _assert_names_both(msg: str, model_dir: Path) -> None:
    assert "\n" not in msg
    assert str(model_dir / "tokenizer.json") in msg and str(model_dir / "config.json") in msg
    assert f"{REAL_VOCAB_SIZE:,}" in msg and "32,768" in msg


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path: Path):
    d = _config_dir(tmp_path, SMALL)
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_checkpoint(d)
    _assert_names_both(str(e.value), d)


def test_the_padded_real_vocabulary_fits(tmp_path: Path):
    assert Tokenizer.from_checkpoint(_config_dir(tmp_path, get_preset("tiny-dense"))).real_vocab_size == REAL_VOCAB_SIZE
    exact = replace(get_preset("tiny-dense"), vocab_size=REAL_VOCAB_SIZE)
    assert Tokenizer.from_checkpoint(_config_dir(tmp_path, exact)).real_vocab_size == REAL_VOCAB_SIZE


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole small-vocabulary checkpoint with the real tokenizer, and a NaN in its LM head: the
    vocabulary error must come first, before any weight is read."""
    d = write_checkpoint(tmp_path_factory.mktemp("small-vocab"), SMALL.with_layers(1), tokenizer=tokenizer_json())
    plant(d, "lm_head.weight", [0], BF16_NAN)
    return d


def test_reference_backend_refuses_before_reading_weights(small_checkpoint: Path):
    with pytest.raises(TokenizerError) as e:
        ReferenceBackend(small_checkpoint)
    _assert_names_both(str(e.value), small_checkpoint)


class NoEngine:
    """A native module that must not be reached: the tokenizer is refused first."""

    def mem_info(self):
        raise AssertionError("the engine was planned before the tokenizer was checked")


def test_cuda_backend_refuses_before_creating_the_engine(small_checkpoint: Path):
    with pytest.raises(TokenizerError) as e:
        CudaBackend(small_checkpoint, native=NoEngine())
    _assert_names_both(str(e.value), small_checkpoint)
