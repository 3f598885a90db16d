"""Textual-inversion files (models/embeddings.py): every format read back as written, bad files refused with the
file named (a pickle that would run code is refused, never run), names matched as A1111 matches them, and the text
encoders' tables grown so placeholder ids look up the file's vectors."""

from __future__ import annotations

import copy
import io
import pickle
from types import SimpleNamespace

import pytest
import torch
from embedding_fixtures import a1111_pt, a1111_safetensors, diffusers_file, sdxl_file, vectors
from sd_fixtures import write_clip_tokenizer

from sdaccel.errors import UsageError
from sdaccel.models import embeddings as emb
from sdaccel.models import get_spec
from sdaccel.models.embeddings import (EmbeddingTokenizer, apply_embeddings, embedding_sources, load_embeddings,
                                       read_embedding)
from sdaccel.models.tokenizer import HashTokenizer, HFTokenizerAdapter


# ------------------------------------------------------------------------------------------------ formats


def test_a1111_pt_reads_its_vectors_and_metadata(tmp_path):
    rows = vectors(3, 32, seed=1)
    e = read_embedding(a1111_pt(tmp_path / "my-style.pt", rows))
    assert e.name == "my-style" and e.count == 3 and e.shape == 32
    assert torch.equal(e.vectors[""], rows)
    assert (e.step, e.sd_checkpoint, e.sd_checkpoint_name) == (120, "abcdef12", "base-model")
    assert e.describe() == {"step": 120, "sd_checkpoint": "abcdef12", "sd_checkpoint_name": "base-model",
                            "shape": 32, "vectors": 3}


def test_a1111_safetensors_and_diffusers_files_read_their_vectors(tmp_path):
    rows = vectors(2, 32, seed=2)
    one = read_embedding(a1111_safetensors(tmp_path / "neg.safetensors", rows))
    assert one.name == "neg" and torch.equal(one.vectors[""], rows) and one.step is None
    single = read_embedding(diffusers_file(tmp_path / "learned_embeds.bin", "<cat-toy>", rows[:1]))
    assert single.name == "<cat-toy>" and single.count == 1 and torch.equal(single.vectors[""], rows[:1])
    multi = read_embedding(diffusers_file(tmp_path / "toy.safetensors", "<toy>", rows))
    assert multi.name == "toy" and torch.equal(multi.vectors[""], rows)  # named after the file, as A1111 does
    half = read_embedding(diffusers_file(tmp_path / "half.pt", "<h>", rows.half()))
    assert half.vectors[""].dtype == torch.float32 and torch.equal(half.vectors[""], rows.half().float())


def test_sdxl_files_keep_both_towers(tmp_path):
    clip_l, clip_g = vectors(2, 32, seed=3), vectors(2, 48, seed=4)
    e = read_embedding(sdxl_file(tmp_path / "xl.safetensors", clip_l, clip_g))
    assert torch.equal(e.vectors["clip_l"], clip_l) and torch.equal(e.vectors["clip_g"], clip_g)
    assert e.count == 2 and e.shape == 80  # A1111's shape: both widths summed


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_a_pickle_that_would_run_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "ran"
    for name, save in (("zip.pt", lambda obj, f: torch.save(obj, f)), ("legacy.bin", pickle.dump)):
        path = tmp_path / name
        with open(path, "wb") as f:
            save({"string_to_param": {"*": _RunsCode(marker)}}, f)
        with pytest.raises(UsageError, match=rf"embedding .*{name}: .*weights_only=True"):
            read_embedding(path)
    assert not marker.exists()


def test_an_old_parameter_dict_file_says_what_it_would_need(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"string_to_param": torch.nn.ParameterDict({"*": torch.nn.Parameter(vectors(1, 32, 0))})}, path)
    with pytest.raises(UsageError, match=r"old\.pt: holds a torch\.nn\.modules\.container\.ParameterDict, which only "
                                         r"unpickling .* re-save it as \.safetensors"):
        read_embedding(path)


