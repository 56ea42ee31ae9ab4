"""python -m benchmarks.outside_world_d --in IN_DIR --out OUT_DIR --seed S"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from . import layout_model, noise, tile_model, world

GENERATOR = "outside_world_d"
VERSION = 1


def _fail(msg):
    sys.stderr.write("outside_world_d: error: %s\n" % msg)
    return 2


def relabel(in_dir, out_dir, seed, items, log=None):
    """Price the listed graphs (``world.list_world(in_dir)``) again and write them under out_dir."""
    lj = os.path.join(in_dir, "labels", "labels.json")
    with open(lj) as fh:
        src = json.load(fh)
    if not isinstance(src, dict):
        raise world.WorldError(lj, "must hold a JSON object")
    t0 = time.time()
    for n_done, (coll, cdir, split, stem) in enumerate(items):
        tile = coll == "tile:xla"
        ip = world.npz_path(in_dir, cdir, split, stem)
        arrs = world.load_npz(ip, tile)
        d = dict(arrs)
        rng = noise.rng_for(seed, "%s/%s/%s" % (coll, split, stem))
        sigma = noise.graph_sigma(rng)
        if tile:
            nf, dflt = tile_model.tile_runtimes(d["node_feat"], d["node_opcode"],
                                                d["edge_index"], d["config_feat"])
        else:
            nf = layout_model.layout_runtimes(d["node_feat"], d["node_opcode"], d["edge_index"],
                                              d["node_config_ids"], d["node_config_feat"])
        if not np.all(np.isfinite(nf)) or np.any(nf <= 0):
            raise world.WorldError(ip, "cost model gave a non-positive runtime (bug)")
        meas = noise.measure(rng, nf, sigma)
        labels = [("runtime", meas), ("noise_free", nf.astype(np.float64))]
        if tile:
            norm = noise.measure(rng, np.full(len(nf), dflt), sigma)
            labels.append(("normalizer", norm))
        op = world.npz_path(out_dir, cdir, split, stem)
        if split == "test":
            os.makedirs(os.path.dirname(op), exist_ok=True)
            shutil.copyfile(ip, op)            # hidden runtimes: unchanged bytes
        else:
            new = []
            for k, a in arrs:
                if k == "config_runtime":
                    a = meas
                elif k == "config_runtime_normalizers" and tile:
                    a = norm
                new.append((k, a))
            world.save_npz(op, new)
        world.save_npz(world.label_path(out_dir, cdir, split, stem), labels)
        if log and (n_done + 1) % 100 == 0:
            log("%d/%d files, %.1fs" % (n_done + 1, len(items), time.time() - t0))
    out_labels = {
        "generator": GENERATOR, "version": VERSION, "seed": seed,
        "scale": src.get("scale"), "collections": src.get("collections"),
        "source": {"generator": src.get("generator"), "seed": src.get("seed")},
    }
    with open(os.path.join(out_dir, "labels", "labels.json"), "w") as fh:
        json.dump(out_labels, fh, indent=2, sort_keys=False)
        fh.write("\n")
    for f in ("labels/programs.json", "labels/defaults.json", "sample_submission.csv"):
        shutil.copyfile(os.path.join(in_dir, f), os.path.join(out_dir, f))
    return len(items)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.outside_world_d",
                                 description="Relabel a TpuGraphs-format world with the outside "
                                             "author's TPU cost model and measurement noise.")
    ap.add_argument("--in", dest="in_dir", required=True)
    ap.add_argument("--out", dest="out_dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    in_dir = os.path.abspath(a.in_dir)
    out_dir = os.path.abspath(a.out_dir)
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        return _fail("%s: output directory exists and is not empty" % out_dir)
    if out_dir == in_dir or out_dir.startswith(in_dir + os.sep):
        return _fail("%s: output must lie outside the input world" % out_dir)
    try:
        items = world.list_world(in_dir)
    except world.WorldError as ex:
        return _fail("%s (not a TpuGraphs world)" % ex)
    created = not os.path.exists(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    log = None if a.quiet else (lambda m: sys.stderr.write("outside_world_d: %s\n" % m))
    t0 = time.time()
    try:
        n = relabel(in_dir, out_dir, a.seed, items, log)
    except world.WorldError as ex:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            for e in os.listdir(out_dir):
                p = os.path.join(out_dir, e)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        return _fail("%s (not a TpuGraphs world)" % ex)
    if log:
        log("wrote %d graphs to %s in %.1fs" % (n, out_dir, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
