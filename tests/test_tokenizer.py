"""Tokenizer wrapper and streaming detokenization on the real Qwen3.6 vocabulary."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from lampo import paths
from lampo.models import tokenizer as tokmod
from lampo.models.tokenizer import Tokenizer, TokenizerError
from lampo.models.tokenizer_build import byte_to_unicode


@pytest.fixture(scope="module")
def shared_path(qwen_dir) -> Path:
    return qwen_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def tok(shared_path) -> Tokenizer:
    return Tokenizer.from_file(shared_path)


def byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    """Ids of the single-byte tokens spelling `data` (the way BPE falls back on rare text)."""
    table = byte_to_unicode()
    return [tok.token_to_id(table[b]) for b in data]


def stream(tok: Tokenizer, ids, chunk: int = 1) -> list[str]:
    sd = tok.stream_decoder()
    pieces = [sd.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return [*pieces, sd.flush()]


@pytest.mark.parametrize(
    ("text", "ids"),
    [("transformers", [4549, 382]), ("人工智能", [109015]), ("Hello!", [9419, 0]),
     ("<|im_start|>", [248045]), ("<|im_end|>", [248046]), ("<think>", [248068])],
)
def test_known_encodings(tok, text, ids):
    assert tok.encode(text) == ids
    assert tok.decode(ids) == text
    assert tok.count(text) == len(ids)


def test_constants_and_lookups(tok):
    assert tok.stop_ids == (248046, 248044)
    assert tok.real_vocab_size == 248077
    assert tok.token_to_id("<|endoftext|>") == 248044
    assert tok.id_to_token(248046) == "<|im_end|>"
    assert tok.id_to_token(9419) == "Hello"
    assert tok.token_to_id("Ġthe") == tok.encode(" the")[0]
    assert tok.token_to_id("no such token anywhere") is None
    assert tok.token_bytes(tok.encode(" the")[0]) == b" the"
    assert tok.token_bytes(248069) == b"</think>"


def test_specials_are_matched_inside_text_and_no_bos(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 248045 and 248046 in ids
    assert tok.encode("") == []


def test_skip_special_keeps_reasoning_markup(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\nanswer<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>\nx\n</think>\n\nanswer"
    assert tok.decode(ids).startswith("<|im_start|>assistant")


def test_decode_rejects_ids_outside_the_real_vocab(tok):
    with pytest.raises(TokenizerError, match="248077"):
        tok.decode([9419, 248077])
    with pytest.raises(TokenizerError, match="-1"):
        tok.id_to_token(-1)


def test_accepts_numpy_ids(tok):
    ids = np.array(tok.encode("numpy ids"), dtype=np.int64)
    assert tok.decode(ids) == "numpy ids"
    sd = tok.stream_decoder()
    assert "".join(sd.push(i) for i in ids) + sd.flush() == "numpy ids"


def test_from_checkpoint(tmp_path, shared_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json in checkpoint folder"):
        Tokenizer.from_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").symlink_to(shared_path)
    assert Tokenizer.from_checkpoint(tmp_path).encode("Hello!") == [9419, 0]


def test_from_file_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        Tokenizer.from_file(garbage)
    other = tmp_path / "other.json"
    tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"a": 0, "b": 1}, merges=[])).save(str(other))
    with pytest.raises(TokenizerError, match="2 ids, expected 248077"):
        Tokenizer.from_file(other)


def test_default_tokenizer_path_builds_once(tmp_path, monkeypatch, shared_path):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    builds = []

    def fake_build(out):
        builds.append(out)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared_path, out)

    monkeypatch.setattr(tokmod, "write_tokenizer_json", fake_build)
    expected = tmp_path / "cache" / "tokenizer" / "qwen3.6-tokenizer.json"
    assert paths.tokenizer_file() == expected
    assert paths.tokenizer_file() == expected
    assert builds == [expected]


@pytest.mark.parametrize("text", ["🎉", "人", "é", "👨‍👩‍👧", "日本語🇯🇵"])
def test_stream_holds_back_split_characters(tok, text):
    data = text.encode("utf-8")
    ids = byte_ids(tok, data)
    pieces = stream(tok, ids)
    assert "".join(pieces) == text
    # Every piece is whole characters: a piece appears exactly when its last byte arrives.
    emitted_at = [i for i, piece in enumerate(pieces) if piece]
    char_ends = np.cumsum([len(c.encode("utf-8")) for c in text]) - 1
    assert set(emitted_at) <= set(char_ends.tolist())
    assert pieces[-1] == ""


def test_stream_mixes_specials_and_text(tok):
    ids = [248045, *tok.encode("assistant\n"), 248068, *byte_ids(tok, "🎉".encode()), 248046]
    pieces = stream(tok, ids)
    assert pieces[0] == "<|im_start|>"
    assert pieces[-2] == "<|im_end|>"
    assert "".join(pieces) == "<|im_start|>assistant\n<think>🎉<|im_end|>"


def test_stream_invalid_bytes_become_replacement_chars(tok):
    sd = tok.stream_decoder()
    assert sd.push(byte_ids(tok, b"\x80")) == "\ufffd"  # a lone continuation byte: never valid
    assert sd.push(byte_ids(tok, b"ok\xe4\xbd")) == "ok"  # an incomplete 3-byte char is held back
    assert sd.flush() == "\ufffd"  # ... and reported at the end
    assert sd.push(tok.encode("again")) == "again"  # flush starts afresh


def test_stream_equals_full_decode_on_long_and_random_streams(tok):
    text = ("Streaming 中文混合 English, emoji 🎉👍🏽, code `x += 1`\n" * 200).strip()
    ids = tok.encode(text)
    assert "".join(stream(tok, ids)) == text
    assert "".join(stream(tok, ids, chunk=7)) == text

    rng = random.Random(1234)
    single_bytes = byte_ids(tok, bytes(range(256)))
    for _ in range(200):
        ids = [rng.choice(single_bytes) if rng.random() < 0.6 else rng.randrange(248077)
               for _ in range(rng.randrange(1, 30))]
        assert "".join(stream(tok, ids, chunk=rng.randrange(1, 4))) == tok.decode(ids), ids
