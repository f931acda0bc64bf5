"""Labels read as Hugging Face means them, and chat templates within limits (issue 43): each failure one line, naming
the document (or the template file) and what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.read.columns.hf import iter_hf
from streambatch.read.jsonl import iter_records
from streambatch.read.text.chat import TEMPLATE_MAX_BYTES, ChatTemplate

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
IDS = [5, 6, 7, 8, 9]


def _one(rows: list[dict[str, Any]], **options: Any) -> list[list[bool]]:
    return [d.loss_mask.tolist() for d in iter_records(rows, **options)]


# --- labels ---------------------------------------------------------------------------------------------------


def test_aligned_labels_train_where_they_are_set() -> None:
    assert _one([{"input_ids": IDS, "labels": [-100, -100, 7, 8, 9]}]) == [[False, False, True, True, True]]


def test_a_label_that_is_not_its_input_id_is_refused_at_its_position() -> None:
    with pytest.raises(sb.DataError, match=r"^record 0: labels\[3\]=4 but input_ids\[3\]=8; a label that is not -100"):
        _one([{"input_ids": IDS, "labels": [-100, -100, 7, 4, 9]}])


def test_pre_shifted_labels_are_recognised_and_refused_with_the_fix() -> None:
    shifted = [-100, 7, 8, 9, -100]  # labels[i] == input_ids[i + 1]
    with pytest.raises(sb.DataError, match=r"labels look shifted by one .* pass --labels-shifted \(labels_shifted=True\)"):
        _one([{"input_ids": IDS, "labels": shifted}])
    assert _one([{"input_ids": IDS, "labels": shifted}], labels_shifted=True) == [[False, False, True, True, True]]


def test_shifted_labels_must_hold_the_next_id_and_end_with_minus_100() -> None:
    with pytest.raises(sb.DataError, match=r"labels\[4\]=9 read as shifted .* the last label has no next input id"):
        _one([{"input_ids": IDS, "labels": [6, 7, 8, 9, 9]}], labels_shifted=True)
    with pytest.raises(sb.DataError, match=r"labels\[1\]=3 read as shifted .* input_ids\[2\]=7"):
        _one([{"input_ids": IDS, "labels": [6, 3, 8, 9, -100]}], labels_shifted=True)


def test_labels_beside_a_disagreeing_loss_mask_are_refused() -> None:
    row = {"input_ids": IDS, "labels": [-100, -100, 7, 8, 9], "loss_mask": [0, 0, 0, 1, 1]}
    with pytest.raises(sb.DataError, match=r"labels and loss_mask disagree at position 2 \(labels trains it"):
        _one([row])
    agreeing = {**row, "loss_mask": [1, 0, 1, 1, 1]}  # position 0 is never a target: it may differ there
    assert _one([agreeing]) == [[False, False, True, True, True]]


def test_parquet_labels_follow_the_same_rules(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"input_ids": [IDS, IDS], "labels": [[-100] * 5, [-100, 7, 8, 9, -100]]}), tmp_path / "t.parquet")
    with pytest.raises(sb.DataError, match=r"t.parquet row 1: labels look shifted by one"):
        sb.prepare_store([tmp_path / "t.parquet"], tmp_path / "s", quiet=True, skip_untrained_documents=True)
    store = sb.prepare_store(
        [tmp_path / "t.parquet"], tmp_path / "s", quiet=True, skip_untrained_documents=True, labels_shifted=True
    )
    assert [store.loss_mask(i).tolist() for i in range(len(store))] == [[False, False, True, True, True]]


def test_the_cli_reads_shifted_labels_with_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps({"input_ids": IDS, "labels": [-100, 7, 8, 9, -100]}) + "\n")
    assert main(["prepare", str(path), "-o", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--labels-shifted" in err
    assert not (tmp_path / "s").exists()
    assert main(["prepare", str(path), "-o", str(tmp_path / "s"), "--quiet", "--labels-shifted"]) == 0
    assert sb.open_store(tmp_path / "s").loss_mask(0).tolist() == [False, False, True, True, True]


# --- templates within limits ----------------------------------------------------------------------------------


def test_a_fifo_or_a_device_is_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(sb.ConfigError, match=rf"cannot read it \(not a regular file \({kind}\)\); pass a template file"):
            ChatTemplate.from_file(path)


def test_a_template_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.jinja"
    path.write_text("x" * (TEMPLATE_MAX_BYTES + 1))
    with pytest.raises(sb.ConfigError, match=r"big.jinja' holds more than 1,048,576 bytes"):
        ChatTemplate.from_file(path)
    path.write_text("x" * TEMPLATE_MAX_BYTES)
    assert ChatTemplate.from_file(path).render(CHAT, False, "row 0") == "x" * TEMPLATE_MAX_BYTES


def test_a_link_to_a_template_is_followed_to_its_regular_file(tmp_path: Path) -> None:
    """Hugging Face's cache links tokenizer_config.json to a blob: the file it names is what counts."""
    real = tmp_path / "blob"
    real.write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    (tmp_path / "tokenizer_config.json").symlink_to(real)
    assert ChatTemplate.from_file(tmp_path / "tokenizer_config.json").render(CHAT, False, "row 0") == "hi"
    (tmp_path / "to_fifo").symlink_to("/dev/zero")
    with pytest.raises(sb.ConfigError, match="not a regular file"):
        ChatTemplate.from_file(tmp_path / "to_fifo")


