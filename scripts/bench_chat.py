"""Time a long chat's mask (issue 43): 20,000 one-character turns through ChatML with ``{% generation %}`` markers
(rendered once) and through Hugging Face's stock ChatML without markers (the prefix rule, each prefix's text taken
from one traced rendering of the whole chat); and the prefix rule the way it went before (every prefix rendered
again), on fewer turns, to show what the trace saves.

    PYTHONPATH=. python scripts/bench_chat.py [--turns 20000] [--repeats 3] [--reference-turns 2000]

Prints the median seconds of `iter_hf` and of `prepare_store` over the whole chat (the goal: under 10 s), then the
traced and the re-rendering road side by side at ``--reference-turns`` (the latter grows with the square of the
turns, so its time at ``--turns`` is estimated from there, not run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import streambatch as sb
from streambatch.read.columns.hf import iter_hf
from streambatch.read.text.chat import ChatTemplate

MARKED = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
)
CHATML = (  # Hugging Face's stock ChatML: no markers
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
REFERENCE = CHATML + "{% if false %}{{ cycler() }}{% endif %}"  # the same text, never traced: every prefix rendered


def chat(turns: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(turns)]


def seconds(template: ChatTemplate, turns: int) -> float:
    start = time.perf_counter()
    doc = next(iter_hf([{"messages": chat(turns)}], chat_template=template, chat_render_seconds=3600))
    elapsed = time.perf_counter() - start
    assert int(doc.loss_mask.sum()) > 0
    return elapsed


def prepare_seconds(source: str, turns: int) -> float:
    """The whole of prepare: read, render, tokenize (bytes), write."""
    with tempfile.TemporaryDirectory() as folder:
        rows, template = Path(folder) / "chat.jsonl", Path(folder) / "chat.jinja"
        rows.write_text(json.dumps({"id": "long", "messages": chat(turns)}) + "\n")
        template.write_text(source)
        start = time.perf_counter()
        sb.prepare_store([rows], Path(folder) / "store", chat_template=str(template), quiet=True)
        return time.perf_counter() - start


def median(runs: list[float]) -> str:
    return f"median {statistics.median(runs):.2f} s ({', '.join(f'{r:.2f}' for r in runs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-turns", type=int, default=2_000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for name, source in (("markers", MARKED), ("no markers (traced)", CHATML)):
        template = ChatTemplate(source)
        print(f"{name}, {args.turns:,} turns, iter_hf: {median([seconds(template, args.turns) for _ in range(args.repeats)])}")
        print(
            f"{name}, {args.turns:,} turns, prepare: {median([prepare_seconds(source, args.turns) for _ in range(args.repeats)])}"
        )
    turns = args.reference_turns
    traced, reference = seconds(ChatTemplate(CHATML), turns), seconds(ChatTemplate(REFERENCE), turns)
    estimate = reference * (args.turns / turns) ** 2
    print(
        f"no markers, {turns:,} turns, iter_hf: traced {traced:.2f} s, every prefix rendered (before) {reference:.2f} s "
        f"({reference / traced:.0f}x); before at {args.turns:,} turns: about {estimate:,.0f} s (squared)"
    )


if __name__ == "__main__":
    main()
