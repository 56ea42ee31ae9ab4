"""Program catalog: architecture families with size ladders, names in the dataset's styles."""
import numpy as np

from . import models as M

# each entry: arch name -> (family, kind, source, spec(rng, level) -> spec dict, levels)
def _resnet50(rng, lv):
    stages = [[1], [1, 1], [1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 2, 2], [3, 3, 2, 1], [3, 4, 3, 2]][lv]
    return dict(batch=int(rng.choice([8, 16, 32, 64, 128])), res=int(rng.choice([128, 160, 224])),
                width=64, stages=stages, classes=1000, bottleneck=True, momentum=bool(rng.random() < 0.5))


def _resnet18(rng, lv):
    stages = [[1], [1, 1], [1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2, 1], [2, 2, 2, 2], [3, 3, 3, 2]][lv]
    return dict(batch=int(rng.choice([16, 32, 64, 128, 256])), res=int(rng.choice([64, 96, 128, 224])),
                width=int(rng.choice([32, 64])), stages=stages, classes=int(rng.choice([10, 100, 1000])),
                bottleneck=False, momentum=bool(rng.random() < 0.5))


def _vgg(rng, lv):
    stages = [[1], [1, 1], [1, 1, 1], [1, 1, 2], [1, 1, 2, 2], [2, 2, 2, 2], [2, 2, 3, 3, 3]][lv]
    return dict(batch=int(rng.choice([8, 16, 32, 64])), res=int(rng.choice([64, 112, 224])),
                width=int(rng.choice([32, 64])), stages=stages, fc_width=int(rng.choice([512, 1024, 4096])),
                classes=int(rng.choice([10, 100, 1000])), fc=int(rng.choice([1, 2])))


def _alexnet(rng, lv):
    mid = [[256], [384, 256], [384, 384, 256], [384, 384, 256, 256]][lv]
    return dict(batch=int(rng.choice([16, 32, 64, 128])), res=224, mid=mid,
                fc_width=int(rng.choice([1024, 2048, 4096])), classes=1000)


def _mobilenet_v2(rng, lv):
    allb = [(16, 1, 1), (24, 2, 6), (24, 1, 6), (32, 2, 6), (32, 1, 6), (64, 2, 6), (64, 1, 6), (96, 1, 6),
            (160, 2, 6), (160, 1, 6), (320, 1, 6)]
    n = [1, 2, 3, 4, 5, 6, 8, 11][lv]
    return dict(batch=int(rng.choice([8, 16, 32, 64, 128])), res=int(rng.choice([96, 128, 160, 224])),
                width=32, blocks=allb[:n], classes=1000, v2=True)


def _mobilenet_v1(rng, lv):
    allb = [(64, 1, 1), (128, 2, 1), (128, 1, 1), (256, 2, 1), (256, 1, 1), (512, 2, 1), (512, 1, 1),
            (512, 1, 1), (1024, 2, 1), (1024, 1, 1)]
    n = [1, 2, 3, 4, 6, 8, 10][lv]
    return dict(batch=int(rng.choice([16, 32, 64, 128])), res=int(rng.choice([128, 160, 224])),
                width=32, blocks=allb[:n], classes=1000, v2=False, head=1024)


def _efficientnet(rng, lv):
    allb = [(16, 1, 1, 3), (24, 2, 6, 3), (24, 1, 6, 3), (40, 2, 6, 5), (40, 1, 6, 5), (80, 2, 6, 3),
            (80, 1, 6, 3), (112, 1, 6, 5), (192, 2, 6, 5), (320, 1, 6, 3)]
    n = [1, 2, 3, 4, 5, 7, 10][lv]
    return dict(batch=int(rng.choice([8, 16, 32, 64])), res=int(rng.choice([128, 192, 224, 240])),
                width=32, blocks=allb[:n], classes=1000)


def _inception(rng, lv):
    mods = [[64], [64, 128], [64, 128, 128], [64, 128, 192, 256]][lv]
    return dict(batch=int(rng.choice([16, 32, 64])), res=int(rng.choice([96, 149, 224])),
                width=int(rng.choice([32, 64])), modules=mods, classes=1000)


def _unet2d(rng, lv):
    return dict(batch=int(rng.choice([2, 4, 8, 16])), res=int(rng.choice([128, 192, 256])), ndim=2,
                in_ch=int(rng.choice([1, 3])), width=int(rng.choice([16, 32, 64])), depth=[1, 2, 3, 4][lv],
                classes=int(rng.choice([2, 3, 5])), pool=bool(rng.random() < 0.7))


