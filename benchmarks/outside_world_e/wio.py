"""Deterministic npz I/O and world walking shared by the generator and selfcheck."""
import io
import os
import zipfile
import zlib

import numpy as np

SPLITS = ("train", "valid", "test")
LAYOUT_COLS = ("layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random")
ALL_COLS = ("tile:xla",) + LAYOUT_COLS


def col_dir(col):
    """'layout:xla:random' -> 'layout/xla/random'; 'tile:xla' -> 'tile/xla'."""
    return col.replace(":", "/")


def iter_files(root):
    """Yield (collection, split, stem, relative sub-path) for every graph file of a world."""
    base = os.path.join(root, "npz_all", "npz")
    for col in ALL_COLS:
        for split in SPLITS:
            d = os.path.join(base, col_dir(col), split)
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if name.endswith(".npz"):
                    yield col, split, name[:-4], os.path.join(col_dir(col), split, name)


def load(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def save(path, arrays):
    """Write an npz with fixed zip metadata so the same arrays give the same bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in arrays.items():
            b = io.BytesIO()
            np.lib.format.write_array(b, np.asarray(v), allow_pickle=False)
            zi = zipfile.ZipInfo(k + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o600 << 16
            zf.writestr(zi, b.getvalue())
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def file_rng(seed, key):
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode())])
