"""Write a large HLO dump: renamed copies of the GPT seed's computations (for bench_parse.py; not committed).

    python bench/make_big_dump.py OUT.hlo [--mb 1024]

Every non-entry computation of the seed is copied with a suffix `.cN` on its name and on every reference
to it, after the originals, until the file reaches the size; the seed's entry stays last.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

SHARED = Path(os.environ.get("HLOEXEC_SHARED") or Path(__file__).resolve().parent.parent.parent / "shared")
SEED = SHARED / "seeds" / "gpt_train_step_shard_parallel_16dev.hlo"


def write_dump(out: Path, megabytes: int, seed: Path = SEED) -> int:
    text = seed.read_text()
    header, _, rest = text.partition("\n\n")
    entry_at = rest.index("\nENTRY ")
    body, entry = rest[:entry_at], rest[entry_at:]
    names = re.findall(r"^%?([\w.\-]+) \(", body, re.M)
    pattern = re.compile(r"%(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    target = megabytes << 20
    with open(out, "w") as f:
        f.write(header + "\n\n" + body)   # the originals, which the entry calls
        written, copy = len(header) + len(body), 0
        while written + len(entry) < target:
            copy += 1
            chunk = pattern.sub(lambda m, c=copy: f"%{m.group(1)}.c{c}", body)
            f.write(chunk)
            written += len(chunk)
        f.write(entry)
    return out.stat().st_size


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=int, default=1024)
    args = ap.parse_args()
    print(f"{args.out}: {write_dump(args.out, args.mb) / 2**20:.0f} MB")