def _unet3d(rng, lv):
    return dict(batch=int(rng.choice([1, 2, 4])), res=int(rng.choice([32, 64, 96, 128])), ndim=3,
                in_ch=int(rng.choice([1, 4])), width=int(rng.choice([8, 16, 32])), depth=[1, 2, 3][lv],
                classes=int(rng.choice([2, 3, 4])), pool=bool(rng.random() < 0.6))


def _lstm(rng, lv):
    steps = [2, 3, 4, 6, 8, 10, 12, 16][lv]
    return dict(batch=int(rng.choice([16, 32, 64, 128, 256])), steps=steps, embed=int(rng.choice([128, 256, 512])),
                hidden=int(rng.choice([256, 512, 1024])), cell="lstm", vocab=int(rng.choice([10000, 32000])),
                classes=int(rng.choice([2, 10, 1000])), seq_out=bool(rng.random() < 0.4),
                layers=int(rng.choice([1, 1, 2])))


def _gru(rng, lv):
    d = _lstm(rng, lv)
    d["cell"] = "gru"
    return d


def _lstm_while(rng, lv):
    return dict(batch=int(rng.choice([8, 16, 32, 64])), steps=[8, 16, 32, 64, 128][lv],
                embed=int(rng.choice([128, 256, 512])), hidden=int(rng.choice([256, 512, 1024])), classes=10)


def _mlp(rng, lv):
    ws = [[512], [512, 256], [1024, 512, 256], [2048, 1024, 512, 256], [2048, 2048, 1024, 512, 256, 128],
          [4096] * 4 + [1024] * 4][lv]
    return dict(batch=int(rng.choice([64, 128, 256, 1024])), image=bool(rng.random() < 0.5), widths=ws,
                **{"in": int(rng.choice([64, 256, 784]))}, classes=int(rng.choice([10, 100])),
                act=str(rng.choice(["relu", "gelu", "tanh"])))


def _dlrm(rng, lv):
    return dict(batch=int(rng.choice([256, 512, 1024, 2048, 4096])), dim=int(rng.choice([16, 32, 64, 128])),
                tables=[2, 4, 6, 8, 12, 16, 26][lv], bag=int(rng.choice([1, 1, 4])),
                rows=int(rng.choice([10000, 100000, 1000000])), bottom=[512, 256], top=[512, 256])