def _saved(tmp_path, name, obj):
    path = tmp_path / name
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("name, content, words", [
    ("text.pt", b"not a torch file", "not a torch file of tensors sdaccel can read"),
    ("zip.pt", b"PK\x03\x04 cut short", "not a torch file of tensors sdaccel can read"),
    ("cut.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{", "not a safetensors file sdaccel can read"),
    ("notes.txt", b"hello", r"expected a \.pt, \.bin, \.safetensors file"),
])
def test_unreadable_files_are_named(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UsageError, match=rf"embedding .*{name}: {words}"):
        read_embedding(path)


@pytest.mark.parametrize("obj, words", [
    ([1, 2], "holds a list, not an embedding's dict"),
    ({"a": torch.zeros(1, 4), "b": torch.zeros(1, 4)}, "no embedding in it .keys a, b"),
    ({"emb_params": torch.zeros(2, 3, 4)}, r"have shape \(2, 3, 4\)"),
    ({"emb_params": torch.zeros(76, 4)}, r"1 <= n <= 75"),
    ({"emb_params": torch.zeros(2, 4, dtype=torch.long)}, "not a floating-point tensor"),
    ({"emb_params": torch.tensor([[0.0, float("nan")]])}, "hold NaN or Inf"),
    ({"string_to_param": {"*": torch.zeros(1, 4), "x": torch.zeros(1, 4)}}, "string_to_param must hold one tensor"),
    ({"clip_l": torch.zeros(2, 4)}, "an SDXL embedding needs clip_l and clip_g; clip_g is missing"),
    ({"clip_l": torch.zeros(2, 4), "clip_g": torch.zeros(3, 8)}, "different numbers of vectors"),
])
def test_files_that_hold_no_usable_embedding_are_named(tmp_path, obj, words):
    with pytest.raises(UsageError, match=rf"embedding .*bad\.pt: .*{words}"):
        read_embedding(_saved(tmp_path, "bad.pt", obj))


def test_a_file_no_prompt_could_name(tmp_path):
    with pytest.raises(UsageError, match="its name is empty"):
        read_embedding(diffusers_file(tmp_path / "learned_embeds.bin", "  ", vectors(1, 32, 0)))


def test_a_missing_or_huge_file(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="embedding .*gone.pt: no such file"):
        read_embedding(tmp_path / "gone.pt")
    monkeypatch.setattr(emb, "MAX_FILE_BYTES", 100)
    path = a1111_safetensors(tmp_path / "big.safetensors", vectors(10, 32, 0))
    with pytest.raises(UsageError, match="big.safetensors: 0 MiB is no embedding"):
        read_embedding(path)


# ------------------------------------------------------------------------------------------------ folders


def test_a_folder_reads_every_embedding_file_below_it(tmp_path):
    a1111_pt(tmp_path / "one.pt", vectors(1, 32, 1))
    (tmp_path / "sub").mkdir()
    a1111_safetensors(tmp_path / "sub" / "two.safetensors", vectors(2, 32, 2))
    (tmp_path / "one.preview.png").write_bytes(b"\x89PNG")  # A1111 keeps previews beside embeddings
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.pt").write_bytes(b"junk")
    assert [e.name for e in load_embeddings(tmp_path)] == ["one", "two"]
    assert load_embeddings(tmp_path / "sub")[0].count == 2


def test_folders_refuse_duplicate_names_and_missing_folders(tmp_path):
    a1111_pt(tmp_path / "Style.pt", vectors(1, 32, 1))
    (tmp_path / "more").mkdir()
    a1111_safetensors(tmp_path / "more" / "style.safetensors", vectors(1, 32, 2))
    with pytest.raises(UsageError, match="are both named 'style'"):
        load_embeddings(tmp_path)
    with pytest.raises(UsageError, match="embeddings .*nowhere: no such folder"):
        load_embeddings(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="embeddings .*Style.pt: not a folder"):
        load_embeddings(tmp_path / "Style.pt")
    with pytest.raises(UsageError, match="embeddings .*nowhere: no such file or folder"):
        embedding_sources(tmp_path / "nowhere")
    assert [(e.name, explicit) for e, explicit in embedding_sources([tmp_path / "Style.pt"])] == [("Style", True)]


