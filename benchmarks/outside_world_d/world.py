"""World layout, validation and byte-deterministic npz writing."""
import io
import json
import os
import zipfile

import numpy as np

COLLECTION_DIRS = [("tile:xla", os.path.join("tile", "xla"))] + [
    ("layout:%s:%s" % (s, t), os.path.join("layout", s, t))
    for s in ("xla", "nlp") for t in ("default", "random")]
SPLITS = ("train", "valid", "test")
TILE_KEYS = {"node_feat": (np.float32, 2), "node_opcode": (np.uint8, 1),
             "edge_index": (np.int64, 2), "config_feat": (np.float32, 2),
             "config_runtime": (np.int64, 1), "config_runtime_normalizers": (np.int64, 1)}
LAYOUT_KEYS = {"node_feat": (np.float32, 2), "node_opcode": (np.uint8, 1),
               "edge_index": (np.int64, 2), "node_config_ids": (np.int64, 1),
               "node_config_feat": (np.float32, 3), "config_runtime": (np.int64, 1),
               "node_splits": (np.int64, 2)}


class WorldError(Exception):
    def __init__(self, path, problem):
        Exception.__init__(self, "%s: %s" % (path, problem))
        self.path, self.problem = path, problem


def npz_path(root, cdir, split, stem=None):
    p = os.path.join(root, "npz_all", "npz", cdir, split)
    return p if stem is None else os.path.join(p, stem + ".npz")


def label_path(root, cdir, split, stem=None):
    p = os.path.join(root, "labels", "npz", cdir, split)
    return p if stem is None else os.path.join(p, stem + ".npz")


def list_world(root):
    """[(collection, cdir, split, stem)] in a fixed order; raises WorldError."""
    if not os.path.isdir(root):
        raise WorldError(root, "not a directory")
    for f in ("labels/labels.json", "labels/programs.json", "labels/defaults.json",
              "sample_submission.csv"):
        if not os.path.isfile(os.path.join(root, f)):
            raise WorldError(os.path.join(root, f), "missing")
    for f in ("labels/labels.json", "labels/programs.json", "labels/defaults.json"):
        try:
            with open(os.path.join(root, f)) as fh:
                json.load(fh)
        except ValueError as ex:
            raise WorldError(os.path.join(root, f), "not valid JSON (%s)" % ex)
    items = []
    for coll, cdir in COLLECTION_DIRS:
        for split in SPLITS:
            d = npz_path(root, cdir, split)
            if not os.path.isdir(d):
                raise WorldError(d, "missing directory")
            stems = sorted(f[:-4] for f in os.listdir(d) if f.endswith(".npz"))
            for stem in stems:
                lp = label_path(root, cdir, split, stem)
                if not os.path.isfile(lp):
                    raise WorldError(lp, "missing label file for %s" % npz_path(root, cdir, split, stem))
                items.append((coll, cdir, split, stem))
    if not items:
        raise WorldError(root, "no npz files")
    return items


def load_npz(path, tile):
    """Dict of arrays (ordered as in the file), checked against the format."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrs = [(k, z[k]) for k in z.files]
    except Exception as ex:  # noqa: BLE001 - report any unreadable file
        raise WorldError(path, "cannot read npz (%s)" % ex)
    d = dict(arrs)
    spec = TILE_KEYS if tile else LAYOUT_KEYS
    for k, (dt, nd) in spec.items():
        if k not in d:
            raise WorldError(path, "missing array %r" % k)
        if d[k].ndim != nd:
            raise WorldError(path, "array %r has %d dims, expected %d" % (k, d[k].ndim, nd))
    n = d["node_feat"].shape[0]
    if d["node_feat"].shape[1] != 140:
        raise WorldError(path, "node_feat must have 140 columns")
    if d["node_opcode"].shape[0] != n:
        raise WorldError(path, "node_opcode length differs from node_feat rows")
    if d["edge_index"].size and (d["edge_index"].shape[1] != 2 or d["edge_index"].min() < 0
                                 or d["edge_index"].max() >= n):
        raise WorldError(path, "edge_index must be (e,2) with node ids in range")
    c = d["config_runtime"].shape[0]
    if tile:
        if d["config_feat"].shape != (c, 24):
            raise WorldError(path, "config_feat must be (c,24) with c = len(config_runtime)")
        if d["config_runtime_normalizers"].shape[0] != c:
            raise WorldError(path, "config_runtime_normalizers length differs")
    else:
        nc = d["node_config_ids"].shape[0]
        if d["node_config_feat"].shape != (c, nc, 18):
            raise WorldError(path, "node_config_feat must be (c,nc,18)")
        if nc and (d["node_config_ids"].min() < 0 or d["node_config_ids"].max() >= n):
            raise WorldError(path, "node_config_ids out of range")
    if c == 0:
        raise WorldError(path, "no configs")
    return arrs


def save_npz(path, arrs):
    """np.savez_compressed-compatible file with fixed zip metadata, so the
    same arrays always give the same bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for k, a in arrs:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(a), allow_pickle=False)
            zi = zipfile.ZipInfo(k + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, buf.getvalue())
    os.replace(tmp, path)
