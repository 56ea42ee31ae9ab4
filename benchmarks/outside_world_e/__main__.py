"""Relabel a TpuGraphs-format world with the outside author's TPU cost model.

usage: python -m benchmarks.outside_world_e --in IN_DIR --out OUT_DIR --seed S [--quiet]
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from . import model, wio

GENERATOR, VERSION = "outside_world_e", 1


def _fail(msg):
    print(msg, file=sys.stderr)
    return 2


def check_input(src):
    need = [os.path.join(src, "npz_all", "npz"), os.path.join(src, "labels", "labels.json")]
    for p in need:
        if not os.path.exists(p):
            return p
    try:
        marker = json.load(open(need[1]))
        assert isinstance(marker, dict)
    except Exception:
        return need[1]
    if not any(True for _ in wio.iter_files(src)):
        return need[0]
    return None


def relabel_file(src_path, col, split, stem, seed):
    """Return (data arrays for OUT or None for test, label arrays)."""
    d = wio.load(src_path)
    rng = wio.file_rng(seed, f"{col}/{split}/{stem}")
    if col == "tile:xla":
        s = model.tile_setup(d["node_feat"], d["node_opcode"], d["edge_index"])
        nf = np.array([model.tile_ns(s, c) for c in d["config_feat"].astype(np.float64)])
        dnf = model.tile_ns(s, model.tile_default_cfg(s))
        run = model.measure(rng, nf, model.tile_sigma(nf))
        norm = model.measure(rng, np.full(len(nf), dnf), model.tile_sigma(dnf))
        labels = {"runtime": run, "noise_free": nf.astype(np.float64), "normalizer": norm}
        if split != "test":
            d["config_runtime"] = run
            d["config_runtime_normalizers"] = norm
    else:
        nf = model.layout_noise_free(d["node_feat"], d["node_opcode"], d["edge_index"],
                                     d["node_config_ids"], d["node_config_feat"])
        run = model.measure(rng, nf, model.LAYOUT_SIGMA)
        labels = {"runtime": run, "noise_free": nf.astype(np.float64)}
        if split != "test":
            d["config_runtime"] = run
    if not np.all(np.isfinite(nf)) or np.any(nf <= 0):
        raise ValueError(f"non-finite or non-positive runtime in {src_path}")
    return (None if split == "test" else d), labels


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.outside_world_e")
    ap.add_argument("--in", dest="src", required=True)
    ap.add_argument("--out", dest="dst", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    bad = check_input(a.src)
    if bad is not None:
        return _fail(f"error: not a TpuGraphs world: {bad}")
    if os.path.exists(a.dst) and (not os.path.isdir(a.dst) or os.listdir(a.dst)):
        return _fail(f"error: output exists and is not empty: {a.dst}")
    t0 = time.time()
    marker = json.load(open(os.path.join(a.src, "labels", "labels.json")))
    os.makedirs(a.dst, exist_ok=True)
    n = 0
    for col, split, stem, rel in wio.iter_files(a.src):
        sp = os.path.join(a.src, "npz_all", "npz", rel)
        data, labels = relabel_file(sp, col, split, stem, a.seed)
        op = os.path.join(a.dst, "npz_all", "npz", rel)
        if data is None:
            os.makedirs(os.path.dirname(op), exist_ok=True)
            shutil.copyfile(sp, op)
        else:
            wio.save(op, data)
        wio.save(os.path.join(a.dst, "labels", "npz", rel), labels)
        n += 1
        if not a.quiet and n % 100 == 0:
            print(f"{n} files, {time.time() - t0:.1f}s", flush=True)
    for name in ("programs.json", "defaults.json"):
        p = os.path.join(a.src, "labels", name)
        if os.path.exists(p):
            shutil.copyfile(p, os.path.join(a.dst, "labels", name))
    p = os.path.join(a.src, "sample_submission.csv")
    if os.path.exists(p):
        shutil.copyfile(p, os.path.join(a.dst, "sample_submission.csv"))
    out_marker = {"generator": GENERATOR, "version": VERSION, "seed": a.seed,
                  "scale": marker.get("scale"), "collections": marker.get("collections"),
                  "source": {"generator": marker.get("generator"), "seed": marker.get("seed")}}
    with open(os.path.join(a.dst, "labels", "labels.json"), "w") as f:
        json.dump(out_marker, f, indent=1, sort_keys=False)
        f.write("\n")
    if not a.quiet:
        print(f"wrote {n} files to {a.dst} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
