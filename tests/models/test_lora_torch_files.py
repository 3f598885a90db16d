"""LoRA files saved by torch (.pt, .ckpt, .bin): read with torch.load(weights_only=True), the same layers as the
.safetensors file of the same tensors; a file holding anything but tensors is refused, its code never run."""

import pickle

import pytest
import torch
from safetensors.torch import load_file
from sd_fixtures import ATTN, kohya_lora

from sdaccel.errors import UsageError
from sdaccel.models import build_synthetic, get_spec
from sdaccel.models.lora import read_lora
from sdaccel.pipeline.core import Pipeline


@pytest.mark.parametrize("suffix", [".pt", ".ckpt", ".bin"])
def test_a_torch_file_merges_as_its_safetensors_twin(suffix, tmp_path):
    path, _ = kohya_lora(tmp_path / "k.safetensors", 3)
    twin = tmp_path / f"k{suffix}"
    torch.save(load_file(str(path)), twin)
    layers = {(layer.component, layer.module): layer for layer in read_lora(path)}
    for layer in read_lora(twin):
        same = layers[(layer.component, layer.module)]
        assert torch.equal(layer.down, same.down) and torch.equal(layer.up, same.up) and layer.scale == same.scale
    a, b = (Pipeline(build_synthetic(get_spec("sd15-tiny")), engine="eager", device="cpu") for _ in range(2))
    a.set_loras({str(path): 0.5})
    b.set_loras({str(twin): 0.5})
    assert torch.equal(a.components.unet.get_submodule(ATTN).weight, b.components.unet.get_submodule(ATTN).weight)


class _Payload:
    def __reduce__(self):
        return (exec, ("raise SystemExit('ran code from the file')",))


def test_a_torch_file_with_code_is_refused_without_running_it(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"lora_unet_x.lora_down.weight": _Payload()}, f, protocol=2)
    with pytest.raises(UsageError, match="not a torch file of tensors"):
        read_lora(path)
    plain = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], plain)
    with pytest.raises(UsageError, match="no {name: tensor} dict"):
        read_lora(plain)
