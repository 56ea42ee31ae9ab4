"""The catalogue of lowered programs: architectures (model code and sizes) and their variants.

An :class:`Architecture` is one program family (a model at one depth and width); its variants
(:class:`ProgramSpec`) differ in mode (a forward pass or a training step), batch size, element type
(f32 or bf16) and, for convolutional models that allow it, data format (channels last or channels
first). Variants of one architecture share their stem's family part, so the grouped folds keep them
together (:func:`pipelines.data.folds.program_family` strips batch, precision, mode and the trailing
hash that tells formats apart).

Sizes are reduced (depths, widths, images) so that a training step stays within a few thousand HLO
instructions: a layout graph of roughly 200-5,000 nodes. ``source`` places an architecture in the
``xla`` collections (convolutional, recurrent, MLP and mixed image models) or ``nlp`` (transformer
encoders, decoders and an encoder-decoder over token ids).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("cnn", "rnn", "transformer", "mlp")
DTYPES = ("f32", "bf16")
CHANNELS_LAST = {2: "NHWC", 3: "NDHWC"}
CHANNELS_FIRST = {2: "NCHW", 3: "NCDHW"}


@dataclass(frozen=True)
class ProgramSpec:
    """One program variant: everything that decides the lowered module (with the architecture's options)."""

    arch: str
    train: bool
    batch: int
    dtype: str  # "f32" or "bf16"
    data_format: str = ""  # "NHWC", "NCHW", "NDHWC", "NCDHW" for image models; "" otherwise

    @property
    def mode(self) -> str:
        return "train" if self.train else "inference"

    @property
    def key(self) -> str:
        """A readable unique name of the variant (cache file names)."""
        fmt = f"_{self.data_format.lower()}" if self.data_format else ""
        return f"{self.arch}_{self.mode}_batch_{self.batch}_{self.dtype}{fmt}"

    def stem(self) -> str:
        """The graph file stem: architecture, mode, batch and precision, then a hash of the whole variant
        (so formats differ) that the grouped folds strip with the rest."""
        precision = "bf16" if self.dtype == "bf16" else "fp32"
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:12]
        return f"{self.arch}_{self.mode}_batch_{self.batch}_{precision}_{digest}"


@dataclass(frozen=True)
class Architecture:
    name: str  # the program family (stem prefix)
    builder: str  # pipelines.synth.lowered.models.BUILDERS key
    kind: str  # cnn, rnn, transformer or mlp
    source: str  # "xla" or "nlp": which layout collections hold it
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    batches: tuple[int, ...] = (8, 16, 32)
    formats: tuple[str, ...] = ("",)

    def variants(self) -> list[ProgramSpec]:
        """Every variant, in a fixed order."""
        return [ProgramSpec(self.name, train, batch, dtype, fmt) for train in (False, True) for batch in self.batches
                for dtype in DTYPES for fmt in self.formats]

    def options_json(self) -> str:
        return json.dumps(self.options, sort_keys=True)


IMAGE_FORMATS = (CHANNELS_LAST[2], CHANNELS_FIRST[2])
VOLUME_FORMATS = (CHANNELS_LAST[3], CHANNELS_FIRST[3])
TEXT_BATCHES = (8, 16, 32)


def _text(name: str, builder: str, seq: int, **config: Any) -> Architecture:
    return Architecture(name, builder, "transformer", "nlp", {"seq": seq, **config}, TEXT_BATCHES)