# ------------------------------------------------------------------------------------------------ names


def _wrapped(tokenizer, words):
    return EmbeddingTokenizer(tokenizer, words)


def test_names_are_whole_words_in_any_case_and_other_text_is_unchanged():
    base = HashTokenizer()
    tok = _wrapped(base, {"style": [50000, 50001], "style two": [50002], "<toy>": [50003]})
    assert tok.token_ids("a red car") == base.token_ids("a red car")
    assert tok.token_ids("stylish styles, restyle") == base.token_ids("stylish styles, restyle")
    assert tok.token_ids("a Style car") == base.token_ids("a ") + [50000, 50001] + base.token_ids(" car")
    assert tok.token_ids("STYLE   two,style") == [50002] + base.token_ids(",") + [50000, 50001]
    assert tok.token_ids("a <toy>") == base.token_ids("a") + [50003]
    assert tok.embedding_spans == {50000: 2, 50002: 1, 50003: 1}
    assert tok.bos_token_id == base.bos_token_id and tok.comma_token_id == base.comma_token_id
    assert torch.equal(tok(["a red car"]), base(["a red car"]))
    row = tok(["a style"])[0].tolist()
    assert row[:5] == [base.bos_token_id, *base.token_ids("a"), 50000, 50001, base.eos_token_id]
    assert len(row) == 77 and set(row[5:]) == {base.pad_token_id}


def test_names_with_clips_own_tokenizer(tmp_path):
    base = HFTokenizerAdapter(__import__("transformers").CLIPTokenizer.from_pretrained(
        write_clip_tokenizer(tmp_path / "tok")))
    tok = _wrapped(base, {"cat-toy": [90, 91]})
    for text in ("a cat toy", "a cat, toy's hat", "cat-toys"):
        assert tok.token_ids(text) == base.token_ids(text)
    assert tok.token_ids("a cat-toy's hat") == base.token_ids("a ") + [90, 91] + base.token_ids("'s hat")
    assert torch.equal(tok(["a cat, toy"]), base(["a cat, toy"]))


# ------------------------------------------------------------------------------------------------ tables


