import pytest

from sdaccel.models.tokenizer import HashTokenizer


def test_clip_contract_bos_eos_padding():
    tok = HashTokenizer()
    ids = tok(["a photo of a cat", ""])
    assert ids.shape == (2, 77)
    row = ids[0].tolist()
    assert row[0] == 49406 and row[6] == 49407 and set(row[7:]) == {49407}
    assert all(0 < i < 49406 for i in row[1:6])
    assert ids[1, 0] == 49406 and ids[1, 1] == 49407


def test_openclip_pads_with_zero():
    ids = HashTokenizer(pad_with_eos=False)(["cat"])
    assert ids[0, :3].tolist() == [49406, ids[0, 1].item(), 49407] and set(ids[0, 3:].tolist()) == {0}


def test_deterministic_and_word_sensitive():
    tok = HashTokenizer()
    assert tok("A Cat!").tolist() == tok("a cat !").tolist()
    assert tok("a cat").tolist() != tok("a dog").tolist()


def test_truncation_warns_and_keeps_eos():
    tok = HashTokenizer()
    with pytest.warns(UserWarning, match="only the first 75"):
        ids = tok(" ".join(["word"] * 100))
    assert ids[0, -1] == 49407 and ids.shape == (1, 77)
