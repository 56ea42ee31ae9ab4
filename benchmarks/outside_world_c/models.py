"""Tensor programs of real model classes, written as HLO-like instruction graphs.

Every builder writes the forward pass; training programs add the loss, the backward pass (via
autodiff.backprop) and an SGD/momentum update of every weight, with a root tuple."""
import numpy as np

from .hlo import Graph, win
from .autodiff import backprop


class Net:
    def __init__(self, g, dt, training, rng):
        self.g, self.dt, self.training, self.rng = g, dt, training, rng
        self.weights = []

    # ---------- parameters ----------
    def weight(self, shape):
        p = self.g.param(shape, "f32")
        self.weights.append(p)
        return self.g.convert(p, self.dt)

    def input(self, shape, dtype=None):
        return self.g.param(shape, dtype or self.dt)

    def sc(self, x):
        """Broadcast scalar constant shaped like x."""
        return self.g.scalar_bcast(self.g.shape(x), self.g.dtype(x))

    # ---------- conv-net layers ----------
    def conv(self, x, k, cout, stride=1, groups=1, bias=False):
        g = self.g
        s = g.shape(x)
        r = len(s)
        nsp = r - 2
        ks = [k] * nsp if np.isscalar(k) else list(k)
        cin = s[-1]
        w = self.weight(ks + [cin // groups, cout])
        lo, hi = [], []
        for i in range(nsp):
            n = s[1 + i]
            o = -(-n // stride)
            tot = max((o - 1) * stride + ks[i] - n, 0)
            lo.append(tot // 2); hi.append(tot - tot // 2)
        wd = win(ks, [stride] * nsp, lo, hi)
        sp = list(range(1, r - 1))
        dn = dict(ib=0, if_=r - 1, is_=sp, ki=r - 2, ko=r - 1, ks=list(range(nsp)), ob=0, of=r - 1, os=sp)
        y = g.conv(x, w, wd, dn, fgc=groups)
        if bias:
            y = self.bias(y)
        return y

    def bias(self, x):
        g = self.g
        s = g.shape(x)
        b = self.weight([s[-1]])
        return g.bin("add", x, g.broadcast(b, s, [len(s) - 1]))

    def bn(self, x):
        g = self.g
        s = g.shape(x)
        r = len(s)
        C = s[-1]
        gamma = g.broadcast(self.weight([C]), s, [r - 1])
        beta = g.broadcast(self.weight([C]), s, [r - 1])
        if not self.training:
            return g.bin("add", g.bin("multiply", x, gamma), beta)
        red = list(range(r - 1))
        mean = g.reduce(x, red)
        mean = g.bin("multiply", mean, self.sc(mean))
        xc = g.bin("subtract", x, g.broadcast(mean, s, [r - 1]))
        var = g.reduce(g.bin("multiply", xc, xc), red)
        var = g.bin("multiply", var, self.sc(var))
        inv = g.un("rsqrt", g.bin("add", var, self.sc(var)))
        y = g.bin("multiply", xc, g.broadcast(inv, s, [r - 1]))
        return g.bin("add", g.bin("multiply", y, gamma), beta)

    def relu(self, x):
        return self.g.bin("maximum", x, self.sc(x))

    def relu6(self, x):
        return self.g.bin("minimum", self.relu(x), self.sc(x))

    def swish(self, x):
        return self.g.bin("multiply", x, self.g.un("logistic", x))

    def gelu(self, x):
        g = self.g
        return g.bin("multiply", x, g.un("logistic", g.bin("multiply", x, self.sc(x))))

    def act(self, x, kind):
        return {"relu": self.relu, "relu6": self.relu6, "swish": self.swish, "gelu": self.gelu,
                "tanh": lambda t: self.g.un("tanh", t)}[kind](x)

    def maxpool(self, x, k=3, stride=2):
        g = self.g
        s = g.shape(x)
        r = len(s)
        sizes = [1] + [k] * (r - 2) + [1]
        strides = [1] + [stride] * (r - 2) + [1]
        lo, hi = [0] * r, [0] * r
        for i in range(1, r - 1):
            n = s[i]
            o = -(-n // stride)
            tot = max((o - 1) * stride + k - n, 0)
            lo[i], hi[i] = tot // 2, tot - tot // 2
        return g.reduce_window(x, win(sizes, strides, lo, hi), "max")

    def global_pool(self, x):
        g = self.g
        r = len(g.shape(x))
        y = g.reduce(x, list(range(1, r - 1)))
        return g.bin("multiply", y, self.sc(y))

    def upsample2(self, x):
        """Nearest-neighbour x2 upsampling, one spatial dim at a time: reshape to
        [before, n, after], broadcast to [before, n, 2, after], reshape back (as XLA lowers it)."""
        g = self.g
        r = len(g.shape(x))
        for i in range(1, r - 1):
            s = list(g.shape(x))
            before = int(np.prod(s[:i]))
            after = int(np.prod(s[i + 1:]))
            y = g.reshape(x, [before, s[i], after])
            y = g.broadcast(y, [before, s[i], 2, after], [0, 1, 3])
            s[i] *= 2
            x = g.reshape(y, s)
        return x

    # ---------- dense / sequence layers ----------
    def dense(self, x, n, bias=True):
        g = self.g
        s = g.shape(x)
        w = self.weight([s[-1], n])
        y = g.dot(x, w, lc=[len(s) - 1], rc=[0])
        return self.bias(y) if bias else y

    def layernorm(self, x):
        g = self.g
        s = g.shape(x)
        r = len(s)
        keep = list(range(r - 1))
        mean = g.reduce(x, [r - 1])
        mean = g.bin("multiply", mean, self.sc(mean))
        xc = g.bin("subtract", x, g.broadcast(mean, s, keep))
        var = g.reduce(g.bin("multiply", xc, xc), [r - 1])
        var = g.bin("multiply", var, self.sc(var))
        inv = g.un("rsqrt", g.bin("add", var, self.sc(var)))
        y = g.bin("multiply", xc, g.broadcast(inv, s, keep))
        y = g.bin("multiply", y, g.broadcast(self.weight([s[-1]]), s, [r - 1]))
        return g.bin("add", y, g.broadcast(self.weight([s[-1]]), s, [r - 1]))

    def softmax_last(self, x):
        g = self.g
        s = g.shape(x)
        r = len(s)
        keep = list(range(r - 1))
        m = g.reduce(x, [r - 1], "max")
        z = g.bin("subtract", x, g.broadcast(m, s, keep))
        e = g.un("exponential", z)
        den = g.reduce(e, [r - 1])
        return g.bin("divide", e, g.broadcast(den, s, keep))

    def attention(self, x, nh, mask=None, flat=False, B=None, S=None):
        """x: [B,S,H] (or [B*S,H] if flat)."""
        g = self.g
        if flat:
            H = g.shape(x)[-1]
        else:
            B, S, H = g.shape(x)
        dh = H // nh
        q, k, v = self.dense(x, H), self.dense(x, H), self.dense(x, H)
        q, k, v = (g.reshape(t, [B, S, nh, dh]) for t in (q, k, v))
        sc = g.dot(q, k, lc=[3], rc=[3], lb=[0, 2], rb=[0, 2])        # [B,nh,S,S]
        sc = g.bin("multiply", sc, self.sc(sc))
        if mask is not None:
            kind, m = mask
            if kind == "pad":      # m: [B,S] additive padding mask
                sc = g.bin("add", sc, g.broadcast(m, g.shape(sc), [0, 3]))
            else:                  # causal: m is a pred [S,S]
                sc = g.select(g.broadcast(m, g.shape(sc), [2, 3]), sc, self.sc(sc))
        p = self.softmax_last(sc)
        ctx = g.dot(p, v, lc=[3], rc=[1], lb=[0, 1], rb=[0, 2])        # [B,nh,S,dh]
        ctx = g.transpose(ctx, [0, 2, 1, 3])
        ctx = g.reshape(ctx, [B * S, H] if flat else [B, S, H])
        return self.dense(ctx, H)

    def transformer_block(self, x, nh, ffn, mask=None, flat=False, B=None, S=None, pre_ln=False):
        g = self.g
        if pre_ln:
            a = self.attention(self.layernorm(x), nh, mask, flat, B, S)
            x = g.bin("add", x, a)
            h = self.dense(self.gelu(self.dense(self.layernorm(x), ffn)), g.shape(x)[-1])
            return g.bin("add", x, h)
        a = self.attention(x, nh, mask, flat, B, S)
        x = self.layernorm(g.bin("add", x, a))
        h = self.dense(self.gelu(self.dense(x, ffn)), g.shape(x)[-1])
        return self.layernorm(g.bin("add", x, h))

    # ---------- losses ----------
    def xent(self, logits):
        g = self.g
        logits = g.convert(logits, "f32")
        s = g.shape(logits)
        labels = g.param(s, "f32")
        r = len(s)
        keep = list(range(r - 1))
        m = g.reduce(logits, [r - 1], "max")
        z = g.bin("subtract", logits, g.broadcast(m, s, keep))
        lse = g.un("log", g.reduce(g.un("exponential", z), [r - 1]))
        logp = g.bin("subtract", z, g.broadcast(lse, s, keep))
        l = g.reduce(g.bin("multiply", labels, logp), list(range(r)))
        return g.un("negate", g.bin("multiply", l, g.const("f32")))

    def mse(self, y):
        g = self.g
        y = g.convert(y, "f32")
        t = g.param(g.shape(y), "f32")
        d = g.bin("subtract", y, t)
        l = g.reduce(g.bin("multiply", d, d), list(range(len(g.shape(y)))))
        return g.bin("multiply", l, g.const("f32"))


def finish(net, out, loss_kind, momentum):
    """Close a program: inference -> root is the output; training -> loss, grads, updates, tuple."""
    g = net.g
    if not net.training:
        if loss_kind == "xent":
            out = net.softmax_last(g.convert(out, "f32")) if len(g.shape(out)) == 2 else out
        g.set_root(out, "entry")
        return
    loss = net.xent(out) if loss_kind == "xent" else net.mse(out)
    grads = backprop(g, loss, net.weights)
    outs = [loss]
    for w in net.weights:
        if w not in grads:
            continue
        dw = grads[w]
        lr = g.scalar_bcast(g.shape(w), "f32")
        if momentum:
            mom = g.param(g.shape(w), "f32")
            mnew = g.bin("add", g.bin("multiply", mom, g.scalar_bcast(g.shape(w), "f32")), dw)
            outs.append(mnew)
            dw = mnew
        outs.append(g.bin("subtract", w, g.bin("multiply", dw, lr)))
    g.set_root(g.tuple(outs), "entry")


# =====================================================================================
# model families.  Each takes (net, spec) and returns (output, loss_kind)
# =====================================================================================

def _stem(net, x, c, k=7):
    x = net.relu(net.bn(net.conv(x, k, c, stride=2)))
    return net.maxpool(x)


def resnet(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    w0 = sp["width"]
    x = _stem(net, x, w0)
    c = w0
    bottleneck = sp.get("bottleneck", True)
    stages = sp["stages"]
    for si, nb in enumerate(stages):
        for bi in range(nb):
            stride = 2 if (bi == 0 and si > 0) else 1
            cout = w0 * (2 ** si) * (4 if bottleneck else 1)
            sc = x
            if bottleneck:
                mid = w0 * (2 ** si)
                y = net.relu(net.bn(net.conv(x, 1, mid)))
                y = net.relu(net.bn(net.conv(y, 3, mid, stride=stride)))
                y = net.bn(net.conv(y, 1, cout))
            else:
                y = net.relu(net.bn(net.conv(x, 3, cout, stride=stride)))
                y = net.bn(net.conv(y, 3, cout))
            if stride != 1 or c != cout:
                sc = net.bn(net.conv(x, 1, cout, stride=stride))
            x = net.relu(g.bin("add", y, sc))
            c = cout
    x = net.global_pool(x)
    return net.dense(x, sp["classes"]), "xent"


def vgg(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    c = sp["width"]
    for si, nc in enumerate(sp["stages"]):
        for _ in range(nc):
            x = net.relu(net.conv(x, 3, c, bias=True))
        x = net.maxpool(x, 2, 2)
        c = min(c * 2, 512)
    s = g.shape(x)
    x = g.reshape(x, [s[0], s[1] * s[2] * s[3]])
    for _ in range(sp.get("fc", 2)):
        x = net.relu(net.dense(x, sp["fc_width"]))
    return net.dense(x, sp["classes"]), "xent"


def alexnet(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    x = net.maxpool(net.relu(net.conv(x, 11, 64, stride=4, bias=True)))
    x = net.maxpool(net.relu(net.conv(x, 5, 192, bias=True)))
    for c in sp["mid"]:
        x = net.relu(net.conv(x, 3, c, bias=True))
    x = net.maxpool(x)
    s = g.shape(x)
    x = g.reshape(x, [s[0], s[1] * s[2] * s[3]])
    x = net.relu(net.dense(x, sp["fc_width"]))
    return net.dense(x, sp["classes"]), "xent"


def mobilenet(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    c = sp["width"]
    x = net.relu6(net.bn(net.conv(x, 3, c, stride=2)))
    v2 = sp.get("v2", True)
    for i, (cout, stride, expand) in enumerate(sp["blocks"]):
        inp = x
        if v2:
            h = c * expand
            y = net.relu6(net.bn(net.conv(x, 1, h))) if expand > 1 else x
            y = net.relu6(net.bn(net.conv(y, 3, h if expand > 1 else c, stride=stride, groups=h if expand > 1 else c)))
            y = net.bn(net.conv(y, 1, cout))
            if stride == 1 and cout == c:
                y = g.bin("add", y, inp)
        else:
            y = net.relu(net.bn(net.conv(x, 3, c, stride=stride, groups=c)))
            y = net.relu(net.bn(net.conv(y, 1, cout)))
        x, c = y, cout
    x = net.relu6(net.bn(net.conv(x, 1, sp.get("head", 4 * c))))
    x = net.global_pool(x)
    return net.dense(x, sp["classes"]), "xent"


def efficientnet(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    c = sp["width"]
    x = net.swish(net.bn(net.conv(x, 3, c, stride=2)))
    for cout, stride, expand, k in sp["blocks"]:
        inp = x
        h = c * expand
        y = net.swish(net.bn(net.conv(x, 1, h))) if expand > 1 else x
        y = net.swish(net.bn(net.conv(y, k, h, stride=stride, groups=h)))
        # squeeze-and-excitation
        s = g.shape(y)
        z = net.global_pool(y)
        z = net.swish(net.dense(z, max(4, c // 4)))
        z = g.un("logistic", net.dense(z, h))
        y = g.bin("multiply", y, g.broadcast(z, s, [0, 3]))
        y = net.bn(net.conv(y, 1, cout))
        if stride == 1 and cout == c:
            y = g.bin("add", y, inp)
        x, c = y, cout
    x = net.swish(net.bn(net.conv(x, 1, 4 * c)))
    x = net.global_pool(x)
    return net.dense(x, sp["classes"]), "xent"


def inception(net, sp):
    g = net.g
    B, R = sp["batch"], sp["res"]
    x = net.input([B, R, R, 3])
    x = _stem(net, x, sp["width"], k=3)
    for c in sp["modules"]:
        b1 = net.relu(net.bn(net.conv(x, 1, c)))
        b2 = net.relu(net.bn(net.conv(net.relu(net.bn(net.conv(x, 1, c // 2))), 3, c)))
        b3 = net.relu(net.bn(net.conv(net.relu(net.bn(net.conv(x, 1, c // 4))), 5, c // 2)))
        b4 = net.relu(net.bn(net.conv(net.maxpool(x, 3, 1), 1, c // 2)))
        x = g.concat([b1, b2, b3, b4], 3)
        if g.shape(x)[1] > 8:
            x = net.maxpool(x)
    x = net.global_pool(x)
    return net.dense(x, sp["classes"]), "xent"


def unet(net, sp):
    g = net.g
    B, R, nd = sp["batch"], sp["res"], sp["ndim"]
    x = net.input([B] + [R] * nd + [sp["in_ch"]])
    c = sp["width"]
    skips = []
    for d in range(sp["depth"]):
        x = net.relu(net.bn(net.conv(x, 3, c)))
        x = net.relu(net.bn(net.conv(x, 3, c)))
        skips.append(x)
        x = net.maxpool(x, 2, 2) if sp.get("pool", True) else net.conv(x, 2, c, stride=2)
        c *= 2
    x = net.relu(net.bn(net.conv(x, 3, c)))
    for d in reversed(range(sp["depth"])):
        c //= 2
        x = net.upsample2(x)
        x = net.relu(net.bn(net.conv(x, 1 if nd == 3 else 2, c)))
        x = g.concat([skips[d], x], nd + 1)
        x = net.relu(net.bn(net.conv(x, 3, c)))
    out = net.conv(x, 1, sp["classes"], bias=True)
    return out, "mse"


def bert(net, sp):
    g = net.g
    B, S, H, nh, L = sp["batch"], sp["seq"], sp["hidden"], sp["heads"], sp["layers"]
    flat = sp.get("flat", False)
    ids = net.input([B, S], "s32")
    table = net.weight([sp["vocab"], H])
    x = g.gather_rows(table, ids)                                   # [B,S,H]
    pos = net.weight([S, H])
    x = g.bin("add", x, g.broadcast(pos, [B, S, H], [1, 2]))
    x = net.layernorm(x)
    maskp = net.input([B, S])
    if flat:
        x = g.reshape(x, [B * S, H])
    for _ in range(L):
        x = net.transformer_block(x, nh, sp["ffn"], ("pad", maskp), flat, B, S)
    if flat:
        x = g.reshape(x, [B, S, H])
    cls = g.reshape(g.slice(x, [0, 0, 0], [B, 1, H]), [B, H])
    pooled = g.un("tanh", net.dense(cls, H))
    return net.dense(pooled, sp["classes"]), "xent"


def gpt(net, sp):
    g = net.g
    B, S, H, nh, L = sp["batch"], sp["seq"], sp["hidden"], sp["heads"], sp["layers"]
    ids = net.input([B, S], "s32")
    table = net.weight([sp["vocab"], H])
    x = g.gather_rows(table, ids)
    pos = net.weight([S, H])
    x = g.bin("add", x, g.broadcast(pos, [B, S, H], [1, 2]))
    causal = g.compare(g.iota([S, S], 0), g.iota([S, S], 1), "GE")
    for _ in range(L):
        x = net.transformer_block(x, nh, sp["ffn"], ("causal", causal), pre_ln=True)
    x = net.layernorm(x)
    logits = g.dot(x, table, lc=[2], rc=[1])                       # tied embedding [B,S,V]
    return logits, "xent"


def vit(net, sp):
    g = net.g
    B, R, P, H, nh, L = sp["batch"], sp["res"], sp["patch"], sp["hidden"], sp["heads"], sp["layers"]
    x = net.input([B, R, R, 3])
    x = net.conv(x, P, H, stride=P, bias=True)
    n = (R // P) ** 2
    x = g.reshape(x, [B, n, H])
    cls = net.weight([1, 1, H])
    x = g.concat([g.reshape(g.broadcast(g.reshape(cls, [H]), [B, H], [1]), [B, 1, H]), x], 1)
    pos = net.weight([n + 1, H])
    x = g.bin("add", x, g.broadcast(pos, [B, n + 1, H], [1, 2]))
    for _ in range(L):
        x = net.transformer_block(x, nh, sp["ffn"], None, pre_ln=True)
    x = net.layernorm(x)
    c = g.reshape(g.slice(x, [0, 0, 0], [B, 1, H]), [B, H])
    return net.dense(c, sp["classes"]), "xent"


def rnn(net, sp):
    """Unrolled LSTM / GRU language or sequence model."""
    g = net.g
    B, T, E, Hd = sp["batch"], sp["steps"], sp["embed"], sp["hidden"]
    cell = sp["cell"]
    ids = net.input([B, T], "s32")
    table = net.weight([sp["vocab"], E])
    xs = g.transpose(g.gather_rows(table, ids), [1, 0, 2])          # [T,B,E]
    ng = 4 if cell == "lstm" else 3
    layers = sp.get("layers", 1)
    outs = None
    for layer in range(layers):
        Wx = net.weight([E if layer == 0 else Hd, ng * Hd])
        Wh = net.weight([Hd, ng * Hd])
        bias = net.weight([ng * Hd])
        h = g.scalar_bcast([B, Hd], net.dt)
        c = g.scalar_bcast([B, Hd], net.dt)
        hs = []
        for t in range(T):
            if layer == 0:
                xt = g.reshape(g.slice(xs, [t, 0, 0], [t + 1, B, E]), [B, E])
            else:
                xt = outs[t]
            gx = g.dot(xt, Wx, lc=[1], rc=[0])
            gh = g.dot(h, Wh, lc=[1], rc=[0])
            z = g.bin("add", g.bin("add", gx, gh), g.broadcast(bias, [B, ng * Hd], [1]))
            parts = [g.slice(z, [0, i * Hd], [B, (i + 1) * Hd]) for i in range(ng)]
            if cell == "lstm":
                i_, f_, o_ = (g.un("logistic", parts[j]) for j in (0, 1, 3))
                gg = g.un("tanh", parts[2])
                c = g.bin("add", g.bin("multiply", f_, c), g.bin("multiply", i_, gg))
                h = g.bin("multiply", o_, g.un("tanh", c))
            else:
                r_ = g.un("logistic", parts[0]); u_ = g.un("logistic", parts[1])
                n_ = g.un("tanh", g.bin("add", parts[2], g.bin("multiply", r_, h)))
                h = g.bin("add", g.bin("multiply", u_, h),
                          g.bin("multiply", g.bin("subtract", net.sc(u_), u_), n_))
            hs.append(h)
        outs = hs
    if sp.get("seq_out", False):
        y = g.concat([g.reshape(t, [B, 1, Hd]) for t in outs], 1)       # [B,T,Hd]
        return net.dense(y, sp["classes"]), "xent"
    return net.dense(outs[-1], sp["classes"]), "xent"


def rnn_while(net, sp):
    """LSTM over a while loop (inference): body computation with dynamic-slice / update-slice."""
    g = net.g
    B, T, E, Hd = sp["batch"], sp["steps"], sp["embed"], sp["hidden"]
    dt = net.dt
    xs = net.input([T, B, E])
    Wx = net.weight([E, 4 * Hd]); Wh = net.weight([Hd, 4 * Hd]); bias = net.weight([4 * Hd])
    h0 = g.scalar_bcast([B, Hd], dt); c0 = g.scalar_bcast([B, Hd], dt)
    acc0 = g.scalar_bcast([T, B, Hd], dt)
    t0 = g.const("s32")
    shapes = [((), "s32"), ((B, Hd), dt), ((B, Hd), dt), ((T, B, E), dt), ((E, 4 * Hd), dt),
              ((Hd, 4 * Hd), dt), ((4 * Hd,), dt), ((T, B, Hd), dt)]
    init = g.tuple([t0, h0, c0, xs, Wx, Wh, bias, acc0])
    # body
    g.begin_comp("body", T)
    p = g.param((), "tuple")
    el = [g.gte(p, i, s, d) for i, (s, d) in enumerate(shapes)]
    t, h, c, X, wx, wh, bb, acc = el
    z0 = g.const("s32")
    xt = g.reshape(g.dynamic_slice(X, [t, z0, z0], [1, B, E]), [B, E])
    z = g.bin("add", g.bin("add", g.dot(xt, wx, lc=[1], rc=[0]), g.dot(h, wh, lc=[1], rc=[0])),
              g.broadcast(bb, [B, 4 * Hd], [1]))
    parts = [g.slice(z, [0, i * Hd], [B, (i + 1) * Hd]) for i in range(4)]
    i_, f_, o_ = (g.un("logistic", parts[j]) for j in (0, 1, 3))
    c2 = g.bin("add", g.bin("multiply", f_, c), g.bin("multiply", i_, g.un("tanh", parts[2])))
    h2 = g.bin("multiply", o_, g.un("tanh", c2))
    acc2 = g.dynamic_update_slice(acc, g.reshape(h2, [1, B, Hd]), [t, z0, z0])
    t2 = g.bin("add", t, g.const("s32"))
    broot = g.tuple([t2, h2, c2, X, wx, wh, bb, acc2])
    g.set_root(broot, "body")
    g.end_comp()
    g.begin_comp("cond", T)
    pc = g.param((), "tuple")
    tc = g.gte(pc, 0, (), "s32")
    croot = g.compare(tc, g.const("s32"), "LT")
    g.set_root(croot, "cond")
    g.end_comp()
    w = g.while_loop(init, broot, croot, T, shapes)
    hs = g.gte(w, 7, (T, B, Hd), dt)
    y = g.transpose(hs, [1, 0, 2])
    return net.dense(y, sp["classes"]), "xent"


def mlp(net, sp):
    g = net.g
    B = sp["batch"]
    if sp.get("image"):
        x = net.input([B, 28, 28, 1])
        x = g.reshape(x, [B, 784])
    else:
        x = net.input([B, sp["in"]])
    for wdt in sp["widths"]:
        x = net.act(net.dense(x, wdt), sp.get("act", "relu"))
    return net.dense(x, sp["classes"]), "xent"


def dlrm(net, sp):
    g = net.g
    B, d, nt = sp["batch"], sp["dim"], sp["tables"]
    dense_in = net.input([B, 13])
    x = dense_in
    for wdt in sp["bottom"]:
        x = net.relu(net.dense(x, wdt))
    x = net.relu(net.dense(x, d))
    feats = [g.reshape(x, [B, 1, d])]
    for t in range(nt):
        idx = net.input([B, sp["bag"]], "s32")
        tab = net.weight([sp["rows"], d])
        e = g.gather_rows(tab, idx)                                     # [B,bag,d]
        e = g.reduce(e, [1]) if sp["bag"] > 1 else g.reshape(e, [B, d])
        feats.append(g.reshape(e, [B, 1, d]))
    Z = g.concat(feats, 1)                                              # [B,F,d]
    F = nt + 1
    inter = g.dot(Z, Z, lc=[2], rc=[2], lb=[0], rb=[0])                 # [B,F,F]
    inter = g.reshape(inter, [B, F * F])
    y = g.concat([x, inter], 1)
    for wdt in sp["top"]:
        y = net.relu(net.dense(y, wdt))
    return net.dense(y, 2), "xent"


FAMILIES = {
    "resnet": ("cnn", resnet), "vgg": ("cnn", vgg), "alexnet": ("cnn", alexnet), "mobilenet": ("cnn", mobilenet),
    "efficientnet": ("cnn", efficientnet), "inception": ("cnn", inception), "unet": ("cnn", unet),
    "bert": ("transformer", bert), "gpt": ("transformer", gpt), "vit": ("transformer", vit),
    "rnn": ("rnn", rnn), "rnn_while": ("rnn", rnn_while), "mlp": ("mlp", mlp), "dlrm": ("mlp", dlrm),
}


def build(family, sp, training, dt, seed):
    rng = np.random.default_rng(seed)
    g = Graph()
    net = Net(g, dt, training, rng)
    fn = FAMILIES[family][1]
    out, loss_kind = fn(net, sp)
    finish(net, out, loss_kind, momentum=sp.get("momentum", False))
    return g


def stats(g):
    n = len(g.ins)
    nc = sum(1 for i in g.ins if i.op in ("convolution", "dot", "reshape"))
    return n, nc