def test_nested_loops_stop_at_the_time_budget() -> None:
    template = ChatTemplate("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
    with pytest.raises(sb.DataError, match=r"^row 0 \(document id='0'\): rendering the chat template .*took more than 0.5 s"):
        list(iter_hf([{"messages": CHAT}], chat_template=template, chat_render_seconds=0.5))


def test_a_long_chat_without_markers_is_stopped_at_the_budget_with_the_fix() -> None:
    """Without {% generation %}, a template that reads loop.last renders each prefix again (quadratic): past the
    budget, say why and to add markers (a plain loop is traced once: tests/read/test_chat_prefixes.py)."""
    template = ChatTemplate("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% if loop.last %}{% endif %}{% endfor %}")
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(20_000)]
    with pytest.raises(
        sb.DataError,
        match=r"no \{% generation %\} markers: a template that reads .* renders each prefix again; add markers .*\) took more",
    ):
        list(iter_hf([{"messages": chat}], chat_template=template, chat_render_seconds=0.3))


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 4000000000 }}",
        "{% set ns = namespace(s='x' * 200000000) %}{{ ns.s + ns.s }}",
        "{{ 'a' | center(4000000000) }}",
        "{{ '%4000000000s' % 'a' }}",
        "{{ '{:>4000000000}'.format('a') }}",
        "{{ 'a'.ljust(4000000000) }}",
        "{{ 2 ** 100000000 }}",
    ],
)
def test_one_operation_cannot_build_past_the_document_cap(source: str) -> None:
    with pytest.raises(sb.DataError, match=r"^row 0 \(document id='0'\): the chat template raised SecurityError: .* would build"):
        list(iter_hf([{"messages": CHAT}], chat_template=ChatTemplate(source)))


def test_the_output_cap_holds_while_rendering() -> None:
    template = ChatTemplate("{% for a in range(100000) %}{{ messages[0]['content'] * 1000 }}{% endfor %}")
    with pytest.raises(sb.DataError, match=r"renders more than 1,000,000 characters .* --max-document-bytes"):
        list(iter_hf([{"messages": CHAT}], chat_template=template, max_document_bytes=1_000_000))


def test_ordinary_format_strings_still_render() -> None:
    template = ChatTemplate("{{ '**%s** %5d' % ('a', 3) }}|{{ '{:>4}'.format('b') }}|{{ 'c' | center(5) }}")
    assert template.render(CHAT, False, "row 0") == "**a**     3|   b|  c  "
