"""Prompts read as A1111 reads them (pipeline/prompts.py): emphasis, escapes, BREAK, 75-token chunks with the comma
rule, weights applied with the mean restored; each case against a reference worked out by hand from A1111's rules."""

import pytest
import torch

import sdaccel
from sdaccel.errors import UsageError
from sdaccel.models.tokenizer import HashTokenizer, HFTokenizerAdapter
from sdaccel.pipeline.prompts import BREAK, CHUNK_TOKENS, apply_weights, batch_chunks, chunk, parse


@pytest.mark.parametrize("prompt, expected", [
    ("a red car", [("a red car", 1.0)]),
    ("a (red:1.3) car, [blurry]", [("a ", 1.0), ("red", 1.3), (" car, ", 1.0), ("blurry", 1 / 1.1)]),
    ("(word)", [("word", 1.1)]),
    ("((word))", [("word", 1.1 * 1.1)]),
    ("[[word]]", [("word", 1 / 1.1 / 1.1)]),
    ("(a [b] c:1.5)", [("a ", 1.5), ("b", 1.5 / 1.1), (" c", 1.5)]),
    ("((a:1.2) b)", [("a", 1.2 * 1.1), (" b", 1.1)]),
    (r"\(not emphasis\) \[nor this\]", [("(not emphasis) [nor this]", 1.0)]),
    (r"a \\ b", [("a \\ b", 1.0)]),
    ("(unclosed and the rest", [("unclosed and the rest", 1.1)]),
    ("[unclosed", [("unclosed", 1 / 1.1)]),
    ("a ) b ] c", [("a ) b ] c", 1.0)]),
    ("ratio 16:9", [("ratio 16:9", 1.0)]),
    ("(red:1.0)", [("red", 1.0)]),
    ("(minus:-0.5)", [("minus", -0.5)]),
    ("a cat BREAK a dog", [("a cat", 1.0), (BREAK, 1.0), ("a dog", 1.0)]),
    ("(a BREAK b)", [("a", 1.1), (BREAK, 1.0), ("b", 1.1)]),
    ("BREAKFAST", [("BREAKFAST", 1.0)]),
    ("", [("", 1.0)]),
])
def test_parse_follows_a1111s_rules(prompt, expected):
    got = parse(prompt)
    assert [text for text, _ in got] == [text for text, _ in expected]
    assert [w for _, w in got] == pytest.approx([w for _, w in expected])


def test_no_syntax_reads_every_character_and_bad_input_is_named():
    assert parse("a (red:1.3) car", "none") == [("a (red:1.3) car", 1.0)]
    with pytest.raises(UsageError, match="prompt_syntax must be one of a1111, none"):
        parse("x", "compel")
    with pytest.raises(UsageError, match=r"the weight '1\.2\.3' .* is not a number"):
        parse("(red:1.2.3)")


def hash_tokenizer():
    return HashTokenizer(vocab_size=1000, pad_with_eos=True)


def test_a_short_prompt_is_one_row_equal_to_the_tokenizers_own():
    tok = hash_tokenizer()
    laid = chunk(parse("a photo of a cat"), tok)
    assert laid.ids == tok(["a photo of a cat"]).tolist() and not laid.weighted


def test_long_prompts_take_75_tokens_a_chunk_and_break_after_a_late_comma():
    tok = hash_tokenizer()
    letters = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(200)]  # 200 distinct one-token words
    ids = [tok.token_ids(w)[0] for w in letters]
    laid = chunk(parse(" ".join(letters)), tok)
    assert len(laid.ids) == 3 and all(len(row) == 77 for row in laid.ids)
    assert [row[1:1 + CHUNK_TOKENS] for row in laid.ids[:2]] == [ids[:75], ids[75:150]]
    assert laid.ids[2][1:51] == ids[150:] and laid.ids[2][51] == tok.eos_token_id

    # A comma 10 tokens before the end of the first chunk: that chunk ends after it, the phrase moves on whole.
    with_comma = letters[:64] + [","] + letters[64:]
    laid = chunk(parse(" ".join(with_comma)), tok)
    comma = tok.comma_token_id
    assert laid.ids[0][1:66] == ids[:64] + [comma] and laid.ids[0][66:] == [tok.eos_token_id] * 11
    assert laid.ids[1][1:76] == ids[64:139]
    # A comma further back than 20 tokens is not a break: the chunk is cut at 75.
    early = letters[:40] + [","] + letters[40:]
    assert chunk(parse(" ".join(early)), tok).ids[0][1:76] == ids[:40] + [comma] + ids[40:74]


def test_break_starts_a_new_chunk_and_weights_follow_their_tokens():
    tok = hash_tokenizer()
    laid = chunk(parse("a cat BREAK (a dog:1.5)"), tok)
    cat, dog = tok.token_ids("a cat"), tok.token_ids("a dog")
    assert len(laid.ids) == 2
    assert laid.ids[0][:4] == [tok.bos_token_id, *cat, tok.eos_token_id]
    assert laid.ids[1][:4] == [tok.bos_token_id, *dog, tok.eos_token_id]
    assert laid.weights[0] == [1.0] * 77 and laid.weights[1][1:3] == [1.5, 1.5] and laid.weights[1][3] == 1.0


