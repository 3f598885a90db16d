"""`sdaccel quality`: an approximate mode against its exact baseline on the tiny model, with tiny random CLIP and
feature stand-ins for the mechanics of CLIP score and FID (the real weights are the user's)."""

import csv
import json

import pytest
import torch
from PIL import Image

from sdaccel.cli.main import main
from sdaccel.errors import UsageError
from sdaccel.quality.gate import QualityConfig, Side, run_quality
from sdaccel.quality.prompt_set import BUILTIN, read_prompts

SMALL = dict(count=3, steps=4, height=64, width=64, device="cpu")
CACHED = Side("eager", {"cache": "deepcache", "cache_interval": 2})


class Features(torch.nn.Module):
    """A stand-in for Inception-v3: 8 features of a random convolution."""

    num_features = 8

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, images):
        return self.conv(images.float() / 255).mean((2, 3))


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory, tokenizer_dir):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    folder = tmp_path_factory.mktemp("clip")
    torch.manual_seed(0)
    config = CLIPConfig(text_config=dict(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=77),
                        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=32, patch_size=8), projection_dim=8)
    CLIPModel(config).save_pretrained(folder)
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32}),
                              tokenizer=CLIPTokenizer.from_pretrained(tokenizer_dir))
    processor.save_pretrained(folder)
    return str(folder)


def test_tables_grid_and_model_metrics(tmp_path, tiny_clip):
    reference = tmp_path / "real"
    reference.mkdir()
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        Image.fromarray(torch.randint(0, 256, (80, 80, 3), generator=g, dtype=torch.uint8).numpy()).save(
            reference / f"{k}.png")
    doc = run_quality(QualityConfig(candidate=CACHED, baseline=Side("eager"), out=str(tmp_path / "q"), grid=2,
                                    clip_model=tiny_clip, fid_feature=Features(), fid_reference=str(reference),
                                    **SMALL))
    summary = doc["summary"]
    assert summary["images"] == 3 and summary["identical_images"] == 0
    assert 10 < summary["psnr_db_min"] <= summary["psnr_db_mean"] < 100 and 0 < summary["ssim_min"] < 1
    assert summary["clip_baseline_mean"] is not None and summary["clip_candidate_mean"] is not None
    assert summary["fid_candidate_vs_baseline"] > 0
    assert summary["fid_baseline_vs_reference"] > 0 and summary["fid_candidate_vs_reference"] > 0
    assert summary["candidate_s_per_image"] > 0 and summary["speedup"] > 0
    assert doc["candidate"] == "eager[cache=deepcache,cache_interval=2]" and doc["baseline"] == "eager"
    assert any("MLPerf SDXL bounds" in note for note in doc["notes"])
    rows = list(csv.DictReader(open(tmp_path / "q" / "quality.csv")))
    assert [r["prompt"] for r in rows] == list(BUILTIN[:3]) and [r["seed"] for r in rows] == ["0", "1", "2"]
    assert all(float(r["clip_candidate"]) >= 0 for r in rows)
    assert json.loads((tmp_path / "q" / "quality.json").read_text())["summary"] == summary
    with Image.open(tmp_path / "q" / "grid.png") as grid:
        assert grid.size == (3 * 64, 2 * 64)  # baseline | candidate | difference, two rows


def test_without_the_weights_it_says_what_it_did_not_compute(tmp_path):
    doc = run_quality(QualityConfig(candidate=CACHED, baseline=Side("eager"), out=str(tmp_path), grid=0,
                                    clip_model=str(tmp_path / "no-clip"), **SMALL))
    assert doc["summary"]["clip_candidate_mean"] is None and doc["summary"]["fid_candidate_vs_baseline"] is None
    assert any(note.startswith("CLIP score: not computed") for note in doc["notes"])
    assert any(note.startswith("FID: not computed") for note in doc["notes"])
    assert not (tmp_path / "grid.png").exists()


def test_prompt_files(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# a comment\na cat\n\na dog\n")
    assert read_prompts(str(path)) == (["a cat", "a dog"], str(path))
    assert len(read_prompts(None)[0]) == 100 == len(set(BUILTIN))
    path.write_text("# nothing\n")
    with pytest.raises(UsageError, match="no prompts"):
        read_prompts(str(path))


def test_the_candidate_must_differ_from_the_baseline():
    with pytest.raises(UsageError, match="the candidate is the baseline"):
        QualityConfig(candidate=Side("eager"), baseline=Side("eager"))


@pytest.mark.parametrize("args, message", [
    (["--engine-opt", "cache=deepcache", "--count", "0"], "--count must be at least 1"),
    (["--engine-opt", "cache=deepcache", "--prompts", "/nonexistent.txt"], "cannot read it"),
    ([], "the candidate is the baseline"),
    (["--engine-opt", "cache=sometimes"], "cache must be one of"),
])
def test_cli_refuses_bad_input_with_exit_2(args, message, tmp_path, capsys):
    assert main(["quality", "--device", "cpu", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_runs(tmp_path, capsys):
    assert main(["quality", "--device", "cpu", "--engine-opt", "cache=deepcache", "--count", "2", "--steps", "3",
                 "--height", "64", "--width", "64", "--clip-model", "none", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "eager[cache=deepcache] against eager, 2 images" in out and "psnr_db_mean" in out
    assert (tmp_path / "quality.csv").exists() and (tmp_path / "grid.png").exists()
