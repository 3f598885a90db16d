"""A1111's <lora:...> tags read out of a prompt: the prompt without them and each LoRA's one weight."""

import pytest

from sdaccel.errors import UsageError
from sdaccel.pipeline.lora_tags import extract_lora_tags


@pytest.mark.parametrize("prompt, text, loras", [
    ("a cat", "a cat", {}),
    ("a cat <lora:style>", "a cat ", {"style": 1.0}),
    ("<lora:style:0.6>a (cat:1.2)", "a (cat:1.2)", {"style": 0.6}),
    ("a cat, <lora:my style:-0.5>, BREAK x", "a cat, , BREAK x", {"my style": -0.5}),
    ("<lyco:detail:0.4>", "", {"detail": 0.4}),
    ("<LoRA:a:1:1>", "", {"a": 1.0}),  # the UNet's weight equal to the text encoder's: one weight
    ("<lora:a:te=0.5>", "", {"a": 0.5}),
    ("<lora:a:unet=0.7:te=0.7>", "", {"a": 0.7}),
    ("<lora:a:0.5> and <lora:a:0.25>", " and ", {"a": 0.75}),  # the same name twice: the weights add
    ("a <cat> and a dog>", "a <cat> and a dog>", {}),  # no colon: not a tag
])
def test_tags_come_out_of_the_prompt(prompt, text, loras):
    assert extract_lora_tags(prompt) == (text, loras)


@pytest.mark.parametrize("prompt, words", [
    ("<lora:a:0.5:1>", "apart from the UNet's"),
    ("<lora:a:unet=0.2>", "apart from the UNet's"),
    ("<lora:a:1:1:16>", "dyn"),
    ("<lora:a:dyn=16>", "dyn"),
    ("<lora:a:strength=2>", "unknown argument(s) strength"),
    ("<lora:a:big>", "'big' is not a number"),
    ("<lora:a:nan>", "finite"),
    ("<lora::1>", "no LoRA name"),
    ("<hypernet:a:1>", "<hypernet:...> is not supported"),
])
def test_tags_sdaccel_cannot_honour_are_refused(prompt, words):
    with pytest.raises(UsageError) as info:
        extract_lora_tags(prompt)
    assert words in str(info.value)
