"""Textual-inversion embeddings through sdaccel.load and a pipeline's prompts: the same conditioning as diffusers'
load_textual_inversion on the same tiny models, and as the vectors put into the token embeddings by hand (A1111's
way, emphasis included); prompts without a name are bit for bit what a pipeline without embeddings computes."""

from __future__ import annotations

import pytest
import torch
from embedding_fixtures import a1111_pt, diffusers_file, sdxl_file, vectors

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.outputs import png_parameters
from sdaccel.pipeline.prompts import apply_weights, batch_chunks


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An SD1.x-tiny folder (a 3-vector A1111 .pt, a 1-vector diffusers file) and an SDXL-tiny file."""
    folder = tmp_path_factory.mktemp("embeddings")
    a1111_pt(folder / "mystyle.pt", vectors(3, 32, seed=1))
    diffusers_file(folder / "learned_embeds.bin", "<toy>", vectors(1, 32, seed=2))
    xl = sdxl_file(tmp_path_factory.mktemp("xl") / "xlstyle.safetensors", vectors(2, 32, seed=3), vectors(2, 48, 4))
    return folder, xl


@pytest.fixture(scope="module")
def pipes(files):
    """(the tiny SD1.x model with the folder's embeddings, the same model without them)."""
    return (sdaccel.load("synthetic:sd15-tiny", device="cpu", embeddings=files[0]),
            sdaccel.load("synthetic:sd15-tiny", device="cpu"))


def context(pipe, prompt, guidance=True):
    return pipe.encode_prompt([prompt], [""] if guidance else [], guidance, 64, 64).context


def by_hand(plain, before: str, rows: torch.Tensor, after: str, weight: float = 1.0) -> torch.Tensor:
    """The hidden states of BOS, `before`, the rows, `after`, EOS: the rows written over the token embeddings'
    output at their positions (as A1111 puts embeddings in), then `weight` on them with the mean restored."""
    tok, encoder = plain.components.tokenizers[0], plain.components.text_encoders[0]
    head, tail = tok.token_ids(before), tok.token_ids(after)
    row = [tok.bos_token_id, *head, *[0] * len(rows), *tail, tok.eos_token_id]
    row += [tok.pad_token_id] * (77 - len(row))
    at = slice(1 + len(head), 1 + len(head) + len(rows))

    def put_rows(module, inputs, output):
        output = output.clone()
        output[0, at] = rows
        return output

    hook = encoder.get_input_embeddings().register_forward_hook(put_rows)
    try:
        with torch.inference_mode():
            hidden = encoder(torch.tensor([row])).last_hidden_state
    finally:
        hook.remove()
    weights = torch.ones(1, 77)
    weights[0, at] = weight
    return apply_weights(hidden, weights) if weight != 1.0 else hidden


def test_the_pipeline_reports_its_embeddings(pipes):
    pipe, plain = pipes
    assert pipe.embeddings == {"mystyle": 3, "<toy>": 1} and plain.embeddings == {}


def test_a_name_gets_the_files_vectors_as_by_hand_with_emphasis_too(pipes, files):
    pipe, plain = pipes
    rows = vectors(3, 32, seed=1)
    torch.testing.assert_close(context(pipe, "a MyStyle cat", guidance=False), by_hand(plain, "a ", rows, " cat"))
    torch.testing.assert_close(context(pipe, "a (mystyle:1.2) cat", guidance=False),
                               by_hand(plain, "a ", rows, " cat", weight=1.2))


def test_prompts_without_a_name_are_bit_identical(pipes):
    pipe, plain = pipes
    for prompt in ("a red car", "a mystyles car, <toy>s", "(red:1.3) " + " ".join(["word"] * 90)):
        assert torch.equal(context(pipe, prompt), context(plain, prompt)), prompt
    images = [p("a red car", steps=2, seed=1, output="tensor").image_tensor for p in (pipe, plain)]
    assert torch.equal(*images)
    assert not torch.equal(context(pipe, "a mystyle car"), context(plain, "a mystyle car"))


def test_an_embedding_counts_toward_its_chunk_and_is_never_split(pipes):
    pipe = pipes[0]
    tok = pipe.components.tokenizers[0]
    words = " ".join(chr(97 + i % 26) * (1 + i // 26) for i in range(72))  # 72 one-token words
    assert len(tok.token_ids(words)) == 72
    placeholder = tok.token_ids("mystyle")
    ids, _, count = batch_chunks([words + " mystyle"], tok, "a1111")
    assert count == 1 and ids[0, 73:76].tolist() == placeholder  # 72 + 3 = 75 tokens: one chunk
    ids, _, count = batch_chunks([words + " x mystyle"], tok, "a1111")
    assert count == 2 and placeholder[0] not in ids[0].tolist()  # 73 + 3 > 75: the embedding starts the next
    assert ids[1, 1:4].tolist() == placeholder


def test_the_output_records_the_names_used_with_their_hashes(pipes, files):
    pipe = pipes[0]
    result = pipe("a mystyle cat", "blurry, <toy>", steps=1, seed=2)
    sha = {e.name: e.sha256[:12] for e in pipe.components.embeddings.loaded.values()}
    assert result.params["embeddings"] == {"mystyle": sha["mystyle"], "<toy>": sha["<toy>"]}
    assert f'TI hashes: "<toy>: {sha["<toy>"]}, mystyle: {sha["mystyle"]}", ' in png_parameters(result.params, 0)
    assert "embeddings" not in pipe("a cat", steps=1, seed=2).params


def test_sd15_matches_diffusers_load_textual_inversion(saved_folder, files, tmp_path):
    from diffusers import StableDiffusionPipeline

    folder = saved_folder("sd15-tiny")
    pt, single = files[0] / "mystyle.pt", diffusers_file(tmp_path / "toy.safetensors", "<toy>", vectors(1, 32, 5))
    ours = sdaccel.load(folder, device="cpu", embeddings=[pt, single])
    theirs = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None, requires_safety_checker=False)
    theirs.load_textual_inversion(str(pt), token="mystyle")
    theirs.load_textual_inversion(str(single), token="toy")
    prompt = "a mystyle photo of toy"
    positive, negative = theirs.encode_prompt(prompt, "cpu", 1, True, negative_prompt="")
    torch.testing.assert_close(context(ours, prompt), torch.cat([negative, positive]))
    assert not torch.allclose(context(sdaccel.load(folder, device="cpu"), prompt), context(ours, prompt))


def test_sdxl_matches_diffusers_towers_loaded_one_by_one(saved_folder, files):
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import load_file

    folder, xl = saved_folder("sdxl-tiny"), files[1]
    ours = sdaccel.load(folder, device="cpu", embeddings=xl)
    theirs = StableDiffusionXLPipeline.from_pretrained(folder)
    state = load_file(xl)
    for key, encoder, tokenizer in (("clip_l", theirs.text_encoder, theirs.tokenizer),
                                    ("clip_g", theirs.text_encoder_2, theirs.tokenizer_2)):
        theirs.load_textual_inversion(state[key], token=["<s0>", "<s1>"], text_encoder=encoder, tokenizer=tokenizer)
    cond = ours.encode_prompt(["a xlstyle cat"], [""], True, 64, 64)
    positive, _, pooled, _ = theirs.encode_prompt("a <s0> <s1> cat", device="cpu", do_classifier_free_guidance=True,
                                                  negative_prompt="")
    torch.testing.assert_close(cond.context[1:], positive)
    torch.testing.assert_close(cond.text_embeds[1:], pooled)


def test_sdxl_base_and_refiner_both_take_the_file(files):
    pair = sdaccel.load("synthetic:sdxl-tiny", device="cpu", refiner="synthetic:sdxl-refiner-tiny", embeddings=files[1])
    assert pair.base.embeddings == pair.refiner.embeddings == {"xlstyle": 2}
    result = pair("a xlstyle boat", steps=2, seed=3)
    assert result.params["embeddings"] == {"xlstyle": pair.base.components.embeddings.loaded["xlstyle"].sha256[:12]}


def test_bad_embeddings_are_refused_before_the_model_loads(files, tmp_path):
    with pytest.raises(UsageError, match="embeddings: the onnxruntime engine runs exported graphs"):
        sdaccel.load("synthetic:sd15-tiny", engine="onnxruntime", device="cpu", embeddings=files[0])
    with pytest.raises(UsageError, match="xlstyle.safetensors does not fit sd15-tiny: made for SDXL"):
        sdaccel.load("synthetic:sd15-tiny", device="cpu", embeddings=files[1])
    with pytest.raises(UsageError, match="embeddings: expected a folder, a file or a list of them, got int"):
        sdaccel.load("synthetic:sd15-tiny", device="cpu", embeddings=[3])
    (tmp_path / "broken.pt").write_bytes(b"junk")
    with pytest.raises(UsageError, match="broken.pt: not a torch file"):
        sdaccel.load("synthetic:sd15-tiny", device="cpu", embeddings=tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("arch, name", [("sd15-tiny", "mystyle"), ("sdxl-tiny", "xlstyle")])
def test_the_fast_engines_graphs_read_the_grown_tables(files, arch, name):
    """Captured once: a prompt without a name gives what the fast engine gives without embeddings (within a level:
    two engines' timed kernel picks may differ in fp16 rounding); one with a name, what the eager engine gives."""
    source = files[0] if arch == "sd15-tiny" else files[1]
    fast, eager, plain = (sdaccel.load(f"synthetic:{arch}", engine=engine, device="cuda", dtype="fp16", **extra)
                          for engine, extra in (("fast", {"embeddings": source}), ("eager", {"embeddings": source}),
                                                ("fast", {})))
    call = dict(steps=2, seed=1, output="tensor", height=64, width=64)
    with_names, without = (p("a red car", **call).image_tensor.int() for p in (fast, plain))
    assert (with_names - without).abs().max() <= 1
    prompt = f"a ({name}:1.1) car"
    torch.testing.assert_close(fast.encode_prompt([prompt], [""], True, 64, 64).context,
                               eager.encode_prompt([prompt], [""], True, 64, 64).context, rtol=2e-3, atol=2e-3)
    named = fast(prompt, **call).image_tensor
    assert not torch.equal(named, plain(prompt, **call).image_tensor)
    assert torch.equal(named, fast(prompt, **call).image_tensor)  # replayed graphs, same image
