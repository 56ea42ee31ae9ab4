"""The model code that the lowered worlds lower: public model definitions plus a few written here.

Each architecture is a function ``(spec) -> Lowerable``: the function jax lowers (a forward pass, or a
training step: ``jax.value_and_grad`` of a softmax cross-entropy loss and an SGD update of every
parameter) and its example arguments as ``jax.ShapeDtypeStruct`` trees (parameters are never
initialised: ``jax.eval_shape`` gives their shapes, which is all lowering needs).

Where they come from:

* transformers' Flax models (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT, GPT-2, GPT-Neo, Llama, BART,
  ViT, ResNet, RegNet), built from a config (no weights are downloaded);
* dm-haiku's nets (ResNet, MobileNet v1);
* flax.linen's LSTM cell under ``nn.RNN`` (a ``lax.scan``), equinox's GRU cell under ``lax.scan``;
* written here where no installable package has the architecture, with flax.linen layers over
  ``lax.conv_general_dilated`` so that NHWC and NCHW (and their 3-D forms) are both real: VGG,
  MobileNet v2 and an EfficientNet-like net (depthwise convolutions), U-Net 2-D and 3-D (5-D
  convolutions, transposed convolutions, skip concatenations), MLP-Mixer and a DLRM-like net
  (embedding tables, a bottom and a top MLP, pairwise dot interactions).

The packages are the optional ``lowered`` extra; they are imported only here and only when a program
is lowered (worlds read the cache, :mod:`pipelines.synth.lowered.cache`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.core.errors import ConfigError

EXTRA = "lowered"
PACKAGES = ("jax", "flax", "haiku", "equinox", "transformers")  # import names whose versions key the cache
LEARNING_RATE = 0.01


def require(module: str) -> Any:
    """Import an optional package of the ``lowered`` extra, or a ConfigError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"lowering model code needs {module.split('.')[0]} ({exc}); install the optional extra: "
                          f"pip install '.[{EXTRA}]'") from None


