"""Machine constants and tensor helpers of the outside author's TPU model.

All numbers are rounded public figures for a TPU v4-class chip (treated as
one device): bf16 MXU peak ~275 TFLOP/s (four 128x128 systolic arrays per
TensorCore, two cores), HBM ~1.2 TB/s, 16 MiB of VMEM per core, vregs of
8 sublanes x 128 lanes.  Time unit everywhere: nanoseconds.
"""
import math

HBM_B_PER_NS = 1200.0          # 1.2 TB/s
MXU_FLOP_PER_NS = 275000.0     # 275 TFLOP/s bf16
MXU_F32_SLOWDOWN = 2.0         # f32 operands need extra passes / conversion
VPU_OPS_PER_NS = 8000.0        # elementwise 32-bit lane-ops per ns
XLU_B_PER_NS = 1500.0          # in-core transpose (cross-lane unit) bytes/ns
VMEM_BYTES = 16 * 1024 * 1024
KERNEL_LAUNCH_NS = 1200.0      # a standalone (unfused) kernel
FUSED_OP_NS = 30.0             # an elementwise op that lives in a fusion
COPY_NS = 250.0                # a layout copy / relayout (usually fused)
LANES = 128

# node_feat columns 2-20 one-hot element type -> bytes per element
_DT_BYTES = [4, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8, 16, 0, 0, 0]


def dtype_bytes(onehot_row):
    """Bytes per element from the 19 one-hot columns (invalid -> 4)."""
    s = onehot_row.sum()
    if s <= 0:
        return 4
    return _DT_BYTES[int(onehot_row.argmax())]


def sublanes(e):
    """Second-minor tile of the TPU layout: (8,128) 32-bit, (16,128) 16-bit,
    (32,128) 8-bit."""
    if e <= 1:
        return 32
    if e == 2:
        return 16
    return 8


def ceil_to(x, m):
    return int(math.ceil(x / m) * m) if x > 0 else 0


def dims_of(row):
    """Shape dims (cols 21-26) -> tuple; rank = position of the last non-zero."""
    d = [int(v) for v in row[21:27]]
    r = 0
    for i, v in enumerate(d):
        if v != 0:
            r = i + 1
    return tuple(d[:r])


def natural_layout(row, rank):
    """The node's own minor_to_major (cols 134-139) if it is a permutation,
    else the row-major default (r-1, ..., 0)."""
    cand = [int(v) for v in row[134:134 + rank]]
    if sorted(cand) == list(range(rank)):
        return tuple(cand)
    return tuple(range(rank - 1, -1, -1))


def phys_order(dims, m2m):
    """Dims major->minor under the layout, size-1 dims dropped (degenerate)."""
    return tuple(i for i in reversed(m2m) if dims[i] != 1)


_pad_cache = {}


def padded_elems(dims, m2m, e):
    """Elements the tensor occupies in HBM under the tiled layout: minor-most
    physical dim padded to 128 lanes, second-minor to the sublane tile."""
    key = (dims, m2m, e)
    v = _pad_cache.get(key)
    if v is not None:
        return v
    if len(dims) == 0:
        v = 1.0
    else:
        ph = phys_order(dims, m2m)
        if not ph:
            v = float(LANES)
        else:
            sizes = [dims[i] for i in ph]
            sizes[-1] = ceil_to(sizes[-1], LANES)
            if len(sizes) >= 2:
                sizes[-2] = ceil_to(sizes[-2], sublanes(e))
            v = float(math.prod(sizes))
    _pad_cache[key] = v
    return v


def true_elems(dims):
    return float(math.prod(dims)) if dims else 1.0


def minor_dim(dims, m2m):
    ph = phys_order(dims, m2m)
    return ph[-1] if ph else None


def soft_max(a, b, p=4.0):
    """Roofline with a soft corner: compute and memory overlap imperfectly."""
    if a <= 0:
        return b
    if b <= 0:
        return a
    return (a ** p + b ** p) ** (1.0 / p)
