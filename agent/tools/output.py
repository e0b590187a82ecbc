"""Tool output the model can afford: long output keeps its head and tail and says what was cut."""

from __future__ import annotations

# UTF-8 never needs more than four bytes for a character, so this many bytes per kept character is enough.
_MAX_UTF8_BYTES = 4
# Continuation bytes (0b10xxxxxx) do not start a character; deleting them leaves one byte per character.
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))


def _omission(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def cap_output(text: str, max_chars: int) -> tuple[str, int | None]:
    """Return ``text`` cut to its first and last ``max_chars // 2`` characters, and its length if cut."""
    if len(text) <= max_chars:
        return text, None
    head = max(max_chars, 0) // 2
    tail = max(max_chars, 0) - head
    omitted = len(text) - head - tail
    return text[:head] + _omission(omitted) + text[len(text) - tail :], len(text)


class OutputCapture:
    """Keeps the first and last bytes of a stream of any size, and counts its characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._keep = _MAX_UTF8_BYTES * max(max_chars, 0) + _MAX_UTF8_BYTES
        self._head = bytearray()
        self._tail = bytearray()
        self._chars = 0
        self._dropped = False

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of output."""
        self._chars += len(chunk.translate(None, _CONTINUATION_BYTES))
        room = self._keep - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        if len(self._tail) > self._keep:
            del self._tail[: len(self._tail) - self._keep]
            self._dropped = True

    def result(self) -> tuple[str, int | None]:
        """The decoded output capped like :func:`cap_output`, and its (estimated) length if cut."""
        if not self._dropped:
            return cap_output((self._head + self._tail).decode("utf-8", errors="replace"), self.max_chars)
        # The middle is gone, so the length is counted from the bytes rather than from decoded text.
        head = max(self.max_chars, 0) // 2
        tail = max(self.max_chars, 0) - head
        head_text = self._head.decode("utf-8", errors="replace")[:head]
        tail_text = self._tail.decode("utf-8", errors="replace")
        tail_text = tail_text[len(tail_text) - tail :]
        omitted = max(self._chars - head - tail, 1)
        return head_text + _omission(omitted) + tail_text, self._chars
