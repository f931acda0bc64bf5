"""The prefix rule in linear time (issue 43): a chat template without ``{% generation %}`` markers gets each prefix's
text from one traced rendering of the whole chat where the trace proves it, and the segments (or the refusal) are
exactly those of rendering every prefix (`ChatTemplate._prefixes`, the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import Untraceable
from streambatch.read.text.chat import ChatTemplate

from .test_chat_rule import char_ids

pytest.importorskip("jinja2")

LIMIT = 1 << 20
CHATML = (  # HF's stock ChatML: no markers
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_SYSTEM = (  # Llama-3 style: a system special case (messages[0], messages[1:]), bos on the first turn
    "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set system = 'Be brief.' %}{% set loop_messages = messages %}"
    "{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 %}{{ bos_token }}<|start_header_id|>system"
    "<|end_header_id|>\n\n{{ system }}<|eot_id|>{% endif %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_LAST = LLAMA3_SYSTEM.replace(  # ... and loop.last (a tool turn ends the chat with a newline)
    "<|eot_id|>{% endfor %}", "<|eot_id|>{% if loop.last and message['role'] == 'tool' %}\n{% endif %}{% endfor %}"
)
LENGTH = (  # messages|length: a separator between turns (prefix-stable, but every prefix reads the length)
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if loop.index < messages|length %}<sep>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{% if messages %}<sep>{% endif %}<|assistant|>{% endif %}"
)
EOS_AFTER = (  # not prefix-stable: the eos after the last turn moves (refused, from the trace)
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{{ eos_token }}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
LAST_MARK = (  # not prefix-stable: the last turn is marked (refused, each prefix rendered)
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if loop.last %}<|last|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOOLS = (  # Qwen-2.5 style tool turns: the turn before and after (messages[loop.index0 +- 1], loop.last)
    "{% for message in messages %}{% if message.role == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
COUNTER = (  # a namespace written by every turn, not read after the loop
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}<|{{ m.role }}|>{{ ns.n }}:"
    "{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
LAST_ROLE = (  # ... and one read after the loop: what the skipped turns wrote
    "{% set ns = namespace(last='') %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% set ns.last = m.role %}"
    "{% endfor %}{% if add_generation_prompt %}{% if ns.last == 'tool' %}<|observe|>{% endif %}<|assistant|>{% endif %}"
)
STOPS = (  # break, for-else, a loop over a filter, a loop in a macro
    "{% macro body(m) %}<|{{ m.role }}|>{{ m.content }}{% endmacro %}"
    "{% for m in messages %}{% if m.content == 'stop' %}{% break %}{% endif %}{{ body(m) }}{% else %}<|empty|>{% endfor %}"
    "{% for m in messages|selectattr('role', 'eq', 'system') %}[{{ m.content }}]{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
IN_MACRO = (
    "{% macro chat(ms) %}{% for m in ms %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% endmacro %}{{ chat(messages) }}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
FILTERED = (  # the loop inside a {% filter %} block: its text is written at the end (not followed)
    "{% filter upper %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% endfilter %}"
    "{% if add_generation_prompt %}<|ASSISTANT|>{% endif %}"
)
OPERATOR = (  # an operator on the chat itself (not followed: every prefix rendered)
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if (messages + []) is sequence %}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEMPLATES = {
    "chatml": CHATML,
    "llama3": LLAMA3_SYSTEM,
    "llama3-last": LLAMA3_LAST,
    "length": LENGTH,
    "eos-after": EOS_AFTER,
    "last-mark": LAST_MARK,
    "tools": TOOLS,
    "counter": COUNTER,
    "last-role": LAST_ROLE,
    "stops": STOPS,
    "in-macro": IN_MACRO,
    "filtered": FILTERED,
    "operator": OPERATOR,
}
COMPILED = {name: ChatTemplate(source, "<s>", "</s>") for name, source in TEMPLATES.items()}

roles = st.sampled_from(["system", "user", "assistant", "tool"])
contents = st.one_of(st.text(alphabet="ab \n?", max_size=5), st.just("stop"))
turns = st.fixed_dictionaries({"role": roles, "content": contents})
system = st.builds(lambda text: {"role": "system", "content": text}, contents)
conversations = st.one_of(
    st.just([]),  # empty
    st.lists(turns, min_size=1, max_size=1),  # single turn
    st.lists(turns, min_size=1, max_size=6).map(lambda c: [*c, {"role": "user", "content": "cut?"}]),  # cut before a reply
    st.tuples(system, st.lists(turns, min_size=1, max_size=6)).map(lambda p: [p[0], *p[1]]),  # system first
    st.lists(turns, min_size=6, max_size=12),
    st.lists(turns, min_size=30, max_size=50),  # long
)


def outcome(work: Any) -> Any:
    """The segments, or the refusal's message."""
    try:
        return work()
    except sb.DataError as err:
        return f"refused: {err}"


def proven(template: ChatTemplate, chat: list[dict[str, str]], prompt: bool) -> dict[int, str]:
    """The prefixes (by length) whose text the trace of the whole chat proves, and that text."""
    assert template.__dict__["_followable"]  # else the trace is never taken (a filter block's text comes late)
    trace = template._trace(chat, prompt, "row 0", LIMIT)
    first, later = trace.firsts(), trace.maxima()
    found = {k: trace.prefix(k, first, later) for k in range(len(chat) + 1)}
    return {k: text.window(0, len(text)) for k, text in found.items() if text is not None}


