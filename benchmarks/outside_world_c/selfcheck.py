"""Validate a world written by outside_world_c against FORMAT.md (and the label contract).

usage: python selfcheck.py DIR [--quick]
Exit status 0 when every check passes; prints a per-collection summary."""
import csv
import glob
import json
import os
import sys

import numpy as np

COLLS = ["tile:xla", "layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random"]
KINDS = {"cnn", "rnn", "transformer", "mlp"}
errors = []


def err(msg):
    errors.append(msg)
    if len(errors) < 60:
        print("FAIL:", msg)


def coll_dir(root, c):
    p = c.split(":")
    if p[0] == "tile":
        return os.path.join(root, "npz_all", "npz", "tile", "xla")
    return os.path.join(root, "npz_all", "npz", "layout", p[1], p[2])


def label_dir(root, c):
    p = c.split(":")
    if p[0] == "tile":
        return os.path.join(root, "labels", "npz", "tile", "xla")
    return os.path.join(root, "labels", "npz", "layout", p[1], p[2])


def check_common(f, d, n_expected_keys):
    nf, op, ei = d["node_feat"], d["node_opcode"], d["edge_index"]
    n = nf.shape[0]
    if nf.dtype != np.float32 or nf.ndim != 2 or nf.shape[1] != 140:
        err(f"{f}: node_feat {nf.dtype} {nf.shape}")
    if op.dtype != np.uint8 or op.shape != (n,):
        err(f"{f}: node_opcode {op.dtype} {op.shape}")
    if op.min() < 1 or op.max() > 120:
        err(f"{f}: opcode range {op.min()} {op.max()}")
    if ei.dtype != np.int64 or ei.ndim != 2 or ei.shape[1] != 2:
        err(f"{f}: edge_index {ei.dtype} {ei.shape}")
    elif len(ei):
        if not (ei[:, 0] > ei[:, 1]).all():
            err(f"{f}: edge not consumer > producer")
        if ei.min() < 0 or ei.max() >= n:
            err(f"{f}: edge out of range")
        order = np.lexsort((ei[:, 1], ei[:, 0]))
        if not (order == np.arange(len(ei))).all():
            err(f"{f}: edges not sorted")
        if len(np.unique(ei, axis=0)) != len(ei):
            err(f"{f}: duplicate edges")
    oh = nf[:, 2:21]
    if not (oh.sum(1) == 1).all():
        err(f"{f}: element-type one-hot not exactly one per node")
    if (nf[:, 1] != 0).any():
        err(f"{f}: element_size_in_bits not 0")
    if (nf[:, 0].sum() < 1):
        err(f"{f}: no root")
    if not np.isfinite(nf).all():
        err(f"{f}: non-finite node_feat")
    # product column of shape dims: product of the listed dims for rank<=6
    return n


