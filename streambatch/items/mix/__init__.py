"""Mixtures: items of several sources interleaved in fixed proportions."""
