"""Text from outside made safe to show: control characters written as `\\xNN` / `\\uNNNN`.

Keys, origin names, error messages and status texts reach the terminal (`shardcache ls`,
`stats`, `check`) and the log from daemons and origins that may be hostile; an ESC sequence
can retitle or clear a terminal, a CR forge a line. Stdlib only: the loader side and the
`shardcache` command's start-up import it (the light install has nothing else).
"""

from __future__ import annotations

import re

# C0, DEL and C1 (NEL, U+0085, ends a line for some readers), the Unicode line and paragraph
# separators, the bidirectional overrides that reorder what a terminal shows (CVE-2021-42574),
# and lone surrogates (undecodable bytes, which a UTF-8 stream cannot even write).
_OTHER_CONTROLS = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
CONTROL = re.compile(f"[\x00-\x1f{_OTHER_CONTROLS}]")
CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHER_CONTROLS}]")


def escaped(match: re.Match[str]) -> str:
    """The escape of one matched control character (a `re.sub` replacement)."""
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with control characters written as \\xNN or \\uNNNN: a path like
    `/a%0d%0aFAKE LINE` decodes to a CR LF, which must not forge a line in the log, nor may an
    ESC sequence or a U+2028 rewrite what a terminal or a log viewer shows."""
    return CONTROL.sub(escaped, text)


def printable(value: object) -> str:
    """`str(value)` as one line safe for a terminal: what the CLI shows of a daemon's or an
    origin's answer passes here (a key, a name, an error, a status text)."""
    return escape_controls(str(value))
