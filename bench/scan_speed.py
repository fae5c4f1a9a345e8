"""Scan speed of the C scanner through its binding: `scan(buf)` best of N per file, the tables handed to
numpy as `parse()` gets them. The library is the installed one, or HLOEXEC_SCAN_LIBRARY's.

    HLOEXEC_SCAN_LIBRARY=/tmp/libold.so python bench/scan_speed.py [-n 100] FILE...
"""
import argparse
import time
from pathlib import Path

from hloexec.parser.scan import LIBRARY_PATH, scan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("-n", type=int, default=100, help="scans per file (the best is reported)")
    args = ap.parse_args()
    print(LIBRARY_PATH)
    for f in args.files:
        buf = f.read_bytes()
        best = float("inf")
        for _ in range(args.n):
            t0 = time.perf_counter()
            tables = scan(buf)
            best = min(best, time.perf_counter() - t0)
            del tables     # freed before the next scan, as a parse frees them
        print(f"{f.name[:60]:60s} {len(buf) / 1e6:6.2f} MB {best * 1e3:7.2f} ms {len(buf) / best / 1e6:6.0f} MB/s")


if __name__ == "__main__":
    main()
