"""chat_format against the official Qwen3.6 chat_template.jinja, rendered with jinja2 as HF does:
hand-written cases, then fuzzed conversations (arbitrary text with the template's own markers,
attachments, tool calls) that must render to the same text, and tokenise to the same ids, as the
template's output - or be refused wherever the template refuses."""

from __future__ import annotations

import json

import pytest
from helpers import real_tokenizer
from hypothesis import event, example, given
from hypothesis import strategies as st

from lampo.attachments import Attachment, text_sha256, user_content
from lampo.models.chat_format import (
    ChatFormatError,
    Message,
    PromptCounter,
    ToolCall,
    TurnEncoder,
    build_prompt,
    render,
    split_reasoning,
)
from lampo.models.tokenizer import Tokenizer

jinja2_sandbox = pytest.importorskip("jinja2.sandbox")


@pytest.fixture(scope="module")
def tok(qwen_dir) -> Tokenizer:
    return Tokenizer.from_file(qwen_dir / "tokenizer.json")


class TemplateError(Exception):
    pass


@pytest.fixture(scope="module")
def template(qwen_dir):
    """The template in an environment configured like HF transformers' apply_chat_template."""

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2_sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string((qwen_dir / "chat_template.jinja").read_text(encoding="utf-8"))


def as_hf(message: Message) -> dict:
    out = {"role": message.role, "content": message.content}
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in message.tool_calls
        ]
    return out


def jinja_render(template, messages, *, enable_thinking=True, add_generation_prompt=True,
                 preserve_thinking=False, tools=None) -> str:
    return template.render(
        messages=[as_hf(m) for m in messages], tools=tools, enable_thinking=enable_thinking,
        add_generation_prompt=add_generation_prompt, preserve_thinking=preserve_thinking,
    )


S, U, A, T = "system", "user", "assistant", "tool"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — «quoted», 東京 & <tags>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
SEARCH_TOOL = {"type": "function", "function": {"name": "search", "parameters": {}}}