def main(root, quick=False):
    lj = os.path.join(root, "labels", "labels.json")
    pj = os.path.join(root, "labels", "programs.json")
    if not os.path.exists(lj) or not os.path.exists(pj):
        err("labels.json / programs.json missing")
        return
    meta = json.load(open(lj))
    for k in ("generator", "version", "seed", "scale", "collections"):
        if k not in meta:
            err(f"labels.json lacks {k}")
    progs = json.load(open(pj))
    dj = os.path.join(root, "labels", "defaults.json")
    if not os.path.exists(dj):
        err("defaults.json missing")
        dflts = {}
    else:
        dflts = json.load(open(dj))
    seen_stems = {}
    test_ids = set()
    summary = []
    test_stems = {}
    for c in meta["collections"]:
        base = coll_dir(root, c)
        lab = label_dir(root, c)
        is_tile = c.startswith("tile")
        counts = {}
        ncfg = []
        nnodes = []
        for split in ("train", "valid", "test"):
            files = sorted(glob.glob(os.path.join(base, split, "*.npz")))
            counts[split] = len(files)
            if split == "test":
                test_stems[c] = {os.path.basename(f)[:-4] for f in files}
            for fi, f in enumerate(files):
                if quick and fi >= 3:
                    break
                stem = os.path.basename(f)[:-4]
                seen_stems.setdefault(c, set()).add(stem)
                d = dict(np.load(f))
                keys = {"node_feat", "node_opcode", "edge_index", "config_runtime"}
                keys |= {"config_feat", "config_runtime_normalizers"} if is_tile else \
                    {"node_config_feat", "node_config_ids", "node_splits"}
                if set(d) != keys:
                    err(f"{f}: keys {sorted(d)}")
                    continue
                n = check_common(f, d, keys)
                nnodes.append(n)
                rt = d["config_runtime"]
                c_n = rt.shape[0]
                ncfg.append(c_n)
                if rt.dtype != np.int64 or rt.ndim != 1:
                    err(f"{f}: config_runtime {rt.dtype} {rt.shape}")
                if split == "test":
                    if (rt != 0).any():
                        err(f"{f}: test runtimes not 0")
                    if len(stem) != 32 or any(ch not in "0123456789abcdef" for ch in stem):
                        err(f"{f}: test stem not 32-hex")
                elif (rt <= 0).any():
                    err(f"{f}: non-positive runtime")
                if is_tile:
                    cf, nz = d["config_feat"], d["config_runtime_normalizers"]
                    if cf.dtype != np.float32 or cf.shape != (c_n, 24):
                        err(f"{f}: config_feat {cf.dtype} {cf.shape}")
                    if nz.dtype != np.int64 or nz.shape != (c_n,):
                        err(f"{f}: normalizers {nz.dtype} {nz.shape}")
                    if split == "test" and (nz != 1).any():
                        err(f"{f}: test normalizers not 1")
                    if split != "test" and (nz <= 0).any():
                        err(f"{f}: non-positive normalizer")
                    for blk in range(3):
                        b = cf[:, blk * 8: blk * 8 + 6]
                        k = (b > 0).sum(1)
                        s = cf[:, blk * 8 + 6]
                        if not np.allclose(b.sum(1), s):
                            err(f"{f}: tile block {blk} sum")
                    if not (1 <= n <= 100):
                        err(f"{f}: tile graph size {n}")
                    if len(np.unique(cf, axis=0)) != c_n:
                        err(f"{f}: duplicate tile config rows")
                else:
                    ids, cfg, sp = d["node_config_ids"], d["node_config_feat"], d["node_splits"]
                    if ids.dtype != np.int64 or ids.ndim != 1:
                        err(f"{f}: node_config_ids {ids.dtype}")
                    if len(ids) and (not (np.diff(ids) > 0).all() or ids.min() < 0 or ids.max() >= n):
                        err(f"{f}: node_config_ids not ascending / in range")
                    if not np.isin(d["node_opcode"][ids], [26, 34, 75]).all():
                        err(f"{f}: configurable node with wrong opcode")
                    if cfg.dtype != np.float32 or cfg.shape != (c_n, len(ids), 18):
                        err(f"{f}: node_config_feat {cfg.dtype} {cfg.shape}")
                    else:
                        if cfg.min() < -1 or cfg.max() > 5 or (cfg != np.round(cfg)).any():
                            err(f"{f}: node_config_feat values")
                        if (cfg[:, :, 14:] != -1).any():
                            err(f"{f}: columns 14-17 not -1")
                        if not (cfg == -1).all(axis=(1, 2)).any():
                            err(f"{f}: no all -1 (default) config")
                        for lo, w in ((0, 6), (6, 6), (12, 2)):
                            b = cfg[:, :, lo:lo + w].reshape(-1, w).astype(np.int64)
                            ub = np.unique(b, axis=0)
                            for row in ub:
                                vals = [x for x in row if x >= 0]
                                k = len(vals)
                                if list(row[:k]) != vals or (row[k:] != -1).any() or len(set(vals)) != k:
                                    err(f"{f}: bad layout block {row}")
                                    break
                        # block entries must be dims of the tensor (rank from node_feat shape columns)
                        rank = (d["node_feat"][ids][:, 21:27] > 0).sum(1)
                        outb = cfg[:, :, 0:6].max(axis=(0, 2))
                        if (outb >= np.maximum(rank, 1)).any():
                            err(f"{f}: output layout dim beyond rank")
                    if sp.dtype != np.int64 or sp.ndim != 2 or sp.shape[0] != 1 or sp[0, 0] != 0 or sp[0, -1] != n:
                        err(f"{f}: node_splits {sp}")
                # labels
                lf = os.path.join(lab, split, stem + ".npz")
                if not os.path.exists(lf):
                    err(f"missing label {lf}")
                    continue
                L = dict(np.load(lf))
                need = {"runtime", "noise_free"} | ({"normalizer"} if is_tile else set())
                if set(L) != need:
                    err(f"{lf}: keys {sorted(L)}")
                    continue
                if L["runtime"].dtype != np.int64 or L["runtime"].shape != (c_n,) or (L["runtime"] <= 0).any():
                    err(f"{lf}: runtime")
                if L["noise_free"].dtype != np.float64 or L["noise_free"].shape != (c_n,) or (L["noise_free"] <= 0).any():
                    err(f"{lf}: noise_free")
                if split != "test" and not (L["runtime"] == rt).all():
                    err(f"{lf}: runtime != config_runtime")
                if is_tile:
                    if L["normalizer"].dtype != np.int64 or (L["normalizer"] <= 0).any():
                        err(f"{lf}: normalizer")
                    if split != "test" and not (L["normalizer"] == d["config_runtime_normalizers"]).all():
                        err(f"{lf}: normalizer != file normalizers")
                # defaults.json: the compiler's default config of this graph
                di = dflts.get(c, {}).get(stem)
                if not isinstance(di, int) or isinstance(di, bool) or not (0 <= di < c_n):
                    err(f"defaults.json: {c} {stem} -> {di!r} (c={c_n})")
                elif is_tile:
                    # every batch re-times the default tile as its normaliser: the default's noise-free
                    # runtime must sit at the normalisers' level (drift and noise are a few percent)
                    r = float(np.median(L["normalizer"])) / L["noise_free"][di]
                    if not (0.85 < r < 1.15):
                        err(f"defaults.json: {c} {stem} default {di} does not match the normalisers ({r:.3f})")
                elif not (d["node_config_feat"][di] == -1).all():
                    err(f"defaults.json: {c} {stem} config {di} is not all -1")
                if stem not in progs.get(c, {}):
                    err(f"programs.json lacks {c} {stem}")
                elif progs[c][stem].get("kind") not in KINDS or not progs[c][stem].get("program"):
                    err(f"programs.json bad entry {c} {stem}")
                if split == "test":
                    test_ids.add(f"{c}:{stem}")
        summary.append((c, counts, (min(nnodes), max(nnodes)) if nnodes else None,
                        (min(ncfg), max(ncfg)) if ncfg else None))
    if not quick:
        for c in meta["collections"]:
            extra = set(dflts.get(c, {})) - seen_stems.get(c, set())
            if extra:
                err(f"defaults.json: {c} has {len(extra)} stems without a file")
        if set(dflts) != set(meta["collections"]):
            err(f"defaults.json collections {sorted(dflts)}")
    for src in ("xla", "nlp"):
        a, b = test_stems.get(f"layout:{src}:default"), test_stems.get(f"layout:{src}:random")
        if a is not None and b is not None and a != b:
            err(f"test stems differ between layout:{src}:default and random")
    sub = os.path.join(root, "sample_submission.csv")
    rows = list(csv.reader(open(sub)))
    if rows[0] != ["ID", "TopConfigs"]:
        err("submission header")
    ids = {r[0] for r in rows[1:]}
    if len(ids) != len(rows) - 1:
        err(f"submission has {len(rows) - 1 - len(ids)} duplicate IDs")
    if not quick and ids != test_ids:
        err(f"submission rows != test files ({len(ids)} vs {len(test_ids)})")
    for r in rows[1:]:
        idx = [int(x) for x in r[1].split(";")]
        if r[0].startswith("layout") and idx != list(range(len(idx))):
            err(f"submission {r[0]} not identity")
    for c, counts, nn, cc in summary:
        print(f"{c:22s} train {counts['train']:4d} valid {counts['valid']:3d} test {counts['test']:3d}"
              f"  nodes {nn}  configs {cc}  defaults {len(dflts.get(c, {}))}")


if __name__ == "__main__":
    root = sys.argv[1]
    main(root, quick="--quick" in sys.argv)
    print("OK" if not errors else f"{len(errors)} problem(s)")
    sys.exit(1 if errors else 0)
