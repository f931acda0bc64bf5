"""The specification of the shuffle as plain loops, kept deliberately naive.

The library's vectorized shuffle must equal these bit for bit.
"""

from __future__ import annotations

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def mix(state: int) -> int:
    z = state
    z = ((z ^ (z >> 30)) * MIX1) & MASK
    z = ((z ^ (z >> 27)) * MIX2) & MASK
    return z ^ (z >> 31)


class SplitMix64:
    """state = seed; each draw adds the golden gamma, then mixes."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next_u64(self) -> int:
        self.state = (self.state + GOLDEN) & MASK
        return mix(self.state)


def sample_below(rng: SplitMix64, bound: int) -> int:
    threshold = ((1 << 64) - bound) % bound
    while True:
        draw = rng.next_u64()
        if draw >= threshold:
            return draw % bound


def fisher_yates(count: int, seed: int) -> tuple[list[int], int]:
    """The chapter's loop: returns (order, state after)."""
    values = list(range(count))
    rng = SplitMix64(seed)
    for upper in range(count - 1, 0, -1):
        selected = sample_below(rng, upper + 1)
        values[upper], values[selected] = values[selected], values[upper]
    return values, rng.state


def _unshift(value: int, shift: int) -> int:
    result = value
    for _ in range(64 // shift + 1):
        result = value ^ (result >> shift)
    return result & MASK


def unmix(output: int) -> int:
    """Inverse of `mix`: the state whose draw is *output*."""
    z = _unshift(output, 31)
    z = (z * pow(MIX2, -1, 1 << 64)) & MASK
    z = _unshift(z, 27)
    z = (z * pow(MIX1, -1, 1 << 64)) & MASK
    return _unshift(z, 30)


def seed_with_draw(draw_number: int, value: int) -> int:
    """A seed whose *draw_number*-th draw (1-based) equals *value*: forces a rejection."""
    return (unmix(value) - draw_number * GOLDEN) & MASK
