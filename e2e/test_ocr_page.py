"""The /ocr/ page: a picture of two lines rendered by PIL in Debian's DejaVu fonts, uploaded into
the page, is read back exactly on WebGPU and on cn.Wasm(), with a box per line over the picture
and the time of each stage. The picture is small (320x120) and the detector's shorter side is 160
(?side=160; rapidocr scales it up to 736, which SwiftShader and Wasm take minutes on): large text
reads the same at that size (tests/test_ocr.py reads a full page at 736 on the desktop)."""
import json

import pytest
from PIL import Image, ImageDraw, ImageFont

from browser_env import QUIET_FLAGS, WEBGPU_FLAGS, wait_ready

FONTS = "/usr/share/fonts/truetype/dejavu/"
LINES = [("Hello Cinders", "DejaVuSans.ttf", 30, (16, 14)), ("Read in a tab", "DejaVuSerif.ttf", 28, (16, 66))]


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    image = Image.new("RGB", (320, 120), "white")
    draw = ImageDraw.Draw(image)
    for text, face, size, at in LINES:
        draw.text(at, text, fill="black", font=ImageFont.truetype(FONTS + face, size))
    path = tmp_path_factory.mktemp("ocr-page") / "two-lines.png"
    image.save(path)
    return path


@pytest.mark.parametrize("webgpu", [True, False], ids=["webgpu", "wasm"])
def test_uploaded_picture_is_read_exactly(launch_browser, new_page, picture, webgpu):
    browser = launch_browser(args=QUIET_FLAGS + (WEBGPU_FLAGS if webgpu else []))
    try:
        page = wait_ready(new_page("/ocr/?side=160", on_browser=browser), timeout=300_000)
        assert page.text_content("#backend").startswith("webgpu" if webgpu else "wasm")
        page.set_input_files("#file", str(picture))
        page.wait_for_function("() => { const s = document.querySelector('#status').textContent; "
                               "return s === 'done' || s.startsWith('error'); }", timeout=300_000)
        assert page.text_content("#status") == "done", page.text_content("#error")
        result = json.loads(page.evaluate("() => JSON.stringify(window.cindersOcr.result)"))
        assert [line["text"] for line in result["lines"]] == [text for text, *_ in LINES]
        assert page.locator("#lines li").count() == 2
        for line, (text, face, size, (x, y)) in zip(result["lines"], LINES):
            box = line["box"]
            assert abs(box[0][0] - x) <= 8 and abs(box[0][1] - y) <= 12, (text, box)
            width = ImageFont.truetype(FONTS + face, size).getlength(text)
            assert abs((box[1][0] - box[0][0]) - width) <= 16, (text, box)
        assert all(result["timings"][stage] > 0 for stage in ("detect", "classify", "recognise"))
        # the boxes are drawn over the picture: red pixels where a white border was
        red = page.evaluate("""() => { const c = document.querySelector('#picture');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i] > 200 && d[i + 1] < 100 && d[i + 2] < 100) n++;
            return n; }""")
        assert red > 200, red
    finally:
        browser.close()


def test_camera_frame_is_read(launch_browser, new_page):
    """Chromium's fake camera (a moving test pattern, no text): a frame goes through the canvas
    and the reader without error, and the canvas takes the frame's size."""
    camera = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
    browser = launch_browser(args=QUIET_FLAGS + camera)
    try:
        page = wait_ready(new_page("/ocr/?side=160&backend=wasm", on_browser=browser), timeout=300_000)
        page.click("#camera")
        page.wait_for_function("() => !document.querySelector('#snap').disabled", timeout=60_000)
        page.click("#snap")
        page.wait_for_function("() => { const s = document.querySelector('#status').textContent; "
                               "return s === 'done' || s.startsWith('error'); }", timeout=300_000)
        assert page.text_content("#status") == "done", page.text_content("#error")
        size = page.evaluate("() => { const c = document.querySelector('#picture'); return [c.width, c.height]; }")
        video = page.evaluate("() => { const v = document.querySelector('#video'); "
                              "return [v.videoWidth, v.videoHeight]; }")
        assert size == video and size[0] > 0, (size, video)
        timings = page.evaluate("() => window.cindersOcr.result.timings")
        assert timings["detect"] > 0
    finally:
        browser.close()
