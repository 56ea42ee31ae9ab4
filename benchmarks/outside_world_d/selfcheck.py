"""Validate an output world:  python -m benchmarks.outside_world_d.selfcheck OUT_DIR [--in IN_DIR]

Checks every file is present with the right arrays, shapes and dtypes,
runtimes positive int64, labels consistent with the npz files, test files
with hidden (zero) runtimes; with --in also that every graph and config is
unchanged and test files are byte-identical to the input's.
"""
import argparse
import filecmp
import json
import os
import sys

import numpy as np

from . import world


def check(out_dir, in_dir=None):
    errs = []

    def err(path, msg):
        errs.append("%s: %s" % (path, msg))

    try:
        items = world.list_world(out_dir)
    except world.WorldError as ex:
        return [str(ex)], 0, 0
    lj = os.path.join(out_dir, "labels", "labels.json")
    with open(lj) as fh:
        lab = json.load(fh)
    for k in ("generator", "version", "seed", "scale", "collections", "source"):
        if k not in lab:
            err(lj, "missing key %r" % k)
    if lab.get("generator") != "outside_world_d":
        err(lj, "generator is %r" % lab.get("generator"))
    if in_dir is not None:
        in_items = world.list_world(in_dir)
        if sorted(in_items) != sorted(items):
            err(out_dir, "graph set differs from the input world")
        for f in ("labels/programs.json", "labels/defaults.json", "sample_submission.csv"):
            if not filecmp.cmp(os.path.join(in_dir, f), os.path.join(out_dir, f), shallow=False):
                err(os.path.join(out_dir, f), "differs from the input copy")
    n_cfg = 0
    for coll, cdir, split, stem in items:
        tile = coll == "tile:xla"
        p = world.npz_path(out_dir, cdir, split, stem)
        try:
            d = dict(world.load_npz(p, tile))
        except world.WorldError as ex:
            errs.append(str(ex))
            continue
        spec = world.TILE_KEYS if tile else world.LAYOUT_KEYS
        for k, (dt, nd) in spec.items():
            if d[k].dtype != dt:
                err(p, "%s has dtype %s, expected %s" % (k, d[k].dtype, np.dtype(dt)))
        c = len(d["config_runtime"])
        n_cfg += c
        lp = world.label_path(out_dir, cdir, split, stem)
        with np.load(lp) as z:
            L = {k: z[k] for k in z.files}
        need = ["runtime", "noise_free"] + (["normalizer"] if tile else [])
        for k in need:
            if k not in L:
                err(lp, "missing %r" % k)
        if any(k not in L for k in need):
            continue
        if L["runtime"].dtype != np.int64 or L["runtime"].shape != (c,):
            err(lp, "runtime must be int64 (%d,)" % c)
        if L["noise_free"].dtype != np.float64 or L["noise_free"].shape != (c,):
            err(lp, "noise_free must be float64 (%d,)" % c)
        if not (L["runtime"] > 0).all():
            err(lp, "non-positive runtime")
        if not (np.isfinite(L["noise_free"]).all() and (L["noise_free"] > 0).all()):
            err(lp, "noise_free not finite and positive")
        if tile:
            if L["normalizer"].dtype != np.int64 or L["normalizer"].shape != (c,) \
                    or not (L["normalizer"] > 0).all():
                err(lp, "normalizer must be positive int64 (%d,)" % c)
        if split == "test":
            if (d["config_runtime"] != 0).any():
                err(p, "test file has non-zero runtimes")
            if in_dir is not None and not filecmp.cmp(
                    world.npz_path(in_dir, cdir, split, stem), p, shallow=False):
                err(p, "test file differs from the input's")
        else:
            if not np.array_equal(d["config_runtime"], L["runtime"]):
                err(p, "config_runtime differs from labels runtime")
            if not (d["config_runtime"] > 0).all():
                err(p, "non-positive config_runtime")
            if tile and not np.array_equal(d["config_runtime_normalizers"], L["normalizer"]):
                err(p, "config_runtime_normalizers differs from labels normalizer")
            if in_dir is not None:
                src = dict(world.load_npz(world.npz_path(in_dir, cdir, split, stem), tile))
                for k in src:
                    if k in ("config_runtime", "config_runtime_normalizers"):
                        continue
                    if k not in d or d[k].dtype != src[k].dtype or not np.array_equal(d[k], src[k]):
                        err(p, "array %r differs from the input" % k)
                if set(src) != set(d):
                    err(p, "array names differ from the input")
    return errs, len(items), n_cfg


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.outside_world_d.selfcheck")
    ap.add_argument("out_dir")
    ap.add_argument("--in", dest="in_dir", default=None)
    a = ap.parse_args(argv)
    errs, n, c = check(a.out_dir, a.in_dir)
    for e in errs[:50]:
        print("FAIL", e)
    if errs:
        print("selfcheck: %d problem(s)" % len(errs))
        return 1
    print("selfcheck: OK, %d graphs, %d configs" % (n, c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