def _components(arch="sd15-tiny", eos_token_id=None):
    """A tiny model's text side: its spec, encoders (the first with `eos_token_id` in its config) and tokenizers."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    spec = get_spec(arch)
    torch.manual_seed(0)
    encoders, tokenizers = [], []
    for i, te in enumerate(spec.text_encoders):
        config = dict(te.config, **({"eos_token_id": eos_token_id} if eos_token_id is not None and i == 0 else {}))
        cls = CLIPTextModelWithProjection if te.with_projection else CLIPTextModel
        encoders.append(cls(CLIPTextConfig(**config)).eval().requires_grad_(False))
        tokenizers.append(HashTokenizer(te.config["vocab_size"], 77, te.pad_with_eos))
    return SimpleNamespace(spec=spec, text_encoders=encoders, tokenizers=tokenizers, source=f"synthetic:{arch}")


def test_tables_grow_by_the_vectors_and_names_map_to_their_rows(tmp_path):
    comps = _components()
    before = comps.text_encoders[0].get_input_embeddings().weight.clone()
    one, two = vectors(2, 32, 1), vectors(1, 32, 2)
    found = embedding_sources([a1111_pt(tmp_path / "one.pt", one),
                               a1111_safetensors(tmp_path / "two.safetensors", two)])
    loaded = apply_embeddings(comps, found)
    assert list(loaded.loaded) == ["one", "two"] and loaded.skipped == {}
    table = comps.text_encoders[0].get_input_embeddings()
    assert table.num_embeddings == 49408 + 3 and not table.weight.requires_grad
    assert torch.equal(table.weight[:49408], before)
    ids = comps.tokenizers[0].token_ids("two one")
    assert ids == [49410, 49408, 49409] and torch.equal(table.weight[ids], torch.cat([two, one]))
    assert loaded.used_in(["a One", "nothing"]) == {"one": found[0][0].sha256[:12]}


def test_legacy_eos_configs_pool_at_eos_not_at_a_placeholder(tmp_path):
    comps = _components(eos_token_id=2)  # what SD1.5's and SDXL's published text encoder configs say
    untouched = copy.deepcopy(comps.text_encoders[0])
    apply_embeddings(comps, embedding_sources(a1111_pt(tmp_path / "tok.pt", vectors(2, 32, 1))))
    encoder, tokenizer = comps.text_encoders[0], comps.tokenizers[0]
    ids = tokenizer(["a tok cat", "a plain cat"])
    out = encoder(ids)
    eos = (ids[0] == tokenizer.eos_token_id).nonzero()[0, 0]
    torch.testing.assert_close(out.pooler_output[0], out.last_hidden_state[0, eos], rtol=0, atol=0)
    assert torch.equal(out.pooler_output[1], untouched(ids[1:]).pooler_output[0])


def test_skipped_and_refused_by_width_and_tower(tmp_path):
    folder = tmp_path / "all"
    folder.mkdir()
    a1111_pt(folder / "sd.pt", vectors(1, 32, 1))
    a1111_pt(folder / "wide.pt", vectors(1, 768, 2))
    sdxl_file(folder / "xl.safetensors", vectors(1, 32, 3), vectors(1, 48, 4))
    with pytest.warns(UserWarning, match="another model than sd15-tiny, skipped: wide, xl"):
        sd = apply_embeddings(_components(), embedding_sources(folder))
    assert list(sd.loaded) == ["sd"] and sorted(sd.skipped) == ["wide", "xl"]
    assert sd.describe()["skipped"]["xl"]["shape"] == 80
    with pytest.warns(UserWarning, match="skipped: sd, wide"):
        xl = apply_embeddings(_components("sdxl-tiny"), embedding_sources(folder))
    assert list(xl.loaded) == ["xl"]
    with pytest.raises(UsageError, match=r"wide\.pt does not fit sd15-tiny: 768-wide vectors; text_encoder takes "
                                         r"32-wide vectors"):
        apply_embeddings(_components(), embedding_sources(folder / "wide.pt"))
    with pytest.raises(UsageError, match=r"sd\.pt does not fit sdxl-tiny: 32-wide vectors for one text encoder"):
        apply_embeddings(_components("sdxl-tiny"), embedding_sources(folder / "sd.pt"))
    with pytest.raises(UsageError, match=r"xl\.safetensors does not fit sd15-tiny: made for SDXL"):
        apply_embeddings(_components(), embedding_sources(folder / "xl.safetensors"))


def test_sdxl_towers_go_to_their_encoders_and_the_refiner_takes_clip_g(tmp_path):
    clip_l, clip_g = vectors(2, 32, 1), vectors(2, 48, 2)
    found = embedding_sources(sdxl_file(tmp_path / "xl.safetensors", clip_l, clip_g))
    comps = _components("sdxl-tiny")
    apply_embeddings(comps, found)
    for encoder, tokenizer, rows in zip(comps.text_encoders, comps.tokenizers, (clip_l, clip_g)):
        assert torch.equal(encoder.get_input_embeddings().weight[tokenizer.token_ids("xl")], rows)
    refiner = _components("sdxl-refiner-tiny")
    apply_embeddings(refiner, found)
    ids = refiner.tokenizers[0].token_ids("xl")
    assert torch.equal(refiner.text_encoders[0].get_input_embeddings().weight[ids], clip_g)


def test_bytes_read_are_the_bytes_hashed(tmp_path):
    import hashlib

    path = a1111_pt(tmp_path / "h.pt", vectors(1, 32, 1))
    assert read_embedding(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    buffer = io.BytesIO(path.read_bytes())
    assert torch.equal(torch.load(buffer, weights_only=True)["string_to_param"]["*"], read_embedding(path).vectors[""])