ARCHITECTURES: tuple[Architecture, ...] = (
    # ---- xla: convolutional
    Architecture("vgg_s", "vgg", "cnn", "xla", {"widths": (32, 64, 128), "convs": 2, "image": 64},
                 formats=IMAGE_FORMATS),
    Architecture("vgg_m", "vgg", "cnn", "xla", {"widths": (64, 128, 256, 256), "convs": 2, "image": 96},
                 formats=IMAGE_FORMATS),
    Architecture("mobilenet_v2_s", "mobilenet_v2", "cnn", "xla",
                 {"stages": ((16, 1, 1), (24, 2, 2), (32, 2, 2)), "image": 96}, formats=IMAGE_FORMATS),
    Architecture("mobilenet_v2_m", "mobilenet_v2", "cnn", "xla",
                 {"stages": ((16, 1, 1), (24, 2, 2), (32, 3, 2), (64, 2, 2)), "image": 128}, formats=IMAGE_FORMATS),
    Architecture("efficientnet_s", "efficientnet", "cnn", "xla",
                 {"stages": ((16, 1, 1), (24, 2, 2), (40, 2, 2)), "image": 96}, formats=IMAGE_FORMATS),
    Architecture("unet_2d_s", "unet_2d", "cnn", "xla", {"widths": (16, 32, 64), "image": 64}, formats=IMAGE_FORMATS),
    Architecture("unet_2d_m", "unet_2d", "cnn", "xla", {"widths": (32, 64, 128, 256), "image": 128},
                 formats=IMAGE_FORMATS),
    Architecture("unet_3d_s", "unet_3d", "cnn", "xla", {"widths": (8, 16, 32), "image": 32}, (1, 2, 4),
                 VOLUME_FORMATS),
    Architecture("unet_3d_m", "unet_3d", "cnn", "xla", {"widths": (16, 32, 64, 128), "image": 48}, (1, 2, 4),
                 VOLUME_FORMATS),
    Architecture("resnet_haiku_s", "resnet_haiku", "cnn", "xla",
                 {"blocks": (1, 1, 1, 1), "channels": (64, 128, 256, 512), "image": 64}),
    Architecture("resnet_haiku_m", "resnet_haiku", "cnn", "xla",
                 {"blocks": (2, 2, 2, 2), "channels": (64, 128, 256, 512), "image": 96}),
    Architecture("mobilenet_v1_haiku", "mobilenet_v1_haiku", "cnn", "xla",
                 {"channels": (32, 64, 128, 128, 256, 256, 512), "strides": (1, 2, 1, 2, 1, 2, 1), "image": 96}),
    Architecture("resnet_hf", "resnet_hf", "cnn", "xla",
                 {"image": 64, "embedding_size": 32, "hidden_sizes": [64, 128, 256, 512], "depths": [1, 1, 1, 1]}),
    Architecture("regnet_hf", "regnet_hf", "cnn", "xla",
                 {"image": 64, "embedding_size": 16, "hidden_sizes": [32, 64, 128, 256], "depths": [1, 1, 2, 1],
                  "groups_width": 16}),
    # ---- xla: mixed image models, MLPs, recurrent
    Architecture("vit_hf", "vit_hf", "transformer", "xla",
                 {"image": 64, "patch_size": 8, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 256}),
    Architecture("mlp_mixer_s", "mlp_mixer", "mlp", "xla", {"patch": 8, "hidden": 128, "blocks": 2, "image": 64},
                 formats=IMAGE_FORMATS),
    Architecture("mlp_mixer_m", "mlp_mixer", "mlp", "xla", {"patch": 16, "hidden": 256, "blocks": 4, "image": 128},
                 formats=IMAGE_FORMATS),
    Architecture("dlrm_s", "dlrm", "mlp", "xla",
                 {"tables": 8, "rows": 10_000, "dim": 32, "bottom": (128, 64), "top": (256, 128)}, (64, 256, 1024)),
    Architecture("dlrm_m", "dlrm", "mlp", "xla",
                 {"tables": 16, "rows": 50_000, "dim": 64, "bottom": (256, 128), "top": (512, 256)}, (64, 256, 1024)),
    Architecture("lstm_s", "lstm", "rnn", "xla", {"hidden": 128, "layers": 2, "steps": 16, "features": 64}),
    Architecture("lstm_m", "lstm", "rnn", "xla", {"hidden": 256, "layers": 3, "steps": 32, "features": 128}),
    Architecture("gru_s", "gru", "rnn", "xla", {"hidden": 128, "layers": 2, "steps": 16, "features": 64}),
    # ---- nlp: transformer encoders, decoders, an encoder-decoder
    _text("bert_L-2_H-128_A-2", "bert", 128, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
          intermediate_size=512),
    _text("bert_L-4_H-256_A-4", "bert", 128, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
          intermediate_size=1024),
    _text("roberta_L-2_H-256_A-4", "roberta", 128, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=1024),
    _text("electra_L-2_H-256_A-4", "electra", 128, embedding_size=128, hidden_size=256, num_hidden_layers=2,
          num_attention_heads=4, intermediate_size=1024),
    _text("distilbert_L-3_H-256_A-4", "distilbert", 128, dim=256, n_layers=3, n_heads=4, hidden_dim=1024),
    _text("albert_L-4_H-256_A-4", "albert", 128, embedding_size=128, hidden_size=256, num_hidden_layers=4,
          num_attention_heads=4, intermediate_size=1024),
    _text("gpt2_L-2_H-256_A-4", "gpt2", 256, n_embd=256, n_layer=2, n_head=4),
    _text("gpt2_L-4_H-128_A-2", "gpt2", 128, n_embd=128, n_layer=4, n_head=2),
    _text("gpt_neo_L-2_H-256_A-4", "gpt_neo", 256, hidden_size=256, num_layers=2, num_heads=4,
          attention_types=[[["global", "local"], 1]], window_size=64, max_position_embeddings=512),
    _text("llama_L-2_H-256_A-4", "llama", 256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, intermediate_size=512, max_position_embeddings=512),
    _text("bart_L-2_H-256_A-4", "bart", 128, encoder_decoder=True, d_model=256, encoder_layers=2, decoder_layers=2,
          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512),
)
BY_NAME: dict[str, Architecture] = {a.name: a for a in ARCHITECTURES}


def architecture(name: str) -> Architecture:
    return BY_NAME[name]


def architectures(source: str) -> list[Architecture]:
    return [a for a in ARCHITECTURES if a.source == source]