def test_a_calls_prompts_are_padded_to_one_chunk_count_with_the_empty_prompt():
    tok = hash_tokenizer()
    long = " ".join(chr(ord("a") + i % 26) * (1 + i // 26) for i in range(100))
    ids, weights, count = batch_chunks(["", long], tok, "a1111")
    assert count == 2 and ids.shape == (4, 77) and weights is None
    assert torch.equal(ids[1], ids[0]) and torch.equal(ids[0], tok([""])[0])  # the empty prompt's chunk, twice


def test_openclip_towers_pad_with_their_own_id(tokenizer_dir):
    from transformers import CLIPTokenizer

    tok = HFTokenizerAdapter(CLIPTokenizer.from_pretrained(tokenizer_dir, pad_token="!"))
    laid = chunk(parse("a cat, a dog"), tok)
    assert laid.ids == tok(["a cat, a dog"]).tolist()  # BOS, tokens, EOS, then the pad id
    assert tok.comma_token_id in laid.ids[0] and tok.pad_token_id != tok.eos_token_id


def test_weights_scale_tokens_and_restore_each_chunks_mean():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 77, 8, generator=g) + 0.3
    weights = torch.ones(2, 77)
    weights[0, 3:5] = 1.3
    out = apply_weights(hidden, weights)
    expected = hidden[0] * weights[0][:, None]
    expected = expected * (hidden[0].mean() / expected.mean())
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(out[1], hidden[1], rtol=0, atol=0)  # weights of 1: the chunk as it was


@pytest.fixture(scope="module")
def sd15():
    return sdaccel.load("synthetic:sd15-tiny", device="cpu")


def context(pipe, prompt, syntax="a1111"):
    return pipe.encode_prompt([prompt], [""], True, 64, 64, prompt_syntax=syntax).context


def test_emphasis_of_one_is_no_emphasis_and_other_weights_differ(sd15):
    plain = context(sd15, "a red car")
    assert torch.equal(context(sd15, "a (red:1.0) car"), plain)
    assert not torch.equal(context(sd15, "a (red:1.3) car"), plain)
    assert not torch.equal(context(sd15, "a (red) car"), plain)
    assert torch.equal(context(sd15, "a \\(red\\) car", "a1111"), context(sd15, "a (red) car", "none"))


def test_a_plain_prompt_encodes_exactly_as_one_clip_window(sd15):
    tokenizer, encode = sd15.components.tokenizers[0], sd15.stages.text_encoders[0]
    ids = tokenizer(["", "a watercolor fox"])
    expected, _ = encode(ids)
    torch.testing.assert_close(context(sd15, "a watercolor fox"), expected, rtol=0, atol=0)


def test_the_tail_of_a_long_prompt_changes_the_image(sd15):
    head = " ".join(chr(ord("a") + i % 26) * (1 + i // 26) for i in range(120))
    one = sd15(head + " red", steps=2, seed=1, output="tensor").image_tensor
    two = sd15(head + " blue", steps=2, seed=1, output="tensor").image_tensor
    assert context(sd15, head + " red").shape[1] == 2 * 77
    assert not torch.equal(one, two)


def test_sdxl_chunks_both_encoders_and_pools_the_first_chunk():
    pipe = sdaccel.load("synthetic:sdxl-tiny", device="cpu")
    long = " ".join(chr(ord("a") + i % 26) * (1 + i // 26) for i in range(90))
    cond = pipe.encode_prompt([long], [""], True, 64, 64)
    widths = [te.config["hidden_size"] for te in pipe.spec.text_encoders]
    assert cond.context.shape == (2, 2 * 77, sum(widths))
    tokenizer, encode = pipe.components.tokenizers[1], pipe.stages.text_encoders[1]
    ids, _, _ = batch_chunks([long], tokenizer, "a1111")
    _, pooled = encode(ids[:1])  # the first chunk alone
    torch.testing.assert_close(cond.text_embeds[1:], pooled)


@pytest.mark.parametrize("prompt", ["(x:" + "9" * 58 + ")", "(x:101)", "(" * 60 + "x" + ")" * 60])
def test_a_weight_past_the_bound_is_refused_by_name(prompt):
    with pytest.raises(UsageError, match=r"prompt: 'x' weighs .*weights must be from -100 to 100"):
        parse(prompt)


def test_a_chunk_weighted_to_zero_keeps_finite_states():
    hidden = torch.randn(1, 77, 8)
    hidden -= hidden.mean()  # a weighted mean of (almost) zero: nothing to restore
    weights = torch.zeros(1, 77)
    out = apply_weights(hidden, weights)
    assert torch.isfinite(out).all()
    assert parse("(x:100)") == [("x", 100.0)]