@dataclass(frozen=True)
class Lowerable:
    """A function and example arguments (``ShapeDtypeStruct`` trees) to lower with ``jax.jit``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Build:
    """What every architecture hands the common forward / training-step wrapper."""

    apply: Callable[..., Any]  # (params, *inputs) -> output array (the logits the loss reads)
    params: Any  # ShapeDtypeStruct tree of the trainable parameters
    inputs: tuple[Any, ...]  # ShapeDtypeStruct of each input


# ----------------------------------------------------------------------------- common wrappers


def lowerable(build: Build, train: bool) -> Lowerable:
    """The forward pass, or one training step (loss, gradients, SGD update) of ``build``."""
    jax, jnp = require("jax"), require("jax.numpy")
    if not train:
        return Lowerable(build.apply, (build.params, *build.inputs))
    out = jax.eval_shape(build.apply, build.params, *build.inputs)
    target = jax.ShapeDtypeStruct(out.shape, jnp.float32)

    def train_step(params, *args):
        *inputs, labels = args

        def loss_fn(p):
            logits = build.apply(p, *inputs).astype(jnp.float32)
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits, axis=-1) * labels, axis=-1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, jax.tree.map(lambda p, g: (p - LEARNING_RATE * g).astype(p.dtype), params, grads)

    return Lowerable(train_step, (build.params, *build.inputs, target))


def _dtype(name: str) -> Any:
    jnp = require("jax.numpy")
    return {"f32": jnp.float32, "bf16": jnp.bfloat16}[name]


def _cast_floats(tree: Any, dtype: Any) -> Any:
    """A ShapeDtypeStruct tree with its floating leaves in ``dtype`` (integers stay)."""
    jax, jnp = require("jax"), require("jax.numpy")
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype) if jnp.issubdtype(s.dtype, jnp.floating)
                        else s, tree)


def _struct(shape: tuple[int, ...], dtype: Any) -> Any:
    return require("jax").ShapeDtypeStruct(tuple(shape), dtype)


def _flax_build(module: Any, inputs: tuple[Any, ...], dtype: Any, *, batch_stats: bool = False,
                train: bool = False) -> Build:
    """A flax.linen module: its variables' shapes, cast to ``dtype``; batch statistics (when it has
    them) ride along as constants of the training step, computed from the batch when ``train``."""
    jax = require("jax")
    variables = jax.eval_shape(lambda key, *x: module.init(key, *x), jax.random.PRNGKey(0), *inputs)
    variables = _cast_floats(variables, dtype)
    params = variables["params"]
    if not batch_stats:
        return Build(lambda p, *x: module.apply({"params": p}, *x), params, inputs)
    stats = variables["batch_stats"]
    jnp = require("jax.numpy")

    def apply(p, *x):
        frozen = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stats)  # running averages: constants
        if train:
            out, _ = module.apply({"params": p, "batch_stats": frozen}, *x, train=True, mutable=["batch_stats"])
            return out
        return module.apply({"params": p, "batch_stats": frozen}, *x, train=False)

    return Build(apply, params, inputs)


# ----------------------------------------------------------------------------- layers written here


def _layers() -> Any:
    """flax.linen layers over ``lax`` that take the data format (built on first use: flax is optional)."""
    nn, lax, jnp = require("flax.linen"), require("jax.lax"), require("jax.numpy")

    def dims(rank: int, channels_last: bool) -> tuple[str, str, str]:
        spatial = "DHW"[3 - (rank - 2):]
        lhs = f"N{spatial}C" if channels_last else f"NC{spatial}"
        rhs = f"{spatial}IO" if channels_last else f"OI{spatial}"
        return lhs, rhs, lhs

    class Conv(nn.Module):
        """Convolution (or transposed convolution) with SAME padding in either data format."""

        features: int
        window: tuple[int, ...]
        stride: int = 1
        groups: int = 1
        channels_last: bool = True
        transpose: bool = False
        bias: bool = True

        @nn.compact
        def __call__(self, x):
            nd = len(self.window)
            axis = -1 if self.channels_last else 1
            cin = x.shape[axis]
            per_group = cin // self.groups
            shape = ((*self.window, per_group, self.features) if self.channels_last
                     else (self.features, per_group, *self.window))
            if self.transpose:  # lax.conv_transpose reads the kernel's I and O as the forward conv's
                shape = ((*self.window, cin, self.features) if self.channels_last
                         else (self.features, cin, *self.window))
            w = self.param("kernel", nn.initializers.lecun_normal(), shape).astype(x.dtype)
            numbers = dims(nd + 2, self.channels_last)
            if self.transpose:
                y = lax.conv_transpose(x, w, (self.stride,) * nd, "SAME", dimension_numbers=numbers)
            else:
                y = lax.conv_general_dilated(x, w, (self.stride,) * nd, "SAME", dimension_numbers=numbers,
                                             feature_group_count=self.groups)
            if self.bias:
                b = self.param("bias", nn.initializers.zeros, (self.features,)).astype(x.dtype)
                y = y + (b if self.channels_last else b.reshape((-1,) + (1,) * nd))
            return y

    def pool(x, channels_last: bool, kind: str = "max"):
        nd = x.ndim - 2
        window = (1, *(2,) * nd, 1) if channels_last else (1, 1, *(2,) * nd)
        if kind == "max":  # a Python scalar init: jax's max pooling, which has a derivative
            return lax.reduce_window(x, -jnp.inf, lax.max, window, window, "VALID")
        return lax.reduce_window(x, 0.0, lax.add, window, window, "VALID") / (2 ** nd)

    def spatial_axes(x, channels_last: bool) -> tuple[int, ...]:
        return tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))

    return nn, jnp, Conv, pool, spatial_axes


def _image_input(spec: Any, size: int, channels: int = 3, rank: int = 2) -> Any:
    shape = ((spec.batch, *(size,) * rank, channels) if spec.data_format.endswith("C")
             else (spec.batch, channels, *(size,) * rank))
    return _struct(shape, _dtype(spec.dtype))


def _vgg(spec: Any, widths: tuple[int, ...], convs: int, image: int) -> Build:
    nn, jnp, Conv, pool, spatial_axes = _layers()
    last = spec.data_format.endswith("C")

    class VGG(nn.Module):
        @nn.compact
        def __call__(self, x):
            for width in widths:
                for _ in range(convs):
                    x = nn.relu(Conv(width, (3, 3), channels_last=last)(x))
                x = pool(x, last)
            x = jnp.mean(x, axis=spatial_axes(x, last))
            x = nn.relu(nn.Dense(4 * widths[-1])(x))
            return nn.Dense(100)(x)

    return _flax_build(VGG(), (_image_input(spec, image),), _dtype(spec.dtype))


def _mobilenet_v2(spec: Any, stages: tuple[tuple[int, int, int], ...], image: int, squeeze: bool) -> Build:
    """Inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project); ``squeeze`` adds the
    squeeze-and-excitation gate and swish of EfficientNet's MBConv."""
    nn, jnp, Conv, pool, spatial_axes = _layers()
    last = spec.data_format.endswith("C")
    axis = -1 if last else 1

    class Net(nn.Module):
        train: bool = False

        @nn.compact
        def __call__(self, x, train: bool = False):
            norm = lambda y: nn.BatchNorm(use_running_average=not train, axis=axis)(y)  # noqa: E731
            act = nn.swish if squeeze else (lambda y: jnp.clip(y, 0, 6))
            x = act(norm(Conv(stages[0][0], (3, 3), 2, channels_last=last, bias=False)(x)))
            for width, repeats, stride in stages:
                for r in range(repeats):
                    cin = x.shape[axis]
                    hidden = cin * 4
                    y = act(norm(Conv(hidden, (1, 1), channels_last=last, bias=False)(x)))
                    y = act(norm(Conv(hidden, (3, 3), stride if r == 0 else 1, groups=hidden, channels_last=last,
                                      bias=False)(y)))
                    if squeeze:
                        s = jnp.mean(y, axis=spatial_axes(y, last), keepdims=True)
                        s = nn.swish(Conv(max(4, cin // 4), (1, 1), channels_last=last)(s))
                        y = y * nn.sigmoid(Conv(hidden, (1, 1), channels_last=last)(s))
                    y = norm(Conv(width, (1, 1), channels_last=last, bias=False)(y))
                    x = x + y if (r > 0 and cin == width) else y
            x = jnp.mean(x, axis=spatial_axes(x, last))
            return nn.Dense(100)(x)

    return _flax_build(Net(), (_image_input(spec, image),), _dtype(spec.dtype), batch_stats=True, train=spec.train)


def _unet(spec: Any, widths: tuple[int, ...], image: int, rank: int) -> Build:
    """U-Net: two convolutions per level, max pooling down, transposed convolutions up, skip concatenations
    (``rank`` 2: images, 3: volumes, i.e. 5-D tensors)."""
    nn, jnp, Conv, pool, _ = _layers()
    last = spec.data_format.endswith("C")
    axis = -1 if last else 1
    window = (3,) * rank

    class UNet(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            def block(y, width):
                for _ in range(2):
                    y = Conv(width, window, channels_last=last, bias=False)(y)
                    y = nn.relu(nn.BatchNorm(use_running_average=not train, axis=axis)(y))
                return y

            skips = []
            for width in widths[:-1]:
                x = block(x, width)
                skips.append(x)
                x = pool(x, last)
            x = block(x, widths[-1])
            for width, skip in zip(reversed(widths[:-1]), reversed(skips)):
                x = Conv(width, (2,) * rank, 2, channels_last=last, transpose=True)(x)
                x = block(jnp.concatenate([x, skip], axis=axis), width)
            return Conv(4, (1,) * rank, channels_last=last)(x)

    return _flax_build(UNet(), (_image_input(spec, image, 2 if rank == 3 else 3, rank),), _dtype(spec.dtype),
                       batch_stats=True, train=spec.train)


def _mixer(spec: Any, patch: int, hidden: int, blocks: int, image: int) -> Build:
    nn, jnp, Conv, _, _ = _layers()
    last = spec.data_format.endswith("C")

    class Mixer(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = Conv(hidden, (patch, patch), patch, channels_last=last)(x)
            if not last:
                x = jnp.transpose(x, (0, 2, 3, 1))
            x = x.reshape(x.shape[0], -1, hidden)  # (batch, tokens, channels)
            tokens = x.shape[1]
            for _ in range(blocks):
                y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)
                y = nn.Dense(tokens)(nn.gelu(nn.Dense(2 * tokens)(y)))
                x = x + jnp.swapaxes(y, 1, 2)
                y = nn.LayerNorm()(x)
                x = x + nn.Dense(hidden)(nn.gelu(nn.Dense(4 * hidden)(y)))
            return nn.Dense(100)(jnp.mean(nn.LayerNorm()(x), axis=1))

    return _flax_build(Mixer(), (_image_input(spec, image),), _dtype(spec.dtype))


def _dlrm(spec: Any, tables: int, rows: int, dim: int, bottom: tuple[int, ...], top: tuple[int, ...]) -> Build:
    nn, jnp, _, _, _ = _layers()

    class DLRM(nn.Module):
        @nn.compact
        def __call__(self, dense, ids):
            x = dense
            for width in (*bottom, dim):
                x = nn.relu(nn.Dense(width)(x))
            embedded = [jnp.take(self.param(f"table_{t}", nn.initializers.normal(0.01), (rows, dim)).astype(x.dtype),
                                 ids[:, t], axis=0) for t in range(tables)]
            z = jnp.stack([x, *embedded], axis=1)  # (batch, tables + 1, dim)
            pairs = jnp.einsum("bid,bjd->bij", z, z)
            upper_i, upper_j = jnp.triu_indices(tables + 1, k=1)
            x = jnp.concatenate([x, pairs[:, upper_i, upper_j]], axis=1)
            for width in top:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(2)(x)

    dtype = _dtype(spec.dtype)
    inputs = (_struct((spec.batch, 13), dtype), _struct((spec.batch, tables), require("jax.numpy").int32))
    return _flax_build(DLRM(), inputs, dtype)


def _lstm(spec: Any, hidden: int, layers: int, steps: int, features: int) -> Build:
    """Stacked LSTM layers, each ``flax.linen.RNN`` over flax's ``OptimizedLSTMCell`` (a ``lax.scan``)."""
    nn = require("flax.linen")

    class LSTM(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(layers):
                x = nn.RNN(nn.OptimizedLSTMCell(hidden))(x)
            return nn.Dense(100)(x[:, -1])

    return _flax_build(LSTM(), (_struct((spec.batch, steps, features), _dtype(spec.dtype)),), _dtype(spec.dtype))


def _gru(spec: Any, hidden: int, layers: int, steps: int, features: int) -> Build:
    """Stacked equinox ``GRUCell`` layers under ``lax.scan`` (time-major), a linear head on the last step."""
    jax, eqx, lax = require("jax"), require("equinox"), require("jax.lax")
    dtype = _dtype(spec.dtype)

    def make(key):
        keys = jax.random.split(key, layers + 1)
        cells = [eqx.nn.GRUCell(features if i == 0 else hidden, hidden, key=keys[i]) for i in range(layers)]
        return cells, eqx.nn.Linear(hidden, 100, key=keys[-1])

    params = _cast_floats(jax.eval_shape(make, jax.random.PRNGKey(0)), dtype)

    def apply(p, x):
        cells, head = p
        jnp = require("jax.numpy")
        for cell in cells:
            def step(h, xt, cell=cell):
                h = jax.vmap(cell)(xt, h)
                return h, h
            h0 = jnp.zeros((x.shape[1], cell.hidden_size), x.dtype)
            _, x = lax.scan(step, h0, x)
        return jax.vmap(head)(x[-1])

    return Build(apply, params, (_struct((steps, spec.batch, features), dtype),))


# ----------------------------------------------------------------------------- haiku nets


def _haiku(spec: Any, net: Callable[[], Any], image: int) -> Build:
    jax, hk = require("jax"), require("haiku")
    train = spec.train

    def forward(x, is_training):
        return net()(x, is_training=is_training)

    transformed = hk.transform_with_state(forward)
    x = _image_input(spec, image)
    # initialised in training mode, which creates the moving averages that inference reads
    params, state = jax.eval_shape(lambda key, inputs: transformed.init(key, inputs, True), jax.random.PRNGKey(0), x)
    params = _cast_floats(params, _dtype(spec.dtype))
    jnp = require("jax.numpy")

    def apply(p, inputs):
        frozen = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state)
        out, _ = transformed.apply(p, frozen, None, inputs, train)
        return out

    return Build(apply, params, (x,))


def _haiku_resnet(spec: Any, blocks: tuple[int, ...], channels: tuple[int, ...], image: int) -> Build:
    hk = require("haiku")
    return _haiku(spec, lambda: hk.nets.ResNet(blocks, 100, channels_per_group=channels, bottleneck=True,
                                               bn_config={"decay_rate": 0.9}), image)


def _haiku_mobilenet(spec: Any, channels: tuple[int, ...], strides: tuple[int, ...], image: int) -> Build:
    hk = require("haiku")
    return _haiku(spec, lambda: hk.nets.MobileNetV1(strides=strides, channels=channels, num_classes=100), image)


# ----------------------------------------------------------------------------- transformers' Flax models


def _hf(spec: Any, model_class: str, config_class: str, config: dict[str, Any], *, seq: int = 0,
        image: int = 0, call: dict[str, Any] | None = None, encoder_decoder: bool = False) -> Build:
    """A transformers Flax model built from ``config`` (no weights downloaded); text models take token ids
    (``seq`` long), vision models NCHW pixels (``image`` square; they transpose to NHWC themselves)."""
    jax, jnp = require("jax"), require("jax.numpy")
    transformers = require("transformers")
    dtype = _dtype(spec.dtype)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config), _do_init=False,
                                               dtype=dtype)
    if image:
        channels = config.get("num_channels", 3)
        init_shape = (1, image, image, channels)  # the Flax vision models initialise on NHWC
        inputs = (_struct((spec.batch, channels, image, image), dtype),)
    else:
        init_shape = (1, seq)
        inputs = (_struct((spec.batch, seq), jnp.int32),)
    shapes = _cast_floats(jax.eval_shape(lambda key: model.init_weights(key, init_shape), jax.random.PRNGKey(0)),
                          dtype)
    stats = shapes.get("batch_stats")  # vision models with batch norm keep statistics next to parameters
    params = shapes["params"] if stats is not None else shapes
    kwargs = dict(call if call is not None else {"train": False})

    def apply(p, x):
        variables = p
        if stats is not None:  # running statistics are constants of the program
            variables = {"params": p, "batch_stats": jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stats)}
        extra = dict(kwargs, decoder_input_ids=x) if encoder_decoder else kwargs
        return model(x, params=variables, **extra)[0]

    return Build(apply, params, inputs)


def _hf_text(model_class: str, config_class: str, **fixed: Any) -> Callable[..., Build]:
    def build(spec: Any, seq: int, call: dict[str, Any] | None = None, encoder_decoder: bool = False,
              **config: Any) -> Build:
        return _hf(spec, model_class, config_class, {"vocab_size": 4096, **fixed, **config}, seq=seq, call=call,
                   encoder_decoder=encoder_decoder)
    return build


def _hf_vision(model_class: str, config_class: str) -> Callable[..., Build]:
    def build(spec: Any, image: int, **config: Any) -> Build:
        return _hf(spec, model_class, config_class, {"image_size": image, **config}, image=image)
    return build


BUILDERS: dict[str, Callable[..., Build]] = {
    "vgg": _vgg,
    "mobilenet_v2": lambda spec, **kw: _mobilenet_v2(spec, squeeze=False, **kw),
    "efficientnet": lambda spec, **kw: _mobilenet_v2(spec, squeeze=True, **kw),
    "unet_2d": lambda spec, **kw: _unet(spec, rank=2, **kw),
    "unet_3d": lambda spec, **kw: _unet(spec, rank=3, **kw),
    "mlp_mixer": _mixer,
    "dlrm": _dlrm,
    "lstm": _lstm,
    "gru": _gru,
    "resnet_haiku": _haiku_resnet,
    "mobilenet_v1_haiku": _haiku_mobilenet,
    "resnet_hf": _hf_vision("FlaxResNetModel", "ResNetConfig"),
    "regnet_hf": _hf_vision("FlaxRegNetModel", "RegNetConfig"),
    "vit_hf": _hf_vision("FlaxViTModel", "ViTConfig"),
    "bert": _hf_text("FlaxBertModel", "BertConfig"),
    "roberta": _hf_text("FlaxRobertaModel", "RobertaConfig"),
    "electra": _hf_text("FlaxElectraModel", "ElectraConfig"),
    "distilbert": _hf_text("FlaxDistilBertModel", "DistilBertConfig"),
    "albert": _hf_text("FlaxAlbertModel", "AlbertConfig"),
    "gpt2": _hf_text("FlaxGPT2LMHeadModel", "GPT2Config"),
    "gpt_neo": _hf_text("FlaxGPTNeoForCausalLM", "GPTNeoConfig"),
    "llama": _hf_text("FlaxLlamaForCausalLM", "LlamaConfig"),
    "bart": _hf_text("FlaxBartModel", "BartConfig"),
}


def build(builder: str, spec: Any, options: dict[str, Any]) -> Lowerable:
    """The lowerable function of one program variant: ``BUILDERS[builder](spec, **options)`` wrapped as a
    forward pass or a training step (``spec.train``)."""
    if builder not in BUILDERS:
        raise ConfigError(f"unknown model builder {builder!r}; expected one of {', '.join(BUILDERS)}")
    return lowerable(BUILDERS[builder](spec, **options), spec.train)
