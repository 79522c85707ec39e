"""The Qwen3.6 chat format in plain Python, rendering exactly like `chat_template.jinja`.

Covered features of the official template (qwen3.6-architecture.md §6.4): an optional system
message (first only), user and assistant turns with contents trimmed, assistant reasoning
re-emitted as `<think>\\n…\\n</think>\\n\\n` only for turns after the last real user query (or
for all turns with preserve_thinking), tool definitions in the system turn, past tool calls in
the template's XML syntax, `tool` results merged into one user turn of `<tool_response>` blocks,
and the generation prompt (`<think>\\n`, or an empty think block when thinking is off).
Multimodal content is not supported (Lampo is text-only).
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lampo.models.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")

_TOOLS_HEADER = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)


_TURN_START = "<|im_start|>"
_USER_TURN = _TURN_START + "user\n"
TURN_MEMO_CHARS = 2_500_000  # text whose turns a TurnEncoder keeps: about two full contexts of English


class ChatFormatError(ValueError):
    """The conversation cannot be rendered (the template would raise)."""


@dataclass(frozen=True)
class ToolCall:
    """A past function call of the assistant; string arguments are written raw, others as JSON."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """One conversation message. `reasoning` non-empty is the assistant's reasoning; when empty,
    reasoning is split out of `content` at `</think>` if present (as the template does)."""

    role: str
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt. `reuse_boundary` counts the tokens up to and including the
    `<|im_end|>\\n` of the last real user query: that prefix renders identically when the
    conversation continues (later reasoning is dropped on re-render), so its state is worth
    keeping."""

    text: str
    ids: tuple[int, ...]
    reuse_boundary: int


