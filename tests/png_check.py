#!/usr/bin/env python3
"""png_check.py PNG WIDTH HEIGHT - is a screenshot the size asked, and not blank?

Decodes the PNG with zlib alone (8-bit greyscale, RGB, RGBA, grey+alpha;
not interlaced: what Chromium writes) and counts colours. A page that did
not render is one or two flat colours; the timeline page has a chart with
areas, lines, bands and text. Passes when the image has at least
MIN_COLOURS distinct colours and at least MIN_INK of its pixels are
neither of its two most common colours (the page and card backgrounds).
Exit 0 when it passes, 1 when it does not, 2 on a bad or unreadable file.
"""
import struct
import sys
import zlib
from collections import Counter

MIN_COLOURS = 200
MIN_INK = 0.03


def decode(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, hdr = 8, [], None
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    if hdr is None:
        raise ValueError("no IHDR chunk")
    width, height, depth, ctype, _, _, interlace = hdr
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or channels is None or interlace:
        raise ValueError("unsupported PNG: depth %d, colour type %d, interlace %d" % (depth, ctype, interlace))
    raw = zlib.decompress(b"".join(idat))
    bpp, stride = channels, width * channels
    if len(raw) != height * (stride + 1):
        raise ValueError("pixel data is %d bytes, expected %d" % (len(raw), height * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(height):
        off = y * (stride + 1)
        ftype, line = raw[off], bytearray(raw[off + 1:off + 1 + stride])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif ftype != 0:
            raise ValueError("bad filter type %d in row %d" % (ftype, y))
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main(argv):
    if len(argv) != 4:
        print("usage: png_check.py PNG WIDTH HEIGHT", file=sys.stderr)
        return 2
    path, want_w, want_h = argv[1], int(argv[2]), int(argv[3])
    try:
        width, height, channels, rows = decode(path)
    except (OSError, ValueError, zlib.error) as e:
        print("png_check: %s: %s" % (path, e), file=sys.stderr)
        return 2
    colours = Counter()
    for row in rows:
        colours.update(row[i:i + channels] for i in range(0, len(row), channels))
    total = width * height
    top2 = sum(n for _, n in colours.most_common(2))
    ink = (total - top2) / total if total else 0.0
    print("png_check: %s: %dx%d, %d colours, %.1f%% of pixels off the two background colours"
          % (path, width, height, len(colours), 100 * ink))
    ok = True
    if (width, height) != (want_w, want_h):
        print("png_check: size %dx%d, expected %dx%d" % (width, height, want_w, want_h), file=sys.stderr)
        ok = False
    if len(colours) < MIN_COLOURS or ink < MIN_INK:
        print("png_check: looks blank (want >= %d colours and >= %.0f%% ink)" % (MIN_COLOURS, 100 * MIN_INK),
              file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
