"""A store's data contract: the tokenizer's digest and its BOS/EOS policy, so token ids from two stores mean the same.

Every store that records a tokenizer records its contract too (the optional
header field ``contract``; stores written before it derive theirs from the
``tokenizer`` entry, so they still open): ``tokenizer_digest`` (the tokenizer
file's BLAKE2b-256, or for a tokenizer without a file the digest of its kind,
name and vocabulary size), and ``bos_id``/``eos_id``, the ids put before and
after every text document (None: none).  Mixing sources, reading shards as one
corpus and resuming a run across a different contract are refused, naming both
(`check_one_contract`, `streambatch.model.validate.check_one_tokenizer`).

>>> contract_of({"name": "bytes", "kind": "bytes", "vocab_size": 257, "eos_id": 256, "bos_id": None})["eos_id"]
256
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

VERSION = 1


def contract_of(tokenizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """The contract of a store that records *tokenizer* (a header's ``tokenizer`` entry), or None without one."""
    if not isinstance(tokenizer, dict):
        return None
    digest = tokenizer.get("file_hash")
    if not isinstance(digest, str):
        named = json.dumps([tokenizer.get("kind"), tokenizer.get("name"), tokenizer.get("vocab_size")], sort_keys=True)
        digest = "blake2b-256:" + hashlib.blake2b(named.encode(), digest_size=32).hexdigest()
    return {"version": VERSION, "tokenizer_digest": digest, "bos_id": tokenizer.get("bos_id"), "eos_id": tokenizer.get("eos_id")}


def contract_key(contract: dict[str, Any] | None) -> str:
    """One string naming *contract* (a run's state records it), or ``""`` without one.

    >>> contract_key(None), contract_key({"tokenizer_digest": "blake2b-256:ab", "bos_id": None, "eos_id": 0})
    ('', 'blake2b-256:ab|bos=None|eos=0')
    """
    if contract is None:
        return ""
    return f"{contract['tokenizer_digest']}|bos={contract.get('bos_id')}|eos={contract.get('eos_id')}"


def contract_label(contract: dict[str, Any]) -> str:
    """*contract* for a message: the digest's start and the policy."""
    digest = str(contract["tokenizer_digest"])
    return f"tokenizer {digest[:24]}... with bos_id={contract.get('bos_id')}, eos_id={contract.get('eos_id')}"
