"""The page of ``empatheia serve`` in a real browser: Debian's Chromium, headless, driven by
Playwright, with its fake microphone and camera playing a real speech clip and a real
face clip (shared/data). A person types a turn, then records one, and the page shows the
text and the chain and plays the answer's voice and face."""

from __future__ import annotations

import shutil
from pathlib import Path

import av
import numpy as np
import pytest

from empatheia import Empatheia

from .conftest import shared_data
from .serve_helpers import Server

playwright_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs Playwright (the test extra)")

CHROMIUM_NAMES = ("chromium", "chromium-browser")
ANSWER_SECONDS = 120_000  # ms a turn may take on a loaded machine (usually a few seconds)


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Chromium is not installed (`make test` installs Debian's chromium with apt-get; it could not here)")


def write_y4m(source: Path, target: Path, seconds: float = 4.0) -> Path:
    """Chromium's fake camera reads raw YUV 4:2:0 frames in a Y4M file: the first
    ``seconds`` of ``source`` decoded into one."""
    with av.open(str(source)) as container, open(target, "wb") as out:
        stream = container.streams.video[0]
        rate = stream.average_rate or 25
        header = False
        for index, frame in enumerate(container.decode(stream)):
            if index >= seconds * rate:
                break
            planes = frame.reformat(format="yuv420p").to_ndarray()  # (H * 3 / 2, W)
            if not header:
                out.write(f"YUV4MPEG2 W{frame.width} H{frame.height} F{rate.numerator}:{rate.denominator} "
                          "Ip A1:1 C420jpeg\n".encode())
                header = True
            out.write(b"FRAME\n" + np.ascontiguousarray(planes).tobytes())
    return target


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = chromium()
    folder = tmp_path_factory.mktemp("devices")
    voice = shared_data("media/speech/sad.wav")
    camera = write_y4m(shared_data("media/mead_faces/video/W009_front_sad_level3_001.mp4"), folder / "face.y4m")
    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable, headless=True, args=[
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={voice}",
            f"--use-file-for-fake-video-capture={camera}",
            "--autoplay-policy=no-user-gesture-required",
        ])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(Empatheia.from_preset("tiny"), root=tmp_path_factory.mktemp("sessions"), max_new_tokens=4)
    yield server
    server.stop()


def _answer_played(page, index: int) -> dict:
    """The ``index``-th answer once done: its text, chain titles, and its audio and video
    elements' durations and whether they played."""
    bubble = page.locator(".turn.avatar").nth(index)
    bubble.locator(".files").wait_for(timeout=ANSWER_SECONDS)
    return bubble.evaluate("""async (bubble) => {
        const media = {};
        for (const tag of ["audio", "video"]) {
            const el = bubble.querySelector(tag);
            if (!el) { media[tag] = null; continue; }
            if (el.readyState < 1) await new Promise((ok) => el.addEventListener("loadedmetadata", ok, { once: true }));
            el.muted = true;
            el.currentTime = 0;
            await el.play();
            await new Promise((ok) => setTimeout(ok, 400));
            media[tag] = { duration: el.duration, played: el.currentTime };
            el.pause();
        }
        return {
            text: bubble.querySelector(".answer")?.textContent,
            chain: [...bubble.querySelectorAll(".chain-of-empathy dt")].map((dt) => dt.textContent),
            emotion: bubble.querySelector(".emotion")?.textContent,
            face: bubble.querySelector(".face-style")?.textContent,
            ...media,
        };
    }""")


def _check(answer: dict) -> None:
    assert answer["text"]
    assert answer["chain"] == ["Event scenario", "Your emotion", "Its cause", "Goal of the answer"]
    assert "voice and face" in answer["emotion"]
    # What the face was given is shown beside the emotion the model read.
    assert answer["face"] and answer["face"].startswith("face shows ")
    for tag in ("audio", "video"):
        assert answer[tag] is not None, f"no {tag} element"
        assert answer[tag]["duration"] > 0 and answer[tag]["played"] > 0, (tag, answer[tag])


def test_type_a_turn_then_record_one(browser, server):
    context = browser.new_context(permissions=["microphone", "camera"])
    page = context.new_page()
    problems = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready=true]")

    page.fill("#text", "I failed my exam today and I feel terrible.")
    page.click("#send")
    _check(_answer_played(page, 0))

    page.click("#record")
    page.wait_for_selector("#record.recording")
    page.wait_for_timeout(2500)
    page.click("#record")
    page.wait_for_function("document.getElementById('attached').textContent.includes('voice and face')")
    page.click("#send")
    _check(_answer_played(page, 1))

    # The recording reached the model: the second user turn holds the voice and the face.
    session = server.app.state.store.get(page.evaluate("state.session"))
    spoken = session.conversation.turns[2]
    assert spoken.role == "speaker" and spoken.audio is not None and spoken.video is not None
    assert spoken.audio.shape[0] / spoken.sample_rate > 1.0 and spoken.video.shape[0] >= 2
    assert page.locator(".turn.user video").count() == 1 and page.locator(".turn.user audio").count() == 1
    assert not problems, problems
    context.close()
