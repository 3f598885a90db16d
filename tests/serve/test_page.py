"""The web page's HTML without a browser (test_page_browser.py drives it in one): its form has the generation fields,
the progress bar and preview are there, its script calls the endpoints they need, and it loads nothing from
elsewhere."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib.resources import files


class _Elements(HTMLParser):
    """Every start tag of the page as (tag, attributes), and the inline script text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script = ""
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False if tag == "script" else self._in_script

    def handle_data(self, data):
        if self._in_script:
            self.script += data


def page() -> tuple[str, _Elements]:
    text = files("sdaccel.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    parsed = _Elements()
    parsed.feed(text)
    return text, parsed


def test_the_form_has_the_generation_fields_the_progress_and_the_preview():
    _, parsed = page()
    names = {a.get("name") for tag, a in parsed.tags if tag in ("input", "select")}
    assert {"prompt", "negative_prompt", "width", "height", "steps", "guidance", "sampler", "seed", "n",
            "key"} <= names
    ids = {a.get("id"): tag for tag, a in parsed.tags if a.get("id")}
    assert ids["bar"] == "progress" and ids["preview"] == "img" and ids["stop"] == "button"
    for endpoint in ("/v1/generate", "/sdapi/v1/progress", "/sdapi/v1/samplers", "/sdapi/v1/interrupt"):
        assert f'"{endpoint}"' in parsed.script, endpoint
    for sent in ("negative_prompt", "body.guidance", "body.scheduler", "body.n", "current_image",
                 "interrupted_at_step"):
        assert sent in parsed.script, sent


def test_the_page_loads_nothing_from_elsewhere():
    text, parsed = page()
    assert not [tag for tag, a in parsed.tags if tag in ("link", "iframe") or (tag == "script" and a.get("src"))]
    for tag, attributes in parsed.tags:
        for name in ("src", "href", "action"):
            value = attributes.get(name) or ""
            assert not re.match(r"(https?:)?//", value), (tag, name, value)
    assert not re.search(r"@import|url\(|https?://", text)
