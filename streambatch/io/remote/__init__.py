"""Stores in object storage (``s3://``, ``gs://``, ``https://``): read by plan-driven range requests, written whole.

`location` parses a store's address and its options (credentials never shown),
`client` makes the requests (retried, counted), `tokens` holds a remote store's
token array (virtual memory filled on demand), `open` opens a store or a corpus
manifest, `prefetch` fetches the next batches' token ranges ahead of the
consumer, `cache` keeps fetched blocks on disk within a byte limit, and `upload`
writes a prepared store with its header last.  Everything needs the optional
``remote`` extra (obstore).
"""

from __future__ import annotations

from .location import is_remote

__all__ = ["is_remote"]
