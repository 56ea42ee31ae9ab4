import argparse
import sys
import time

from .world import COLLECTIONS, generate


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m outside_world_c",
                                 description="Write a synthetic TpuGraphs-format world with hidden labels.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", choices=["tiny", "small", "medium"], default="tiny")
    ap.add_argument("--collections", nargs="*", default=None,
                    help="subset of: " + " ".join(COLLECTIONS))
    a = ap.parse_args(argv)
    cols = a.collections or COLLECTIONS
    bad = [c for c in cols if c not in COLLECTIONS]
    if bad:
        ap.error(f"unknown collections {bad}")
    t = time.time()
    timing = generate(a.out, a.seed, a.scale, [c for c in COLLECTIONS if c in cols])
    for k, v in timing.items():
        print(f"{k}: {v:.1f}s", file=sys.stderr)
    print(f"total: {time.time() - t:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
