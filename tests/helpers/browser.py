"""A real headless browser for the report tests: Debian's chromium, network disabled.

`chromium()` finds the binary (None when absent); `render(page, out_dir)` takes a screenshot and
dumps the DOM after the page's scripts ran, with every way out of the machine closed: a proxy to
a closed loopback port, every host name resolving to nothing, no background networking.
`png_pixels` decodes a PNG with the standard library only (zlib + PNG's row filters), so the
test can tell a blank page from a drawn one without Pillow.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


def _argv(binary: str, profile: Path, *extra: str) -> list[str]:
    return [
        binary,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--proxy-server=127.0.0.1:9",  # the discard port: nothing listens, nothing leaves
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=15000",  # let the page's scripts finish before the snapshot
        *extra,
    ]


def render(page: Path, out_dir: Path, width: int = 1200, height: int = 4000) -> tuple[Path, str]:
    """(screenshot PNG, DOM after scripts) of `page` opened from a file URL."""
    binary = chromium()
    assert binary is not None
    shot = out_dir / "report.png"
    url = page.resolve().as_uri()
    common = dict(capture_output=True, text=True, timeout=120)
    subprocess.run(
        _argv(
            binary,
            out_dir / "profile-shot",
            f"--screenshot={shot}",
            f"--window-size={width},{height}",
            url,
        ),
        check=True,
        **common,
    )
    dom = subprocess.run(
        _argv(binary, out_dir / "profile-dom", "--dump-dom", url), check=True, **common
    ).stdout
    return shot, dom


def png_pixels(path: Path) -> tuple[int, int, np.ndarray]:
    """(width, height, pixels as an array of shape (height, width, channels)) of an 8-bit
    RGB or RGBA PNG, decoded with zlib and PNG's five row filters."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and not interlace, f"unexpected PNG {header}"
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64)
            cur = (cur % 256).astype(np.uint8).reshape(stride)
        elif f == 2:  # Up
            cur = line + prev
        else:  # Average, Paeth: each byte needs the one decoded left of it
            cur = _slow_row(bytes(line), bytes(prev), bpp, int(f))
        out[y] = cur
        prev = cur
    return width, height, out.reshape(height, width, bpp)


def _slow_row(line: bytes, prev: bytes, bpp: int, f: int) -> np.ndarray:
    cur = bytearray(line)
    for i in range(len(cur)):
        a = cur[i - bpp] if i >= bpp else 0
        b = prev[i]
        if f == 3:
            cur[i] = (cur[i] + (a + b) // 2) & 255
            continue
        c = prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.frombuffer(bytes(cur), dtype=np.uint8)
