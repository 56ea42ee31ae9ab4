"""Check an outside_world_e output against the contract and print a short summary.

usage: python -m benchmarks.outside_world_e.selfcheck OUT_DIR [--in IN_DIR]
"""
import argparse
import filecmp
import json
import os
import sys
from collections import defaultdict

import numpy as np

from . import wio


def kendall_tau_b(x, y, cap=1500, seed=0):
    """Kendall tau-b (ties handled) on at most `cap` rows (deterministic subsample)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) > cap:
        idx = np.random.default_rng(seed).choice(len(x), cap, replace=False)
        x, y = x[idx], y[idx]
    if len(x) < 2:
        return float("nan")
    iu = np.triu_indices(len(x), 1)
    dx = np.sign(x[:, None] - x[None, :])[iu]
    dy = np.sign(y[:, None] - y[None, :])[iu]
    den = np.sqrt(float(np.sum(dx != 0)) * float(np.sum(dy != 0)))
    return float(np.sum(dx * dy) / den) if den > 0 else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.outside_world_e.selfcheck")
    ap.add_argument("out")
    ap.add_argument("--in", dest="src", default=None)
    a = ap.parse_args(argv)
    errs = []

    def err(msg):
        if len(errs) < 20:
            print("FAIL:", msg)
        errs.append(msg)

    lj = os.path.join(a.out, "labels", "labels.json")
    if not os.path.exists(lj):
        print(f"FAIL: missing {lj}")
        return 1
    mk = json.load(open(lj))
    for k in ("generator", "version", "seed", "scale", "collections", "source"):
        if k not in mk:
            err(f"labels.json lacks {k}")
    if mk.get("generator") != "outside_world_e" or mk.get("version") != 1:
        err("labels.json generator/version")
    if os.path.exists(os.path.join(a.out, "lowered.json")):
        err("lowered.json must not be copied")
    for rel in ("labels/programs.json", "labels/defaults.json", "sample_submission.csv"):
        p = os.path.join(a.out, rel)
        if a.src and os.path.exists(os.path.join(a.src, rel)):
            if not os.path.exists(p) or not filecmp.cmp(p, os.path.join(a.src, rel), shallow=False):
                err(f"{rel} not copied unchanged")
    if a.src:
        im = json.load(open(os.path.join(a.src, "labels", "labels.json")))
        want = {"scale": im.get("scale"), "collections": im.get("collections"),
                "source": {"generator": im.get("generator"), "seed": im.get("seed")}}
        for k, v in want.items():
            if mk.get(k) != v:
                err(f"labels.json {k} = {mk.get(k)!r}, want {v!r}")
        src_files = {r for *_, r in wio.iter_files(a.src)}
        out_files = {r for *_, r in wio.iter_files(a.out)}
        if src_files != out_files:
            err(f"file sets differ: {len(src_files ^ out_files)} files")
    dpath = os.path.join(a.out, "labels", "defaults.json")
    defaults = json.load(open(dpath)) if os.path.exists(dpath) else {}
    st = defaultdict(lambda: defaultdict(list))
    for col, split, stem, rel in wio.iter_files(a.out):
        op = os.path.join(a.out, "npz_all", "npz", rel)
        lp = os.path.join(a.out, "labels", "npz", rel)
        if not os.path.exists(lp):
            err(f"missing label {lp}")
            continue
        d, lab = wio.load(op), wio.load(lp)
        rt, nf = lab.get("runtime"), lab.get("noise_free")
        tile = col == "tile:xla"
        C = len(d["config_feat"] if tile else d["node_config_feat"])
        if rt is None or rt.dtype != np.int64 or rt.shape != (C,):
            err(f"{lp}: runtime int64 ({C},)")
            continue
        if nf is None or nf.dtype != np.float64 or nf.shape != (C,):
            err(f"{lp}: noise_free float64 ({C},)")
            continue
        if tile and (lab.get("normalizer") is None or lab["normalizer"].dtype != np.int64
                     or lab["normalizer"].shape != (C,)):
            err(f"{lp}: normalizer int64 ({C},)")
            continue
        if not (np.all(rt > 0) and np.all(np.isfinite(nf)) and np.all(nf > 0)):
            err(f"{lp}: non-positive or non-finite runtimes")
        if split != "test":
            if not np.array_equal(d["config_runtime"], rt) or d["config_runtime"].dtype != np.int64:
                err(f"{op}: config_runtime != label runtime")
            if tile and not np.array_equal(d["config_runtime_normalizers"], lab["normalizer"]):
                err(f"{op}: normalizers != label normalizer")
        if a.src:
            sp = os.path.join(a.src, "npz_all", "npz", rel)
            if split == "test":
                if not filecmp.cmp(sp, op, shallow=False):
                    err(f"{op}: test file not a byte copy")
            else:
                s = wio.load(sp)
                if list(s) != list(d):
                    err(f"{op}: keys differ")
                for k in s:
                    if k in ("config_runtime", "config_runtime_normalizers"):
                        continue
                    if s[k].dtype != d[k].dtype or not np.array_equal(s[k], d[k]):
                        err(f"{op}: array {k} changed")
        S = st[col]
        S["files"].append(1)
        S["tau"].append(kendall_tau_b(nf, rt))
        S["spread"].append(float(nf.max() / nf.min()))
        if tile:
            S["def_best"].append(float(np.median(lab["normalizer"]) <= rt.min()))
        elif stem in defaults.get(col, {}):
            S["def_best"].append(float(np.argmin(nf) == defaults[col][stem]
                                       or nf[defaults[col][stem]] <= nf.min() * (1 + 1e-9)))
    print(f"{'collection':20s} {'files':>5s} {'tau(nf,rt)':>10s} {'spread med':>10s} "
          f"{'spread max':>10s} {'default best':>12s}")
    for col in wio.ALL_COLS:
        S = st.get(col)
        if not S:
            continue
        db = np.mean(S["def_best"]) if S["def_best"] else float("nan")
        print(f"{col:20s} {len(S['files']):5d} {np.nanmean(S['tau']):10.3f} "
              f"{np.median(S['spread']):10.3f} {np.max(S['spread']):10.3f} {db:12.2f}")
    if errs:
        print(f"contract FAILED: {len(errs)} problem(s)")
        return 1
    print("contract OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
