"""Where each key of a TOML document is written: key path → line number.

tomllib returns values without positions, and a message "models.smol.versions.v2.traffic:
must be >= 0" is much quicker to act on with "line 31" in front. This scanner reads the text
once and records the line of every table header and every `key = value`, under the full path
the parsed document gives it (dotted keys, quoted keys, `[[arrays of tables]]` with their
index). It only needs to find keys, not values: multi-line strings and arrays are skipped,
and inline tables are left to `line_of`, which falls back to the nearest recorded ancestor —
the line of the `key = { ... }` itself. The text was already accepted by tomllib, so the
scanner may assume well-formed input.
"""

from __future__ import annotations

from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _parse_key(s: str, i: int) -> tuple[list[str], int]:
    """A dotted key starting at s[i]; returns its parts and the index after it."""
    parts: list[str] = []
    n = len(s)
    while True:
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] == '"':
            j, buf = i + 1, []
            while j < n and s[j] != '"':
                if s[j] == "\\" and j + 1 < n:
                    buf.append(s[j + 1])  # escapes in key names are rare; keep the char
                    j += 2
                    continue
                buf.append(s[j])
                j += 1
            parts.append("".join(buf))
            i = j + 1
        elif i < n and s[i] == "'":
            j = s.find("'", i + 1)
            parts.append(s[i + 1 : j])
            i = j + 1
        else:
            j = i
            while j < n and s[j] in _BARE:
                j += 1
            parts.append(s[i:j])
            i = j
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] == ".":
            i += 1
            continue
        return parts, i


def _value_state(value: str, depth: int) -> tuple[int, str | None]:
    """Bracket depth after `value`, and the multi-line string delimiter left open, if any."""
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c == "#":
            break
        if value.startswith('"""', i) or value.startswith("'''", i):
            delim = value[i : i + 3]
            end = value.find(delim, i + 3)
            if end < 0:
                return depth, delim
            i = end + 3
            continue
        if c in "\"'":
            j = i + 1
            while j < n and value[j] != c:
                j += 2 if c == '"' and value[j] == "\\" else 1
            i = j + 1
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        i += 1
    return depth, None


def key_lines(text: str) -> dict[KeyPath, int]:
    lines: dict[KeyPath, int] = {}
    table: KeyPath = ()
    array_counts: dict[KeyPath, int] = {}  # elements seen per array of tables (full path)
    current: dict[tuple[str, ...], int] = {}  # the open element of each array of tables

    def expand(parts: list[str]) -> KeyPath:
        # `[[a]]` then `[a.b]`: b lives in a's latest element, so its path is (a, index, b)
        out: list[str | int] = []
        for j, part in enumerate(parts):
            out.append(part)
            if j < len(parts) - 1 and tuple(parts[: j + 1]) in current:
                out.append(current[tuple(parts[: j + 1])])
        return tuple(out)

    depth = 0  # open brackets of a multi-line array / inline table
    open_string: str | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if open_string is not None:  # inside a multi-line string: look only for its end
            end = raw.find(open_string)
            if end < 0:
                continue
            depth, open_string = _value_state(raw[end + 3 :], depth)
            continue
        if depth > 0:
            depth, open_string = _value_state(raw, depth)
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            parts, _ = _parse_key(line, 2)
            path = expand(parts)
            index = array_counts.get(path, 0)
            array_counts[path] = index + 1
            current[tuple(parts)] = index
            table = (*path, index)
            lines.setdefault(path, lineno)
            lines[table] = lineno
            continue
        if line.startswith("["):
            parts, _ = _parse_key(line, 1)
            table = expand(parts)
            for k in range(1, len(table) + 1):  # implicit parent tables: first mention
                lines.setdefault(table[:k], lineno)
            continue
        parts, i = _parse_key(line, 0)
        if i < len(line) and line[i] == "=":
            full = (*table, *parts)
            for k in range(len(table) + 1, len(full) + 1):
                lines.setdefault(full[:k], lineno)
            depth, open_string = _value_state(line[i + 1 :], 0)
    return lines


def line_of(lines: dict[KeyPath, int], path: Sequence[str | int]) -> int | None:
    """The line of `path`, else of its nearest recorded ancestor, else None."""
    p = tuple(path)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return None
