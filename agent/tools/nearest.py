"""Where in a file the text an edit asked for comes closest, for an ``edit_file`` whose ``old_string`` is absent.

A model's ``old_string`` is usually right but for indentation, a changed word or a line it misremembered; showing
the closest lines lets it copy them exactly on the next try instead of reading the whole file again.

Comparing ``old_string`` with every run of lines character by character costs seconds on a file of thousands of
lines, so runs are ranked first by the rare character trigrams they share with it (a misspelt name still shares
most of its trigrams), and only the best few are compared with ``difflib``.
"""

from __future__ import annotations

import difflib
import heapq
import re
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate

# Past this many lines in a file or in old_string the scan costs more than a fresh read_file saves.
MAX_SCAN_LINES = 50_000
MAX_OLD_LINES = 200
MAX_COMPARED_CHARS = 8_000  # difflib's exact ratio beyond this is slow; its quick bound is used instead
CANDIDATES = 10  # runs of lines compared exactly after the trigram ranking
# Below this similarity nothing is close: saying so beats pointing at unrelated lines.
MIN_RATIO = 0.5
# read_file's "   12\t" prefix, copied into old_string by mistake.
_NUMBER_PREFIX = re.compile(r"^ *\d+\t")


@dataclass(frozen=True)
class Span:
    """Lines ``first``..``last`` (1-based) are ``ratio`` similar to the text looked for."""

    first: int
    last: int
    ratio: float


def closest_span(lines: list[str], old: str) -> Span | None:
    """The run of as many lines as ``old`` has that is most similar to it (None when nothing is close);
    indentation is ignored, so a run that differs only by it scores 1.0."""
    wanted = [line.strip() for line in old.strip("\n").split("\n")]
    size = min(len(wanted), len(lines))
    if not lines or len(wanted) > MAX_OLD_LINES or len(lines) > MAX_SCAN_LINES:
        return None
    stripped = [line.strip() for line in lines]
    target = "\n".join(wanted)
    scores = _line_scores(stripped, _trigrams(target))
    sums = [0.0, *accumulate(scores)]
    starts = range(len(lines) - size + 1)
    ranked = heapq.nlargest(CANDIDATES, starts, key=lambda start: sums[start + size] - sums[start])
    best: Span | None = None
    for start in sorted(ranked):
        ratio = _similarity("\n".join(stripped[start : start + size]), target)
        if ratio >= MIN_RATIO and (best is None or ratio > best.ratio):
            best = Span(start + 1, start + size, ratio)
    return best


def has_line_numbers(old: str) -> bool:
    """Whether every line of ``old`` starts with read_file's line-number prefix."""
    return all(_NUMBER_PREFIX.match(line) for line in old.strip("\n").split("\n"))


def _trigrams(text: str) -> set[str]:
    return {text[i : i + 3] for i in range(len(text) - 2)}


def _line_scores(lines: list[str], wanted: set[str]) -> list[float]:
    """Each line's share of ``wanted``'s trigrams, each weighted by its rarity in the file (``def`` or ``self``
    on every other line says little; ``ke_co`` of ``make_context`` says much)."""
    present = [_trigrams(line) & wanted for line in lines]
    seen_in = Counter(gram for grams in present for gram in grams)
    return [sum(1.0 / seen_in[gram] for gram in grams) for grams in present]


def _similarity(candidate: str, target: str) -> float:
    matcher = difflib.SequenceMatcher(None, candidate, target, autojunk=False)
    if len(candidate) + len(target) > MAX_COMPARED_CHARS:
        return matcher.quick_ratio()
    return matcher.ratio()
