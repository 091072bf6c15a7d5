"""Counts and rates as the commands write them (``1 message``, ``N messages processed (R msg/s)``)."""

from __future__ import annotations


def _count(n: int, word: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages``, ``1,000 messages``: ``n`` with ``word`` in its number."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def _rate_text(processed: int, seconds: float) -> str:
    """``N messages processed (R msg/s)``: the summaries' first figures."""
    rate = processed / seconds if seconds > 0 else 0.0
    return f"{_count(processed, 'message')} processed ({rate:,.0f} msg/s)"


def bad_message_text(skipped: int, dead_lettered: int, retried: int) -> str:
    """The run summary's line on bad messages (task.error.policy, rule 39), or ""."""
    parts = []
    if skipped:
        parts.append(f"{_count(skipped, 'bad message')} skipped")
    if dead_lettered:
        parts.append(f"{_count(dead_lettered, 'bad message')} dead-lettered")
    if retried:
        parts.append(f"{_count(retried, 'retry', 'retries')} of a failed process")
    return ", ".join(parts)
