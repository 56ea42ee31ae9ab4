"""Peak memory and wall time of reading one layout file: our chunked int8 reader vs. a plain np.load.

Usage: python -m benchmarks.read_memory FILE.npz [--collection layout:xla:default]

Each measurement runs in a fresh subprocess so its peak resident set size (ru_maxrss) is its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_READERS = {
    "pipelines.load_graph": (
        "from pipelines.data.tpugraphs import load_graph; from pipelines.core.collection import parse_collection\n"
        "g = load_graph(PATH, parse_collection(COLLECTION))\n"
        "shape = g.node_config_feat.shape"
    ),
    "np.load (all arrays)": (
        "import numpy as np\n"
        "z = np.load(PATH); arrays = {k: z[k] for k in z.files}\n"
        "shape = arrays['node_config_feat'].shape"
    ),
}

_WRAPPER = """
import resource, time, json
PATH, COLLECTION = {path!r}, {collection!r}
start = time.perf_counter()
{body}
wall = time.perf_counter() - start
print(json.dumps({{"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "shape": list(shape)}}))
"""


def measure(path: str, collection: str) -> dict[str, dict]:
    results = {}
    for name, body in _READERS.items():
        code = _WRAPPER.format(path=path, collection=collection, body=body)
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--collection", default="layout:xla:default")
    args = parser.parse_args()
    results = measure(args.file, args.collection)
    print(f"{'reader':24s} {'wall s':>8s} {'peak RSS MB':>12s}  node_config_feat shape")
    for name, r in results.items():
        print(f"{name:24s} {r['wall_s']:8.2f} {r['peak_rss_mb']:12.0f}  {tuple(r['shape'])}")


if __name__ == "__main__":
    main()