def _bert(rng, lv, L=None, H=None, A=None):
    layers = [1, 2, 3, 4, 6, 8, 12][lv]
    H = H or int(rng.choice([128, 256, 512, 768, 1024]))
    A = A or max(2, H // 64)
    return dict(batch=int(rng.choice([8, 16, 32, 64])), seq=int(rng.choice([128, 256, 384, 512])), hidden=H,
                heads=A, layers=layers, ffn=4 * H, vocab=30522, classes=int(rng.choice([2, 3, 5])),
                flat=bool(rng.random() < 0.5))


def _gpt(rng, lv):
    layers = [1, 2, 3, 4, 6, 8, 12][lv]
    H = int(rng.choice([256, 512, 768, 1024]))
    return dict(batch=int(rng.choice([4, 8, 16, 32])), seq=int(rng.choice([128, 256, 512, 1024])), hidden=H,
                heads=H // 64, layers=layers, ffn=4 * H, vocab=int(rng.choice([8192, 32000, 50257])))


def _vit(rng, lv):
    layers = [1, 2, 3, 4, 6, 8, 12][lv]
    H = int(rng.choice([192, 384, 768]))
    return dict(batch=int(rng.choice([8, 16, 32, 64])), res=int(rng.choice([128, 224])), patch=16, hidden=H,
                heads=H // 64, layers=layers, ffn=4 * H, classes=1000)


ARCH = {
    # name: (family, kind, spec_fn, n_levels)
    "resnet50": ("resnet", "cnn", _resnet50, 9), "resnet18": ("resnet", "cnn", _resnet18, 8),
    "vgg16": ("vgg", "cnn", _vgg, 7), "alexnet": ("alexnet", "cnn", _alexnet, 4),
    "mobilenet_v2": ("mobilenet", "cnn", _mobilenet_v2, 8), "mobilenet_v1": ("mobilenet", "cnn", _mobilenet_v1, 7),
    "efficientnet_b0": ("efficientnet", "cnn", _efficientnet, 7), "inception_v3": ("inception", "cnn", _inception, 4),
    "unet2d": ("unet", "cnn", _unet2d, 4), "unet3d": ("unet", "cnn", _unet3d, 3),
    "lstm_lm": ("rnn", "rnn", _lstm, 8), "gru_seq2seq": ("rnn", "rnn", _gru, 8),
    "lstm_while": ("rnn_while", "rnn", _lstm_while, 5),
    "mlp": ("mlp", "mlp", _mlp, 6), "dlrm": ("dlrm", "mlp", _dlrm, 7),
    "bert": ("bert", "transformer", _bert, 7), "gpt": ("gpt", "transformer", _gpt, 7),
    "vit": ("vit", "transformer", _vit, 7),
}

XLA_ARCHS = ["resnet50", "resnet18", "vgg16", "alexnet", "mobilenet_v2", "mobilenet_v1", "efficientnet_b0",
             "inception_v3", "unet2d", "unet3d", "lstm_lm", "gru_seq2seq", "lstm_while", "mlp", "dlrm"]
TILE_ARCHS = XLA_ARCHS + ["bert", "gpt", "vit"]

BERT_NAMES = [  # (name template, L, H, A)
    ("bert_en_uncased_L-{L}_H-{H}_A-{A}", None, None, None),
    ("small_bert_bert_en_uncased_L-{L}_H-{H}_A-{A}", None, None, None),
    ("bert_en_cased_L-{L}_H-{H}_A-{A}", None, None, None),
    ("bert_multi_cased_L-{L}_H-{H}_A-{A}", None, None, None),
    ("albert_en_base", None, 768, 12), ("electra_small", None, 256, 4), ("electra_base", None, 768, 12),
    ("talking-heads_base", None, 768, 12), ("experts_pubmed", None, 768, 12), ("experts_wiki_books", None, 768, 12),
    ("mobilebert_en_uncased_L-{L}_H-{H}_B-{A}", None, 512, 4), ("lambert_en_uncased_L-{L}_H-{H}_A-{A}", None, 1024, 16),
]


def fit_program(arch, rng, seed, training, dt, nmin, nmax, cmin, cmax, spec_over=None):
    """Pick a size level whose program fits the node / configurable-node ranges."""
    fam, kind, fn, nlev = ARCH[arch]
    if fam == "rnn_while":
        training = False          # the while-loop LSTM is an inference program
    base = int(rng.integers(1 << 30))
    fits = []
    for lv in range(nlev):
        srng = np.random.default_rng(base)       # same shape choices across levels
        sp = fn(srng, lv)
        if spec_over:
            sp.update(spec_over)
        try:
            g = M.build(fam, sp, training, dt, seed)
        except AssertionError:
            continue
        n, nc = M.stats(g)
        if n > nmax * 1.0:
            break
        if nmin <= n <= nmax and cmin <= nc <= cmax:
            fits.append((lv, sp, g))
    if not fits:
        return None
    lv, sp, g = fits[int(rng.integers(len(fits)))]
    return dict(arch=arch, family=fam, kind=kind, spec=sp, graph=g, training=training, dtype=dt)


def xla_layout_name(rng, prog, used):
    arch, sp = prog["arch"], prog["spec"]
    prec = {"bf16": "bf16", "f32": "fp32"}[prog["dtype"]]
    mode = "train" if prog["training"] else "inference"
    for _ in range(100):
        style = rng.integers(3)
        if style == 0:
            topo = str(rng.choice(["2x2", "4x4", "2x4", "8x8", "4x8"]))
            nm = f"{arch}.{topo}.{prec if rng.random() < 0.5 else prec.replace('bf16', 'fp16')}"
        elif style == 1:
            nm = f"{arch}_batch_{sp.get('batch', 1)}_{mode}"
        else:
            nm = f"{arch}_{prec}_batch_{sp.get('batch', 1)}_{mode}_{int(rng.integers(1, 9))}"
        if not prog["training"] and style == 0:
            nm += ".inference"
        if nm not in used:
            used.add(nm)
            return nm
    raise RuntimeError("name")


def nlp_name(rng, tmpl, sp, training, used):
    L, H, A = sp["layers"], sp["hidden"], sp["heads"]
    base = tmpl.format(L=L, H=H, A=A)
    for k in range(100):
        nm = f"{base}_batch_size_{sp['batch']}_{'train' if training else 'test'}"
        if k:
            nm = f"{base}_seq_{sp['seq']}_batch_size_{sp['batch']}_{'train' if training else 'test'}" + ("" if k == 1 else f"_{k}")
        if nm not in used:
            used.add(nm)
            return nm
    raise RuntimeError("name")


def tile_stem(rng, arch, training, batch):
    v = int(rng.integers(-(1 << 63), (1 << 63) - 1, dtype=np.int64))
    hx = ("-" + format(-v, "x")) if v < 0 else format(v, "x")
    return f"{arch}_{'train' if training else 'inference'}_batch_{batch}_{hx}"


def hex32(rng):
    return "".join(format(int(x), "02x") for x in rng.integers(0, 256, size=16))
