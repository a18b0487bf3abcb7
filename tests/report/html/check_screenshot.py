#!/usr/bin/env python3
"""Checks that a PNG screenshot is not blank: it decodes the PNG with the
standard library only (zlib), then counts distinct colours and the share of
pixels that differ from the most common one (the page background).

Usage: check_screenshot.py FILE.png [MIN_COLOURS] [MIN_INK_PERCENT]
Prints "colours=N ink=P%" and exits 0 when both reach their minimum, 1 when
not, 2 when the file is not a PNG it can read.
"""
import struct
import sys
import zlib
from collections import Counter


def decode(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG (bad signature)")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("no IHDR chunk")
    width, height, depth, colour_type, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(colour_type)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour_type}, interlace {interlace}")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, previous, pos = [], bytearray(stride), 0
    for _ in range(height):
        kind = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + predictor) & 0xFF
            elif kind != 0:
                raise ValueError(f"bad filter type {kind}")
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def main():
    path = sys.argv[1]
    min_colours = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    min_ink = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    try:
        width, height, channels, rows = decode(path)
    except (OSError, ValueError, zlib.error) as error:
        print(f"{path}: {error}")
        return 2
    counts = Counter()
    for row in rows:
        for x in range(0, width * channels, channels):
            counts[row[x:x + 3]] += 1
    total = width * height
    background = counts.most_common(1)[0][1] if counts else 0
    ink = 100.0 * (total - background) / total if total else 0.0
    print(f"size={width}x{height} colours={len(counts)} ink={ink:.2f}%")
    return 0 if len(counts) >= min_colours and ink >= min_ink else 1


if __name__ == "__main__":
    sys.exit(main())
