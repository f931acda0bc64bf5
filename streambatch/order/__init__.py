"""Stage 3, order: the chapter's seeded order of any item kind, and plan files that hold it.

- ``splitmix``: SplitMix64, its draws and the per-epoch seeds;
- ``shuffle``: Fisher–Yates with rejection sampling over a plan of integers (``sb.shuffle``);
- ``plan``, ``plan_check``: the plan in a keyed file, memory-mapped by every rank and worker (``sb.plan_file``);
- ``protocol``: `Orderable`, what these stages need of the items, and `ShuffleOrder`.

Bound on the protocol, never on a kind: this folder sits below ``items/``.
"""