CASES = {
    "single_user": ([Message(U, "Hello!")], {}),
    "thinking_off": ([Message(U, "What is 2+2?")], {"enable_thinking": False}),
    "system_and_user": ([Message(S, "You are Lampo."), Message(U, "Hi")], {}),
    "whitespace_trimmed": (
        [Message(S, "  \n sys with spaces \n\n"), Message(U, "\n\n  question?\t \n")], {}),
    "empty_system": ([Message(S, "   "), Message(U, "hi")], {}),
    "multi_turn_reasoning_field_dropped": (
        [Message(U, "first"), Message(A, "answer one", reasoning="thought one"),
         Message(U, "second")], {}),
    "multi_turn_reasoning_in_content_dropped": (
        [Message(S, "sys"), Message(U, "first"),
         Message(A, "<think>\nthought one\n</think>\n\nanswer one"), Message(U, "second"),
         Message(A, "\n\nthought two</think>\n\n  answer two  "), Message(U, "third")], {}),
    "preserve_thinking": (
        [Message(U, "first"), Message(A, "answer one", reasoning="  thought one \n"),
         Message(U, "second"), Message(A, "<think>\nt2\n</think>\n\nanswer two"),
         Message(U, "third")], {"preserve_thinking": True}),
    "preserve_thinking_off_mode": (
        [Message(U, "first"), Message(A, "answer one", reasoning="thought one"),
         Message(U, "second")], {"preserve_thinking": True, "enable_thinking": False}),
    "assistant_last_keeps_reasoning": (
        [Message(U, "q"), Message(A, "partial answer", reasoning="some thought")],
        {"add_generation_prompt": False}),
    "assistant_last_no_reasoning": (
        [Message(U, "q"), Message(A, "plain answer")], {"add_generation_prompt": False}),
    "reasoning_field_wins_over_content": (
        [Message(U, "q"), Message(A, "kept </think> literally", reasoning="r")],
        {"add_generation_prompt": False}),
    "unicode": (
        [Message(S, "Réponds en français 🇫🇷"),
         Message(U, "人工智能是什么？ 😀 Ελληνικά e\u0301 עברית"),
         Message(A, "答案：人工智能 👍🏽", reasoning="思考中……"),
         Message(U, "спасибо! 🎉")], {}),
    "code_and_numbers": (
        [Message(U, "```python\ndef f(x):\n    return x ** 2\n```\nWhat does f(12) return?"),
         Message(A, "It returns `144`.\n\n    indented line\n"),
         Message(U, "and 3.14159 * 2 = ?")], {"enable_thinking": False}),
    "specials_in_user_text": (
        [Message(U, "What does <|im_end|> or <think> mean?")], {}),
    "tools_with_system": (
        [Message(S, "Be brief."), Message(U, "Weather in Paris and Tokyo?"),
         Message(A, "", reasoning="Need two calls.", tool_calls=(
             ToolCall("get_weather", {"city": "Paris", "days": 2}),
             ToolCall("get_weather", {"city": "東京", "options": {"unit": "C", "raw": True}}))),
         Message(T, '{"temp": 21}'), Message(T, "  sunny, 25°C  \n"),
         Message(A, "Paris 21, Tokyo 25.", reasoning="Both results in.")],
        {"tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": False}),
    "tools_without_system_mid_flow": (
        [Message(U, "Search for lampo"),
         Message(A, "Let me search.", reasoning="search it",
                 tool_calls=(ToolCall("search", {"query": "lampo", "limit": 5,
                                                 "tags": ["a", "b"], "x": None}),)),
         Message(T, "result one")],
        {"tools": [SEARCH_TOOL]}),
    "tools_empty_system": (
        [Message(S, " \n"), Message(U, "hi")], {"tools": [SEARCH_TOOL]}),
    "tool_history_before_new_query": (
        [Message(U, "Search for lampo"),
         Message(A, "", reasoning="search", tool_calls=(ToolCall("search", {"q": "lampo"}),)),
         Message(T, "found"), Message(A, "Found it.", reasoning="done"),
         Message(U, "thanks, and now?")], {"tools": [SEARCH_TOOL]}),
    "user_turn_of_wrapped_tool_responses": (
        [Message(U, "go"), Message(A, "step one", reasoning="r1"),
         Message(U, "<tool_response>\nout\n</tool_response>")], {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_render_matches_template_text_and_ids(name, template, tok):
    messages, kwargs = CASES[name]
    expected = jinja_render(template, messages, **kwargs)
    assert render(messages, **kwargs) == expected
    if kwargs.get("add_generation_prompt", True):
        prompt_kwargs = {k: v for k, v in kwargs.items() if k != "add_generation_prompt"}
        prompt = build_prompt(tok, messages, **prompt_kwargs)
        assert prompt.text == expected
        assert list(prompt.ids) == tok.encode(expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reuse_boundary_ends_the_last_user_query(name, tok):
    messages, kwargs = CASES[name]
    kwargs = {k: v for k, v in kwargs.items() if k != "add_generation_prompt"}
    prompt = build_prompt(tok, messages, **kwargs)
    last_query = max(i for i, m in enumerate(messages)
                     if m.role == U and not m.content.strip().startswith("<tool_response>"))
    head = render(messages[: last_query + 1], add_generation_prompt=False, **kwargs)
    assert prompt.ids[: prompt.reuse_boundary] == tuple(tok.encode(head))
    assert prompt.ids[prompt.reuse_boundary - 2 : prompt.reuse_boundary + 1] == (
        248046, tok.encode("\n")[0], 248045)


def test_prompt_counter_counts_what_build_prompt_encodes_and_tokenizes_the_history_once(tok):
    class Counting:
        def __init__(self):
            self.texts = []

        def count(self, text):
            self.texts.append(text)
            return tok.count(text)

    counting = Counting()
    counter = PromptCounter(counting)
    history = [Message(S, "You are Lampo."), Message(U, "Name a prime."), Message(A, "7.", reasoning="r")]
    for draft in ("Another?", "Another one?", "And an <|im_end|> one?"):
        for thinking in (True, False):
            messages = [*history, Message(U, draft)]
            assert counter.prompt_tokens(messages, enable_thinking=thinking) == \
                len(build_prompt(tok, messages, enable_thinking=thinking).ids)
    assert sum(text.startswith("<|im_start|>system") for text in counting.texts) == 1  # the memo held
    assert counter.conversation_tokens(history) == len(tok.encode(render(history, add_generation_prompt=False)))


class CountingTokenizer:
    """A tokenizer that records the texts it encodes."""

    def __init__(self, tok):
        self.tok, self.texts = tok, []

    def encode(self, text):
        self.texts.append(text)
        return self.tok.encode(text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_turn_encoder_gives_the_tokenizers_ids(name, tok):
    messages, kwargs = CASES[name]
    text = render(messages, **kwargs)
    turns = TurnEncoder(tok)
    for _ in range(2):  # tokenized, then from the memo
        assert turns.encode(text) == tok.encode(text) and turns.count(text) == len(tok.encode(text))
    for odd in ("", "no turn at all", "lead <|im_start|>", "<|im_start|><|im_start|>x", "é<|im_start|>\u0301a"):
        assert turns.encode(odd) == tok.encode(odd), odd


def test_turn_encoder_tokenizes_a_follow_up_once_and_evicts_the_least_recent(tok):
    document = "A long document.\n" * 500
    convo = [Message(S, "You are Lampo."), Message(U, document + "Summarise it.")]
    counting = CountingTokenizer(tok)
    turns = TurnEncoder(counting)
    first = build_prompt(turns, convo)
    convo += [Message(A, "It repeats itself.", reasoning="r"), Message(U, "Why?")]
    counting.texts.clear()
    second = build_prompt(turns, convo)
    assert second == build_prompt(tok, convo) and first == build_prompt(tok, convo[:2])
    assert not any(document in text for text in counting.texts)  # only the new turns were tokenized
    result = turns.encode(second.text)
    result.append(-1)  # the caller's list: the memo is not changed through it
    assert turns.encode(second.text) == list(second.ids)
    small = TurnEncoder(counting, memo_chars=len(document))  # less than the document's turn and the rest
    assert small.encode(second.text) == list(second.ids)
    counting.texts.clear()
    assert small.encode(second.text) == list(second.ids)
    assert sum(document in text for text in counting.texts) == 1  # evicted by the later turns, tokenized again


def test_reuse_boundary_prefix_survives_continuation(tok):
    convo = [Message(S, "You are Lampo."), Message(U, "Name a prime.")]
    for turn in range(3):
        before = build_prompt(tok, convo)
        convo = [*convo, Message(A, f"{turn * 2 + 3}.", reasoning=f"I pick prime {turn}."),
                 Message(U, f"Another one, please ({turn}).")]
        after = build_prompt(tok, convo)
        assert after.ids[: before.reuse_boundary] == before.ids[: before.reuse_boundary]
        assert after.reuse_boundary > len(before.ids)
        # The whole previous prompt is not a prefix: its generation prompt opened <think>.
        assert after.ids[: len(before.ids)] != before.ids


def test_preserve_thinking_keeps_the_whole_history_stable(tok):
    convo = [Message(U, "q1"), Message(A, "a1", reasoning="r1")]
    before = build_prompt(tok, [*convo[:1]], preserve_thinking=True)
    after = build_prompt(tok, [*convo, Message(U, "q2")], preserve_thinking=True)
    generated = tok.encode("r1\n</think>\n\na1<|im_end|>\n")
    assert after.ids[: len(before.ids) + len(generated)] == before.ids + tuple(generated)


@pytest.mark.parametrize(
    ("messages", "match"),
    [([], "no messages"),
     ([Message(U, "hi"), Message(S, "late system")], "only first"),
     ([Message("bot", "hi")], "unexpected role 'bot'"),
     ([Message(S, "sys")], "no user query"),
     ([Message(U, "<tool_response>\nx\n</tool_response>")], "no user query")],
)
def test_errors_where_the_template_raises(messages, match, template):
    with pytest.raises(ChatFormatError, match=match):
        render(messages)
    with pytest.raises(TemplateError):
        jinja_render(template, messages)


@pytest.mark.parametrize(
    ("raw", "reasoning", "answer"),
    [("Let me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4."),
     ("<think>\nstill thinking", "still thinking", ""),
     ("partial reasoning so far", "partial reasoning so far", ""),
     ("\n</think>\n\n", "", ""),
     ("r</think>a</think>b", "r", "a</think>b")],
)
def test_split_reasoning(raw, reasoning, answer):
    assert split_reasoning(raw) == (reasoning, answer)


def test_split_reasoning_round_trips_through_render(template):
    raw = "Adding.\n</think>\n\n2 + 2 = 4."
    reasoning, answer = split_reasoning(raw)
    convo = [Message(U, "2+2?"), Message(A, answer, reasoning=reasoning)]
    prompt_then_raw = render(convo[:1]) + raw
    assert render(convo, add_generation_prompt=False) == prompt_then_raw + "<|im_end|>\n"


# ---- fuzzing: arbitrary conversations render exactly as the template does ----------------------
# The template's own markers and what a chat format is likely to trip over.
MARKERS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_response>",
           "</tool_response>", "<tool_call>", "</tool_call>", "<function=f>", "<parameter=p>", "```",
           "````", "`", "\n", "\n\n", " ", "\t", "\r\n", "\r", "\x0b", "\x1c", "\u2028", "\u00a0",
           "{{ x }}", "{% if %}", "user", "assistant", "é", "😀", "\ufffd"]
texts = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(MARKERS)), max_size=8).map("".join)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=6)
tool_calls = st.lists(st.builds(ToolCall, texts, st.dictionaries(texts, json_values, max_size=3)),
                      max_size=2).map(tuple)
names = texts.map(lambda name: name if name.strip() else f"notes{name}.txt")  # a name is never blank
attachments = st.lists(st.builds(lambda name, text: Attachment(name, text, text_sha256(text), 0), names, texts),
                       max_size=2)
user_messages = st.builds(lambda text, attached: Message(U, user_content(text, attached)), texts, attachments)
messages = st.one_of(
    user_messages,
    st.builds(Message, st.sampled_from([S, U, A, T]), texts),
    st.builds(Message, st.just(A), texts, texts, tool_calls),
)
conversations = st.one_of(
    # a chat as Lampo sends it: an optional system prompt, then user / assistant turns
    st.tuples(st.lists(st.builds(Message, st.just(S), texts), max_size=1),
              st.lists(st.one_of(user_messages, st.builds(Message, st.just(A), texts, texts)),
                       min_size=1, max_size=6)).map(lambda p: p[0] + p[1]),
    # anything at all, including what the template refuses
    st.lists(messages, max_size=6),
)
tools = st.one_of(st.none(), st.lists(st.dictionaries(texts, json_values, max_size=3), max_size=2))


FUZZ_TURNS = TurnEncoder(real_tokenizer(), memo_chars=2_000)  # shared by the examples; small, so it evicts


@given(conversations, st.booleans(), st.booleans(), tools)
@example([Message(U, "<|im_end|>\n<|im_start|>assistant\n<think>\n`")], True, False, None)
@example([Message(U, "q"), Message(A, "a</think>b", "")], True, False, None)
def test_fuzzed_conversations_render_as_the_template_does(template, convo, thinking, preserve, tool_list):
    kwargs = dict(enable_thinking=thinking, preserve_thinking=preserve, tools=tool_list)
    try:
        expected = jinja_render(template, convo, **kwargs)
    except TemplateError:
        event("refused by the template")
        with pytest.raises(ChatFormatError):
            render(convo, **kwargs)
        with pytest.raises(ChatFormatError):
            build_prompt(real_tokenizer(), convo, **kwargs)
        return
    event("rendered")
    assert render(convo, **kwargs) == expected
    prompt = build_prompt(real_tokenizer(), convo, **kwargs)
    assert prompt.text == expected
    assert list(prompt.ids) == real_tokenizer().encode(expected)
    assert 0 < prompt.reuse_boundary <= len(prompt.ids)
    assert build_prompt(FUZZ_TURNS, convo, **kwargs) == prompt  # pieces kept from earlier examples too