@pytest.mark.parametrize("name", list(TEMPLATES))
@settings(max_examples=40, deadline=None)
@given(chat=conversations, limit=st.sampled_from([LIMIT, LIMIT, 150, 40, 0]))
def test_the_traced_prefix_rule_is_the_prefix_rule(name: str, chat: list[dict[str, str]], limit: int) -> None:
    """Random conversations (empty, single-turn, cut, system first, long, tool turns) on templates the trace follows,
    partly follows or not at all, under output caps that some renderings pass: the same segments, or the same refusal
    (not prefix-stable, a template error, too long), as rendering every prefix."""
    template = COMPILED[name]
    ours = outcome(lambda: template.segments(chat, "row 0", limit=limit))
    reference = outcome(lambda: [p for p in template._prefixes(chat, "row 0", limit) if p[0]])
    assert ours == reference


@pytest.mark.parametrize("name", list(TEMPLATES))
@settings(max_examples=25, deadline=None)
@given(chat=conversations.filter(bool), prompt=st.booleans())
def test_every_proven_prefix_is_the_prefix_rendered(name: str, chat: list[dict[str, str]], prompt: bool) -> None:
    """Each prefix text the trace proves is exactly that prefix rendered on its own (never a guess)."""
    template = COMPILED[name]
    if not template.__dict__["_followable"]:
        return
    try:
        texts = proven(template, chat, prompt)
    except (sb.DataError, Untraceable):
        return
    assert texts[len(chat)] == template.render(chat, prompt, "row 0")
    for length, text in texts.items():
        assert text == template.render(chat[:length], prompt, "row 0"), length


def test_what_the_trace_proves() -> None:
    """Not vacuous: loops that read each turn once are proven from the first or second prefix on; a template that
    reads the length, the turn after, or a namespace the skipped turns wrote, renders those prefixes on its own."""
    chat = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"} for i in range(20)
    ]
    chat[5]["role"] = "tool"
    everything = set(range(22))
    assert set(proven(COMPILED["chatml"], chat, False)) == everything - {0}
    assert set(proven(COMPILED["chatml"], chat, True)) == everything - {0}
    assert set(proven(COMPILED["counter"], chat, True)) == everything - {0}
    assert set(proven(COMPILED["llama3"], chat, False)) == everything - {0, 1}  # the system turn and the first loop turn
    # the tool turn (5) peeks at turn 6 (loop.last), so the loop fetches 6 and 7 unlike a plain loop: both rendered
    assert set(proven(COMPILED["tools"], chat, False)) == everything - {0, 6, 7}
    assert set(proven(COMPILED["length"], chat, False)) == {21}
    assert set(proven(COMPILED["llama3-last"], chat, False)) == {21}
    assert set(proven(COMPILED["last-role"], chat, False)) == everything - {0}  # the namespace read needs the prompt
    assert set(proven(COMPILED["last-role"], chat, True)) == {21}
    assert set(proven(COMPILED["eos-after"], chat, False)) == everything - {0}
    assert set(proven(COMPILED["in-macro"], chat, False)) == {21}
    with pytest.raises(Untraceable):
        proven(COMPILED["operator"], chat, False)


def test_a_template_not_followed_is_rendered_per_prefix() -> None:
    """A template using a stateful helper, or writing a loop inside a filter block, is never traced."""
    assert COMPILED["chatml"].__dict__["_followable"]
    assert not COMPILED["filtered"].__dict__["_followable"]
    assert not ChatTemplate(CHATML + "{% if false %}{{ cycler() }}{% endif %}").__dict__["_followable"]
    assert not ChatTemplate("{% for m in messages %}{% for x in loop %}{% endfor %}{% endfor %}").__dict__["_followable"]


def _prepare(tmp_path: Path, name: str, template: str, rows: list[dict[str, Any]], workers: int) -> dict[str, bytes]:
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{name}.jinja").write_text(template)
    out = tmp_path / f"{name}-store"
    sb.prepare_store(
        [tmp_path / f"{name}.jsonl"],
        out,
        tokenizer=char_ids,
        chat_template=str(tmp_path / f"{name}.jinja"),
        skip_untrained_documents=True,
        eos_id=None,
        bos_id=None,
        workers=workers,
        quiet=True,
    )
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["chatml", "llama3", "counter"])
def test_prepare_stores_the_same_bytes_both_ways(tmp_path: Path, name: str, workers: int) -> None:
    """Through prepare, 1 and 2 workers: the traced road and the reference road (the same template made untraceable
    by a dead ``cycler`` reference) write identical stores."""
    chats = [
        [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        [{"role": "user", "content": "q?"}],
        [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(40)],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    ]
    rows = [{"id": f"c{i}", "messages": chat} for i, chat in enumerate(chats)]
    source = TEMPLATES[name]
    reference = source + "{% if false %}{{ cycler() }}{% endif %}"
    assert ChatTemplate(source).__dict__["_followable"]
    assert not ChatTemplate(reference).__dict__["_followable"]
    traced = _prepare(tmp_path, "traced", source, rows, workers)
    assert traced == _prepare(tmp_path, "reference", reference, rows, workers)
    assert json.loads(traced["header.json"])["document_count"] == 3


def test_a_long_chat_without_markers_is_linear() -> None:
    """20,000 one-character turns through marker-less ChatML: every prefix but the empty one comes from the trace
    (scripts/bench_chat.py times it; the prefix rule took 84 s)."""
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(20_000)]
    template = COMPILED["chatml"]
    segments = template.segments(chat, "row 0")
    assert segments[-1] == ("x<|im_end|>\n", True)
    assert sum(trained for _, trained in segments) == 10_000
    assert "".join(text for text, _ in segments) == template.render(chat, False, "row 0")
    trace = template._trace(chat, True, "row 0", LIMIT)
    first, later = trace.firsts(), trace.maxima()
    assert all(trace.prefix(k, first, later) is not None for k in range(1, 20_001))
