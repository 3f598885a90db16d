"""The web page in a real browser: headless Chromium (Debian's package, installed here when absent) drives the form
of a live server and gets an image back, with the queue figures from /metrics shown beside it, the running call's
progress bar and live preview, and its Stop button returning the images reached."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

KEY = "page-key"


def chromium() -> tuple[str, str]:
    """Chromium and its driver: Debian's packages, installed now when they are missing (the test's system set-up)."""
    def found():
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        return browser, shutil.which("chromedriver")

    browser, driver = found()
    if browser and driver:
        return browser, driver
    hint = "apt-get install chromium chromium-driver"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"no Chromium here, and installing it needs root and apt-get ({hint})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"no Chromium here, and {hint} failed: {said}")
    browser, driver = found()
    assert browser and driver, "Chromium installed but not found on PATH"
    return browser, driver


@pytest.fixture(scope="module")
def server():
    worker = Worker({"tiny": "synthetic:sd15-tiny"}, engine="eager", device="cpu", max_batch=4, batch_window_ms=50)
    worker.start()
    assert worker.wait_ready(300)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(worker, api_key=KEY)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(60)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    binary, driver = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


@pytest.mark.slow
def test_the_page_generates_an_image_and_shows_the_queue(server, browser):
    browser.get(server + "/")
    form = browser.find_element(By.ID, "form")
    for name, value in (("prompt", "a lighthouse"), ("width", "32"), ("height", "48"), ("steps", "2"),
                        ("seed", "5"), ("key", KEY)):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.ID, "go").click()
    wait = WebDriverWait(browser, 120)
    image = wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#images img")))
    wait.until(lambda b: b.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image))
    size = browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", image)
    assert size == [32, 48]
    assert "seed 5" in browser.find_element(By.CSS_SELECTOR, "#images figcaption").text
    assert browser.find_element(By.ID, "error").text == ""
    assert browser.find_element(By.NAME, "seed").get_attribute("value") == "6"  # ready for the next image
    wait.until(lambda b: "queue 0" in b.find_element(By.ID, "stats").text)  # /metrics read with the key


def test_a_bad_request_shows_the_servers_message(server, browser):
    browser.get(server + "/")
    form = browser.find_element(By.ID, "form")
    for name, value in (("width", "30"), ("key", KEY)):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    browser.execute_script("document.querySelector('[name=width]').removeAttribute('step')")
    browser.find_element(By.ID, "go").click()
    error = WebDriverWait(browser, 60).until(lambda b: b.find_element(By.ID, "error").text)
    assert "multiple of 8" in error
    assert browser.find_elements(By.CSS_SELECTOR, "#images img") == []


def test_without_the_key_the_sampler_is_typed(server, browser):
    browser.get(server + "/")  # no key yet: /sdapi/v1/samplers answers 401, and the page offers a text field
    # the page swaps the field (select <-> input) as the samplers' answer comes: a found element may go stale
    WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda b: b.find_element(By.NAME, "sampler").tag_name == "input")


@pytest.mark.slow
def test_the_page_shows_progress_and_preview_and_stop_returns_the_images_so_far(server, browser):
    browser.get(server + "/")
    browser.execute_script("""window.sent = []; const send = window.fetch;
        window.fetch = (url, options) => { if (url === "/v1/generate") window.sent.push(options.body);
                                           return send(url, options); };""")
    form = browser.find_element(By.ID, "form")
    for name, value in (("key", KEY), ("prompt", "a harbour"), ("negative_prompt", "fog"), ("width", "64"),
                        ("height", "64"), ("steps", "150"), ("guidance", "6"), ("seed", "11"), ("n", "2")):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    wait = WebDriverWait(browser, 120, ignored_exceptions=(StaleElementReferenceException,))
    # The key given, the samplers come from /sdapi/v1/samplers.
    wait.until(lambda b: b.find_element(By.NAME, "sampler").tag_name == "select"
               and len(b.find_elements(By.CSS_SELECTOR, "[name=sampler] option")) > 1)
    Select(browser.find_element(By.NAME, "sampler")).select_by_value("DDIM")
    browser.find_element(By.ID, "go").click()
    preview = browser.find_element(By.ID, "preview")
    wait.until(lambda b: b.execute_script("return arguments[0].complete && arguments[0].naturalWidth", preview))
    assert browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", preview) == [32, 32]
    assert preview.get_attribute("src").startswith("data:image/png;base64,")  # the 64x64 image's latent size
    assert browser.find_element(By.ID, "running").is_displayed()
    wait.until(lambda b: float(b.find_element(By.ID, "bar").get_attribute("value")) > 0)
    assert "/150" in browser.find_element(By.ID, "step").text
    browser.find_element(By.ID, "stop").click()
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#images figcaption")) >= 2)
    captions = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#images figcaption")][:2]
    assert all("stopped at step" in c for c in captions), captions
    assert {"seed 11", "seed 12"} <= {part.strip() for c in captions for part in c.split("·")}
    assert not browser.find_element(By.ID, "running").is_displayed()
    assert browser.find_element(By.NAME, "seed").get_attribute("value") == "13"
    sent = json.loads(browser.execute_script("return window.sent[0]"))
    assert (sent["negative_prompt"], sent["guidance"], sent["scheduler"], sent["n"]) == ("fog", 6, "DDIM", 2)
