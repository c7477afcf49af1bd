"""Line-by-line reading of trace files, plain or gzip-compressed (detected by magic bytes)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

from pddemu.workload.records import TraceError

_GZIP_MAGIC = b"\x1f\x8b"


def _open(path: Path) -> tuple[BinaryIO, bool]:
    """The file as a binary stream, and whether it is gzip-compressed."""
    try:
        with path.open("rb") as probe:
            compressed = probe.read(2) == _GZIP_MAGIC
        stream = gzip.open(path, "rb") if compressed else path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc.strerror or exc})") from exc
    return stream, compressed  # type: ignore[return-value]


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw line) without holding more than one line in memory."""
    line_no = 0
    stream, compressed = _open(path)
    with stream:
        try:
            for line in stream:
                line_no += 1
                yield line_no, line
        except (OSError, EOFError, zlib.error) as exc:
            what = "unreadable gzip data" if compressed else "read error"
            raise TraceError(f"{path}:{line_no + 1}: {what} ({exc})") from exc


def first_content_line(path: Path) -> tuple[int, bytes] | None:
    """The first non-blank line, for format detection; None for an empty file."""
    with closing(iter_lines(path)) as lines:
        for line_no, line in lines:
            if line.strip():
                return line_no, line
    return None


def read_all(path: Path) -> bytes:
    """The whole file, plain or gzip-compressed (for formats that are one JSON document)."""
    stream, compressed = _open(path)
    with stream:
        try:
            return stream.read()
        except (OSError, EOFError, zlib.error) as exc:
            what = "unreadable gzip data" if compressed else "read error"
            raise TraceError(f"{path}: {what} ({exc})") from exc
