"""Time a long chat's mask (issue 43): 20,000 one-character turns, ChatML with ``{% generation %}`` markers, rendered
once; and the same chat's first turns under the prefix rule (no markers: one rendering per turn), to show the shape.

    PYTHONPATH=. python scripts/bench_chat.py [--turns 20000] [--repeats 3]

Prints the median seconds of `iter_hf` over the whole chat with markers (the goal: under 10 s), and for the prefix
rule the seconds at a few sizes (they grow with the square of the turns).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import streambatch as sb
from streambatch.read.columns.hf import iter_hf
from streambatch.read.text.chat import ChatTemplate

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
)
PLAIN = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat(turns: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(turns)]


def seconds(template: ChatTemplate, turns: int) -> float:
    start = time.perf_counter()
    doc = next(iter_hf([{"messages": chat(turns)}], chat_template=template, chat_render_seconds=600))
    elapsed = time.perf_counter() - start
    assert int(doc.loss_mask.sum()) > 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    marked = ChatTemplate(CHATML)
    runs = [seconds(marked, args.turns) for _ in range(args.repeats)]
    print(f"markers, {args.turns:,} turns: median {statistics.median(runs):.2f} s ({', '.join(f'{r:.2f}' for r in runs)})")
    with tempfile.TemporaryDirectory() as folder:  # the whole of prepare: read, render, tokenize (bytes), write
        rows, template = Path(folder) / "chat.jsonl", Path(folder) / "chatml.jinja"
        rows.write_text(json.dumps({"id": "long", "messages": chat(args.turns)}) + "\n")
        template.write_text(CHATML)
        start = time.perf_counter()
        store = sb.prepare_store([rows], Path(folder) / "store", chat_template=str(template), quiet=True)
        print(f"prepare, {args.turns:,} turns: {time.perf_counter() - start:.2f} s ({store.tokens.size:,} tokens)")
    plain = ChatTemplate(PLAIN)
    for turns in (250, 500, 1000):
        print(f"prefix rule, {turns:,} turns: {seconds(plain, turns):.2f} s")


if __name__ == "__main__":
    main()