def render(
    messages: Sequence[Message],
    *,
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
    preserve_thinking: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The prompt text the official template renders for these arguments."""
    return _render(messages, enable_thinking, add_generation_prompt, preserve_thinking, tools)[0]


def build_prompt(
    tokenizer: Tokenizer | TurnEncoder,
    messages: Sequence[Message],
    *,
    enable_thinking: bool = True,
    preserve_thinking: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Prompt:
    """Render with the generation prompt and tokenise."""
    text, boundary = _render(messages, enable_thinking, True, preserve_thinking, tools)
    # The boundary is followed by `<|im_start|>`, an added token the tokenizer splits on before
    # anything else, so encoding the two halves separately gives exactly the ids of the whole.
    head = tokenizer.encode(text[:boundary])
    return Prompt(text, tuple(head + tokenizer.encode(text[boundary:])), len(head))


class PromptCounter:
    """Token counts of conversations as `build_prompt` would give them, for a context meter that
    recounts on every keystroke: only the last user turn is tokenized each time; the history
    before it is memoised (one entry: the live history). The split falls just before
    `<|im_start|>`, an added token the tokenizer splits on first, so the two counts add up to the
    whole exactly."""

    def __init__(self, tokenizer: Tokenizer | TurnEncoder):
        self._tokenizer = tokenizer
        self._memo: tuple[str, int] = ("", 0)  # (history text, its token count)

    def prompt_tokens(self, messages: Sequence[Message], *, enable_thinking: bool = True) -> int:
        """Tokens of the prompt for these messages, generation prompt included."""
        text = render(messages, enable_thinking=enable_thinking)
        last_turn = text.rfind(_USER_TURN)
        return self._history_tokens(text[:last_turn]) + self._tokenizer.count(text[last_turn:])

    def conversation_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens of the conversation as it stands (no generation prompt): what an engine holds
        after the last reply."""
        return self._tokenizer.count(render(messages, add_generation_prompt=False))

    def _history_tokens(self, text: str) -> int:
        if self._memo[0] != text:
            self._memo = (text, self._tokenizer.count(text))
        return self._memo[1]


class TurnEncoder:
    """A tokenizer's `encode` and `count` for rendered conversations, which repeat their earlier
    turns from one call to the next (a conversation that grows, a context meter that recounts as
    the user types): the text is cut before every `<|im_start|>`, an added token the tokenizer
    splits on before normalising or anything else, so the pieces' ids join to exactly the whole
    text's; each piece is tokenized once and kept while it is among the last `memo_chars`
    characters of pieces used. A follow-up question to a 250,000-token document then tokenizes
    only the new turns, not the document again. Safe to share between threads."""

    def __init__(self, tokenizer: Tokenizer, memo_chars: int = TURN_MEMO_CHARS):
        self._tokenizer, self._memo_chars = tokenizer, memo_chars
        self._memo: OrderedDict[str, array] = OrderedDict()  # int32 ids; least recently used first
        self._chars = 0
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._pieces(text):
            ids += piece
        return ids

    def count(self, text: str) -> int:
        return sum(map(len, self._pieces(text)))

    def _pieces(self, text: str) -> Iterator[array]:
        """The ids of the text's pieces, in order: what precedes the first `<|im_start|>`, then each
        turn from its `<|im_start|>` to the next."""
        first, *turns = text.split(_TURN_START)
        if first:
            yield self._piece(first)
        for turn in turns:
            yield self._piece(_TURN_START + turn)

    def _piece(self, piece: str) -> array:
        with self._lock:
            ids = self._memo.get(piece)
            if ids is not None:
                self._memo.move_to_end(piece)
                return ids
        ids = array("i", self._tokenizer.encode(piece))  # outside the lock: it takes a while
        with self._lock:
            if piece not in self._memo:
                self._memo[piece] = ids
                self._chars += len(piece)
            while self._chars > self._memo_chars and len(self._memo) > 1:
                old, _ = self._memo.popitem(last=False)
                self._chars -= len(old)
        return ids


def split_reasoning(raw_text: str, thinking: bool = True) -> tuple[str, str]:
    """(reasoning, answer) of a generation. After a thinking-on prompt (which already holds
    `<think>\\n`) everything before `</think>` is reasoning, and without `</think>` yet, everything
    is; after a thinking-off prompt it is all answer. Both parts are trimmed."""
    if not thinking:
        return "", raw_text.strip()
    reasoning, closed, answer = raw_text.partition("</think>")
    reasoning = reasoning.split("<think>")[-1]
    return reasoning.strip(), (answer.strip() if closed else "")


def _render(
    messages: Sequence[Message],
    enable_thinking: bool,
    add_generation_prompt: bool,
    preserve_thinking: bool,
    tools: Sequence[Mapping[str, Any]] | None,
) -> tuple[str, int]:
    """(text, end offset of the last real user query's turn)."""
    if not messages:
        raise ChatFormatError("no messages to render")
    for i, message in enumerate(messages):
        if message.role not in ROLES:
            raise ChatFormatError(f"message {i}: unexpected role {message.role!r} (not in {ROLES})")
        if i > 0 and message.role == "system":
            raise ChatFormatError(f"message {i}: a system message is allowed only first")
        if not isinstance(message.content, str):
            raise ChatFormatError(f"message {i}: content must be a string")
    last_query = _last_query_index(messages)

    out = [_system_turn(messages[0], tools)]
    boundary = 0
    for i, message in enumerate(messages):
        content = message.content.strip()
        if message.role == "user":
            out.append(f"{_USER_TURN}{content}<|im_end|>\n")
            if i == last_query:
                boundary = sum(map(len, out))
        elif message.role == "assistant":
            show_reasoning = preserve_thinking or i > last_query
            out.append(_assistant_turn(message, content, show_reasoning))
        elif message.role == "tool":
            if i > 0 and messages[i - 1].role != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1].role != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        out.append("<think>\n" if enable_thinking else "<think>\n\n</think>\n\n")
    return "".join(out), boundary


def _system_turn(first: Message, tools: Sequence[Mapping[str, Any]] | None) -> str:
    system_text = first.content.strip() if first.role == "system" else ""
    if tools:
        listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        extra = "\n\n" + system_text if system_text else ""
        return f"{_TOOLS_HEADER}{listed}{_TOOLS_FOOTER}{extra}<|im_end|>\n"
    if first.role == "system":
        return f"<|im_start|>system\n{system_text}<|im_end|>\n"
    return ""


def _last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last user message that is not just wrapped tool responses."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role != "user":
            continue
        content = messages[i].content.strip()
        if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
            return i
    raise ChatFormatError("no user query found in messages")


def _assistant_turn(message: Message, content: str, show_reasoning: bool) -> str:
    reasoning = message.reasoning
    if not reasoning and "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    parts = ["<|im_start|>assistant\n"]
    if show_reasoning:
        parts.append(f"<think>\n{reasoning.strip()}\n</think>\n\n")
    parts.append(content)
    for j, call in enumerate(message.tool_calls):
        if j > 0:
            parts.append("\n")
        elif content.strip():
            parts.append("\n\n")
        parts.append(f"<tool_call>\n<function={call.name}>\n")
        for name, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            parts.append(f"<parameter={name}>\n{text}\n</parameter>\n")
        parts.append("</function>\n</tool_call>")
    parts.append("<|im_end|>\n")
    return "".join(parts)
