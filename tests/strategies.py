"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

import streambatch as sb

token_lists = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=40)


@st.composite
def documents(draw: st.DrawFn, partition: str = "train", max_docs: int = 8) -> list[sb.Document]:
    """A list of documents with unique ids, lengths 0..40 (many shorter than a window)."""
    count = draw(st.integers(min_value=0, max_value=max_docs))
    return [
        sb.Document(f"doc-{i}", partition, draw(st.lists(st.integers(min_value=0, max_value=60_000), max_size=40)))
        for i in range(count)
    ]


configs = st.fixed_dictionaries(
    {
        "context_length": st.integers(min_value=1, max_value=8),
        "stride": st.integers(min_value=1, max_value=5),
        "batch_size": st.integers(min_value=1, max_value=7),
    }
)
seeds = st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1))
