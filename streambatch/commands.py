"""Further CLI commands (store preparation and inspection) registered on the main parser."""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    """Add this module's subcommands to *commands* (an argparse subparsers object)."""
