"""How far the cost-model families disagree: Kendall tau between their noise-free runtimes.

Worlds of one seed written with ``--recurrent`` hold the same programs and configs under every
family (only the runtimes differ), so the noise-free labels of a graph can be compared family
against family. Prints, per (collection, program family), the mean tau over the graphs of every
split for each pair of families.

    python -m benchmarks.family_agreement ROOT_A ROOT_B [ROOT_C ...]   # worlds of one seed
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path)
    args = parser.parse_args(argv)

    from pipelines.core.collection import parse_collections
    from pipelines.synth.world import labels_marker, program_kinds, read_labels
    from pipelines.data.root import DataRoot

    names = [labels_marker(r).get("family", "reference") for r in args.roots]
    kinds = program_kinds(args.roots[0])
    if any(program_kinds(r) != kinds for r in args.roots[1:]):
        raise SystemExit("the worlds hold other programs (other seeds, or a reference world without --recurrent)")
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    taus: dict[tuple[str, str], list[list[float]]] = {}
    for collection in parse_collections(labels_marker(args.roots[0])["collections"]):
        for split in ("train", "valid", "test"):
            for ref in DataRoot(args.roots[0]).graphs(collection, split):
                free = [read_labels(r, collection, split, ref.stem).noise_free for r in args.roots]
                row = taus.setdefault((collection.name, kinds[(collection.name, ref.stem)]), [])
                row.append([kendalltau(free[i], free[j])[0] for i, j in pairs])
    header = ["collection", "program family", *(f"{names[i]} / {names[j]}" for i, j in pairs), "graphs"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (collection, kind), rows in taus.items():
        means = np.nanmean(np.array(rows), axis=0)
        print(f"| {collection} | {kind} | " + " | ".join(f"{m:.2f}" for m in means) + f" | {len(rows)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
