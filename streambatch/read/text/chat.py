"""Chat templates: ``messages`` rendered in jinja2's sandbox as Hugging Face renders them, within limits, cut into
segments (text pieces, each trained or not).

Two rules say which text trains (docs/prepare.md, "Loss masks"):

* **markers**: a template with ``{% generation %}`` blocks trains exactly the
  text rendered inside them (Hugging Face's ``return_assistant_tokens_mask``
  rule).  The chat is rendered once, so the cost is linear in its length.
* **prefixes**: without markers, assistant turn ``i`` trains what rendering
  ``messages[:i + 1]`` adds to rendering ``messages[:i]`` with the generation
  prompt; every rendering must extend the previous one, else the document is
  refused.  The prefixes' texts come from one traced rendering of the whole
  chat (per generation-prompt value) wherever the trace proves them
  (`streambatch.read.text.chat_trace`): linear in the chat's length for
  templates that read each turn once in a ``{% for %}`` loop (ChatML,
  Llama-3); a prefix the trace cannot prove (the template read the chat's
  length, the last turn or the turn after the current one first) is rendered
  on its own, and a template the trace cannot follow renders every prefix.

Limits (docs/limits.md): the template file is a regular file of at most
`TEMPLATE_MAX_BYTES`, opened without blocking; a document's renderings are
stopped past their time budget (`streambatch.read.text.budget`) and past the
document's size while they render; one template operation (``*``, ``+``, ``%``,
a width) may not build more than that size either.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, DataError, Untraceable
from ...io.files import open_regular, short_path
from ...model.validate import short
from ..inputs import MAX_DOCUMENT_BYTES
from .budget import time_budget
from .chat_trace import TRACE, Text, Trace, Turns, followable, namespace_class, whole
from .tokenizers import require

Segments = list[tuple[str, bool]]
TEMPLATE_MAX_BYTES = 1 << 20  # a chat template (or the tokenizer_config.json holding one): 1 MiB
RENDER_SECONDS = 60.0  # the default time budget of one document's renderings
_TRACKER: ContextVar[_Tracker | None] = ContextVar("streambatch_generation", default=None)


class _Tracker:
    """One rendering's running output length and the ``{% generation %}`` spans found in it."""

    __slots__ = ("done", "spans")

    def __init__(self) -> None:
        self.done = 0
        self.spans: list[tuple[int, int]] = []


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template, rendered in jinja2's immutable sandbox as Hugging Face renders it.

    *source* is the template text; *bos_token*/*eos_token* are the strings it may
    use.  `from_file` reads a template file or a ``tokenizer_config.json``.

    >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    ...                  "{% if add_generation_prompt %}<assistant>{% endif %}")
    >>> t.segments([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "row 0")
    [('<user>hi', False), ('<assistant>', False), ('yo', True)]
    >>> marked = ChatTemplate("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}"
    ...                       "{% generation %}{{ m.content }}.{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
    ...                       "{% endfor %}")
    >>> marked.marked, marked.segments([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "row 0")
    (True, [('<user>hi<assistant>', False), ('yo.', True)])
    """

    source: str
    bos_token: str = ""
    eos_token: str = ""
    name: str = "chat template"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ChatTemplate:
        """A template file, or a ``tokenizer_config.json`` (its ``chat_template``, ``bos_token``, ``eos_token``).

        The file is opened without blocking and must be a regular file of at most
        `TEMPLATE_MAX_BYTES` (a FIFO or ``/dev/zero`` is refused, never waited on or read whole).
        """
        name = os.fspath(path)
        shown = short_path(name)
        try:
            with open_regular(name) as handle:
                raw = handle.read(TEMPLATE_MAX_BYTES + 1)
        except OSError as err:
            raise ConfigError(f"chat_template={shown!r}: cannot read it ({err.strerror}); pass a template file") from None
        if len(raw) > TEMPLATE_MAX_BYTES:
            raise ConfigError(
                f"chat_template={shown!r} holds more than {TEMPLATE_MAX_BYTES:,} bytes (the limit for a chat template); "
                "pass the template itself or a tokenizer_config.json"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"chat_template={shown!r} is not UTF-8 ({err}); pass a template file") from None
        try:
            config = json.loads(text)
        except ValueError:
            return cls(text, name=name)
        if not isinstance(config, dict) or "chat_template" not in config:
            raise ConfigError(f"chat_template={shown!r} is JSON without a 'chat_template' entry; pass a tokenizer_config.json")
        template = config["chat_template"]
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ConfigError(f"chat_template={shown!r}: its 'chat_template' is not a template string")
        return cls(template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")), name)

    def __post_init__(self) -> None:
        compiled, marked, traced = _compile(self.source, self.name)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "marked", marked)
        object.__setattr__(self, "_followable", traced)

    def __reduce__(self) -> tuple[Any, ...]:  # workers rebuild the compiled template
        return (ChatTemplate, (self.source, self.bos_token, self.eos_token, self.name))

    def render(
        self,
        messages: Sequence[Any],
        add_generation_prompt: bool,
        where: str,
        limit: int = MAX_DOCUMENT_BYTES,
        tracker: _Tracker | None = None,
    ) -> str:
        """The template's text for *messages*, refused past *limit* characters while it renders; a template error is a
        `DataError` naming *where*.  With a *tracker*, the ``{% generation %}`` spans are recorded in it."""
        return self._render(list(messages), add_generation_prompt, where, limit, _Tracker() if tracker is None else tracker)

    def _render(self, messages: Any, add_generation_prompt: bool, where: str, limit: int, tracker: _Tracker) -> str:
        template: Any = self.__dict__["_compiled"]
        parts: list[str] = []
        reset = _TRACKER.set(tracker)
        try:
            for chunk in template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            ):
                tracker.done += len(chunk)
                if tracker.done > limit:
                    raise DataError(_too_long(where, limit))
                parts.append(chunk)
        except DataError:
            raise
        except Exception as err:  # the sandbox's SecurityError, raise_exception, a template bug
            raise DataError(f"{where}: the chat template raised {type(err).__name__}: {err}") from None
        finally:
            _TRACKER.reset(reset)
        return "".join(parts)

    def segments(
        self, messages: Any, where: str, *, limit: int = MAX_DOCUMENT_BYTES, seconds: float = RENDER_SECONDS
    ) -> Segments:
        """The chat's text cut into segments, trained or not (the markers rule, else the prefix rule).

        Every rendering of the document together stays within *seconds*, and each
        within *limit* characters; past either, a `DataError` names *where*.
        """
        turns = _messages(messages, where)
        marked = self.__dict__["marked"]
        what = (
            "rendering the chat template"
            if marked
            else "rendering the chat template (no {% generation %} markers: a template that reads the chat's length, its "
            "last turn or the turn after the current one renders each prefix again; add markers to render long chats once)"
        )
        with time_budget(seconds, where, what):
            pieces = self._marked(turns, where, limit) if marked else self._traced(turns, where, limit)
        return [(text, trained) for text, trained in pieces if text]

    def _marked(self, turns: list[dict[str, Any]], where: str, limit: int) -> Segments:
        """One rendering: the text inside ``{% generation %}`` blocks trains (overlapping blocks merged)."""
        tracker = _Tracker()
        text = self.render(turns, False, where, limit, tracker)
        pieces: Segments = []
        done = 0
        for start, end in sorted(tracker.spans):
            start = max(start, done)
            if end > start:
                pieces += [(text[done:start], False), (text[start:end], True)]
                done = end
        pieces.append((text[done:], False))
        return pieces

    def _prefixes(self, turns: list[dict[str, Any]], where: str, limit: int, rendering: Any = None) -> Segments:
        """The prefix rule: turn ``i``'s text is what rendering ``messages[:i + 1]`` adds to the rendering before it
        (with the generation prompt before an assistant turn, whose own text trains).

        ``rendering(k, add_generation_prompt)`` gives the text of the first ``k`` turns as a `Text`; by default each
        is rendered (the reference `_traced` is tested against)."""
        if rendering is None:

            def rendering(length: int, prompt: bool) -> Text:
                return Text.of(self.render(turns[:length], prompt, where, limit))

        pieces: Segments = []
        done = Text.of("")
        for i, message in enumerate(turns):
            full = rendering(i + 1, False)
            if message["role"] == "assistant":
                head = rendering(i, True)
                _extends(done, head, where, i, "the generation prompt")
                _extends(head, full, where, i, "its turn")
                pieces.append((head.window(len(done), len(head)), False))
                pieces.append((full.window(len(head), len(full)), True))
            else:
                _extends(done, full, where, i, "its turn")
                pieces.append((full.window(len(done), len(full)), False))
            done = full
        return pieces

    def _traced(self, turns: list[dict[str, Any]], where: str, limit: int) -> Segments:
        """The prefix rule's segments, exactly, with each prefix's text taken from one traced rendering of the whole
        chat (per generation-prompt value) where the trace proves it (`chat_trace`), else rendered on its own; a
        template or chat the trace cannot follow, or whose whole rendering fails, goes the reference way."""
        if not turns or not self.__dict__["_followable"]:
            return self._prefixes(turns, where, limit)
        try:
            traces = {False: self._trace(turns, False, where, limit)}
            if any(m["role"] == "assistant" for m in turns):
                traces[True] = self._trace(turns, True, where, limit)
        except (DataError, Untraceable):  # the reference meets the same error at its own turn, with its own message
            return self._prefixes(turns, where, limit)
        plain = traces[False].text
        proofs = {prompt: (trace, trace.firsts(), trace.maxima()) for prompt, trace in traces.items()}
        shared = Text.of(plain).first_difference(Text.of(traces[True].text)) if True in traces else 0

        def rendering(length: int, prompt: bool) -> Text:
            trace, first, later = proofs[prompt]
            text = trace.prefix(length, first, later)
            if text is None:
                return Text.of(self.render(turns[:length], prompt, where, limit))
            if len(text) > limit:
                raise DataError(_too_long(where, limit))
            return Text(plain, text.cut, text.tail) if prompt and text.cut <= shared else text

        return self._prefixes(turns, where, limit, rendering)

    def _trace(self, turns: list[dict[str, Any]], prompt: bool, where: str, limit: int) -> Trace:
        """The whole chat rendered once as `Turns`, every look at it recorded; checked against its plain rendering."""
        tracker = _Tracker()
        trace = Trace(turns, self.__dict__["_compiled"].root_render_func.__code__, tracker)
        reset = TRACE.set(trace)
        try:
            trace.text = self._render(Turns(trace, 0), prompt, where, limit, tracker)
        finally:
            TRACE.reset(reset)
        if trace.text != self.render(turns, prompt, where, limit):
            raise Untraceable("the traced rendering differs")
        return trace


def _too_long(where: str, limit: int) -> str:
    return (
        f"{where}: the chat template renders more than {limit:,} characters (the limit for one document); "
        "raise it with --max-document-bytes (max_document_bytes=), or split the chat"
    )


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise DataError(f"{where}: messages={short(messages)} must be a list of {{role, content}} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}: messages[{i}]={short(message)} must be an object with a 'role' string")
    return [dict(m) for m in messages]


def _extends(before: Text, after: Text, where: str, turn: int, what: str) -> None:
    at = before.first_difference(after)
    if at < len(before):  # *after* does not start with *before*
        raise DataError(
            f"{where}: the chat template is not prefix-stable at messages[{turn}] ({what}): rendering the conversation "
            f"up to it changes earlier text at character {at} ({short(before.window(at, at + 20))} becomes "
            f"{short(after.window(at, at + 20))}), so the assistant's tokens cannot be found; use a template whose "
            "renderings extend each other, mark the assistant's text with {% generation %}, or give labels/assistant_masks"
        )


_WIDTH = re.compile(r"\d+")
_PERCENT = re.compile(r"%[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")  # a %-format's width and precision


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _compile(source: str, name: str) -> tuple[Any, bool, bool]:
    """The compiled template, whether it holds ``{% generation %}`` markers, and whether `chat_trace` follows it."""
    jinja2 = require("jinja2", "chat", "rendering chat templates")
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    cap = MAX_DOCUMENT_BYTES  # what one operation may build (a document may hold no more)

    def refuse(what: str) -> None:
        raise SecurityError(f"{what} would build more than {cap:,} characters (the limit for one document)")

    class Sandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with ``*``, ``**``, ``+`` and ``%`` checked before they build anything huge."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            sizes = (_sized(left), _sized(right))
            if operator == "*":
                count = right if sizes[0] is not None else left
                size = sizes[0] if sizes[0] is not None else sizes[1]
                if size is not None and isinstance(count, int) and size * max(count, 0) > cap:
                    refuse(f"repeating a value of length {size} {count} times")
                if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > 8 * cap:
                    refuse("multiplying these integers")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 4096:
                refuse(f"raising to the power {right}")
            elif operator == "+" and sizes[0] is not None and sizes[1] is not None and sizes[0] + sizes[1] > cap:
                refuse("joining these values")
            elif (
                operator == "%"
                and isinstance(left, str)
                and any("*" in spec or int(spec) > cap for match in _PERCENT.findall(left) for spec in match if spec)
            ):
                refuse(f"the format {short(left)}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            if any(isinstance(a, int) and a > cap for a in (*args, *kwargs.values())):
                refuse(f"calling {getattr(__obj, '__name__', 'this')} with these arguments")
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value: Any) -> Any:
            text = getattr(value, "__self__", None)
            if isinstance(text, str) and any(int(w) > cap for w in _WIDTH.findall(text)):
                refuse(f"the format {short(text)}")
            return super().wrap_str_format(value)

    class Generation(Extension):
        """HF's ``{% generation %}`` tag: renders its body and records where it went (the text that trains)."""

        tags = {"generation"}  # noqa: RUF012 - jinja2 declares it a set
        found = False

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            type(self).found = True
            return nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

        def _track(self, caller: Any) -> str:
            text = str(caller())
            tracker = _TRACKER.get()
            if tracker is not None:
                tracker.spans.append((tracker.done, tracker.done + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys, default=whole
        )

    marker: Any = type("Generation", (Generation,), {"found": False})  # one class per template: its own `found`
    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[marker, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    for width_filter in ("center", "indent", "wordwrap", "truncate"):
        env.filters[width_filter] = _bounded_filter(env.filters[width_filter], width_filter, cap, refuse)
    env.globals["raise_exception"] = raise_exception
    env.globals["namespace"] = namespace_class()  # jinja2's, reporting its reads and writes to a trace
    try:
        ast = env.parse(source)
        compiled = env.from_string(ast)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ConfigError(f"chat_template={short_path(name)!r}: line {err.lineno}: {err.message}; fix the template") from None
    return compiled, bool(marker.found), followable(ast)


def _bounded_filter(function: Any, name: str, cap: int, refuse: Any) -> Any:
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, int) and a > cap for a in (*args[1:], *kwargs.values())):
            refuse(f"the {name} filter with these arguments")
        return function(*args, **kwargs)

    bounded.__dict__.update(function.__dict__)  # jinja2's pass_environment/pass_context markers
    return bounded
