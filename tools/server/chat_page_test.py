"""The chat page at `/` in headless Chromium (Debian's `chromium` package, driven by Playwright
from PyPI with `executable_path`, so no browser is downloaded), against `k3-cli serve`:

- the API key is asked for; a streamed answer renders with its figures (tokens, tok/s timed in
  the browser, the prompt's progress as the server reported it) and a note when cut short;
- settings (system prompt, temperature, top_p, max answer tokens) survive a reload and are
  what the request carries; Stop, Regenerate (the last answer) and Edit (a user message, what
  followed dropped) send what they should;
- conversations are listed, survive a reload, switch and delete; New chat while an answer
  streams stops it and keeps it out of the new conversation;
- on a thinking model its thinking shows apart, collapsed, and the thinking switch and
  effort are sent, with thinking_budget and max_tokens = the answer's plus the budget, as the
  page says;
- on a model that reads images, images come by button, paste and drop, show as thumbnails
  and go out as data URLs; a model that does not read them gets no image button;
- canned answers (chat_page_mocked.py): markdown and Copy (and its fallback), progress, 23
  hostile outputs, 2,000 random markdown/HTML mixes, a full browser store;
- the page fetches nothing but this server. Saves two screenshots. Run by .ci/run when Chromium
  is installed (or installable):

    python tools/server/chat_page_test.py target/debug/k3-cli fixtures/default.waste SHOT.png [TOOL_CALLER [VISION]]

(SHOT-settings.png is the second screenshot.)
"""

import base64
import json
import os
import struct
import sys
import zlib

from playwright.sync_api import expect, sync_playwright

import chat_page_mocked as mocked
from k3serve import serve

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

# Chromium's own start is not under test: a container's shared memory or crash reporter has
# crashed it at launch (SIGSEGV before any page, once in CI), so it starts without /dev/shm, a GPU
# or the crash reporter, and a failed launch is tried again (at most three times, each failure
# printed) before the test fails.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-crash-reporter"]


def launch(p):
    for attempt in range(1, 4):
        try:
            return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as e:  # Playwright raises its own Error; any launch failure is retried
            if attempt == 3:
                raise
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"chromium launch {attempt} failed ({first}); trying again", file=sys.stderr)


class Page:
    """A fresh browser context's page on `base`: every URL it fetches and every chat request
    body it sends recorded."""

    def __init__(self, browser, base, key="sesame"):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800},
                                           permissions=["clipboard-read", "clipboard-write"])
        self.page = self.context.new_page()
        self.base, self.outside, self.sent = base, [], []
        self.page.on("request", self.record)
        self.page.on("pageerror", lambda e: print(f"page error: {e}", file=sys.stderr))
        self.page.goto(base + "/")
        if key:
            self.page.fill("#key", key)
            self.page.dispatch_event("#key", "change")

    def record(self, r):
        if not r.url.startswith(self.base + "/"):
            self.outside.append(r.url)
        elif r.url.endswith("/v1/chat/completions"):
            self.sent.append(json.loads(r.post_data))

    def close(self):
        assert not self.outside, f"the page fetched {self.outside}"
        self.context.close()


def send(page, text, wait=True):
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    if wait:
        expect(page.locator("#send")).to_be_visible(timeout=120_000)


def panel(page, shown):
    """Opens or closes the settings panel."""
    if page.locator("#settings").is_visible() != shown:
        page.click("#settings-button")


def setting(page, field, value):
    panel(page, True)
    page.fill(field, value)
    page.dispatch_event(field, "change")


def settings_and_answer(p, shot):
    """Settings survive a reload and go out; an answer renders with its figures."""
    page = p.page
    expect(page.locator("#model")).to_have_text("default")
    expect(page.locator("#attach")).to_be_hidden()
    # A pasted image is not taken by a model that cannot read it.
    dt = page.evaluate_handle(FILE_JS, base64.b64encode(png()).decode())
    page.evaluate(PASTE_JS, dt)
    expect(page.locator("#thumbs .thumb")).to_have_count(0)
    setting(page, "#system", "You are terse.")
    setting(page, "#temperature", "0.3")
    setting(page, "#top_p", "0.9")
    # Short enough that an unseeded answer is cut by it, not ended by the model.
    setting(page, "#max", "8")
    expect(page.locator("#thinking")).to_be_disabled()
    expect(page.locator("#max-note")).to_have_text("max_tokens is the answer's limit (8).")
    page.screenshot(path=shot.replace(".png", "-settings.png"))
    page.reload()
    expect(page.locator("#model")).to_have_text("default")
    panel(page, True)
    for field, value in [("#system", "You are terse."), ("#temperature", "0.3"), ("#top_p", "0.9"), ("#max", "8")]:
        expect(page.locator(field)).to_have_value(value)
    panel(page, False)
    mocked.watch_progress(page)
    send(page, "In the beginning")
    body = p.sent[-1]
    assert body["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "In the beginning"}], body
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.3, 0.9, 8), body
    assert body["stream"] and body["return_progress"] and body["stream_options"] == {"include_usage": True}, body
    assert "reasoning_effort" not in body, "no thinking switch for a model without one"
    expect(page.locator(".user .text")).to_have_text("In the beginning")
    answer = page.locator(".assistant .answer").first
    stored = page.evaluate("JSON.parse(localStorage.getItem('k3-conversations'))[0].messages[1].text")
    assert stored.strip() and page.evaluate("document.querySelector('.assistant .answer').childNodes.length"), f"an answer rendered: {stored!r}"
    expect(page.locator(".note")).to_contain_text("cut at its length limit")
    meta = page.locator(".assistant .meta").first
    expect(meta).to_contain_text("8 tokens")
    expect(meta).to_contain_text("prompt ")
    seen = page.evaluate("window.__progress")
    assert any(s.startswith("Reading the prompt: ") for s in seen), f"no progress shown: {seen}"
    print(f"chat page: settings kept and sent, an answer with its figures ({meta.inner_text()}), progress {seen[-1]!r} ok")


def stop_regenerate_edit(p):
    page = p.page
    setting(page, "#max", "")
    send(page, "And God said", wait=False)
    expect(page.locator(".assistant .answer").nth(1)).not_to_be_empty(timeout=60_000)
    page.click("#stop")
    expect(page.locator(".note").last).to_have_text("(stopped)")
    # A stopped answer streamed for a while: its rate, timed in the browser.
    expect(page.locator(".assistant .meta").nth(1)).to_contain_text("tok/s (timed in the browser)")
    expect(page.locator("#send")).to_be_visible()
    # Regenerate drops the stopped answer and asks again for the same conversation.
    setting(page, "#max", "6")
    page.click(".assistant .regenerate")
    expect(page.locator("#send")).to_be_visible(timeout=120_000)
    roles = [(m["role"], m["content"]) for m in p.sent[-1]["messages"]]
    assert roles[-1] == ("user", "And God said") and len(roles) == 4, roles
    expect(page.locator(".assistant")).to_have_count(2)
    expect(page.locator(".assistant .regenerate")).to_have_count(1)
    # Editing the first message drops everything after it and resends.
    page.locator(".user .edit").first.click()
    page.fill(".user .edit-text", "Let there be light")
    page.click(".user .save")
    expect(page.locator("#send")).to_be_visible(timeout=120_000)
    assert [m["content"] for m in p.sent[-1]["messages"]] == ["You are terse.", "Let there be light"], p.sent[-1]
    expect(page.locator(".user")).to_have_count(1)
    expect(page.locator(".assistant")).to_have_count(1)
    expect(page.locator(".user .text")).to_have_text("Let there be light")
    print("chat page: stop, regenerate, edit ok")


def conversations(p):
    page = p.page
    expect(page.locator(".conversation")).to_have_count(1)
    page.click("#new")
    expect(page.locator(".msg")).to_have_count(0)
    send(page, "A second conversation")
    expect(page.locator(".conversation")).to_have_count(2)
    page.reload()
    expect(page.locator("#model")).to_have_text("default")
    expect(page.locator(".conversation")).to_have_count(2)
    expect(page.locator(".conversation.current")).to_have_text("A second conversation×")
    expect(page.locator(".user .text")).to_have_text("A second conversation")
    page.click(".conversation .open >> text=Let there be light")
    expect(page.locator(".user .text")).to_have_text("Let there be light")
    expect(page.locator(".assistant .answer")).not_to_be_empty()
    page.locator(".conversation", has_text="A second conversation").locator(".delete").click()
    expect(page.locator(".conversation")).to_have_count(1)
    page.reload()
    expect(page.locator(".conversation")).to_have_count(1)
    expect(page.locator(".user .text")).to_have_text("Let there be light")
    print("chat page: conversations listed, kept over a reload, switched and deleted ok")


def new_chat_while_streaming(p) -> None:
    """New chat while an answer streams stops it: no partial answer and no "(stopped)" note
    reach the new conversation, whose first request carries only its own message."""
    page = p.page
    setting(page, "#system", "")
    setting(page, "#max", "")
    page.click("#new")
    send(page, "Let there be light", wait=False)
    expect(page.locator(".assistant .answer").first).not_to_be_empty(timeout=60_000)
    expect(page.locator("#stop")).to_be_visible()
    page.click("#new")
    expect(page.locator("#send")).to_be_visible()
    setting(page, "#max", "5")
    sent = len(p.sent)
    send(page, "In the beginning")
    assert len(p.sent) == sent + 1
    assert p.sent[-1]["messages"] == [{"role": "user", "content": "In the beginning"}], p.sent[-1]
    expect(page.locator(".user")).to_have_count(1)
    expect(page.locator(".assistant")).to_have_count(1)
    expect(page.locator(".note", has_text="stopped")).to_have_count(0)
    print("chat page: new chat while streaming ok")


def thinking(browser, cli, model):
    """A model that thinks between <think> tags (no switch on its chat format): its thinking
    shows apart, collapsed, and no thinking switch is offered or sent."""
    with serve(cli, model) as base:
        p = Page(browser, base)
        page = p.page
        expect(page.locator("#model")).to_have_text("tool-caller")
        expect(page.locator("#thinking")).to_be_disabled()
        send(page, "Weather?")
        assert "reasoning_effort" not in p.sent[-1], p.sent[-1]
        details = page.locator(".assistant details")
        expect(details).to_have_count(1)
        assert details.get_attribute("open") is None, "thinking starts collapsed"
        assert "The user wants the weather." in details.locator(".thought").text_content()
        expect(page.locator(".assistant .answer")).to_contain_text("Let me check the weather.")
        p.close()
        print("chat page: thinking shown apart (collapsed), no switch for a model without one ok")


def k3_thinking(p, shot):
    """K3's thinking switch and effort are sent as reasoning_effort, the budget as
    thinking_budget; max_tokens is the answer's plus the budget while thinking is on, as the
    page says."""
    page = p.page
    expect(page.locator("#thinking")).to_be_enabled()
    setting(page, "#max", "6")
    setting(page, "#budget", "20")
    expect(page.locator("#max-note")).to_contain_text("thinking_budget = 20: at most 20 tokens of thinking")
    expect(page.locator("#max-note")).to_contain_text("max_tokens = max answer tokens + thinking budget = 6 + 20 = 26")
    page.screenshot(path=shot.replace(".png", "-settings.png"))
    send(page, "Think first")
    sent = p.sent[-1]
    assert (sent["reasoning_effort"], sent["thinking_budget"], sent["max_tokens"]) == ("max", 20, 26), sent
    page.uncheck("#thinking")
    expect(page.locator("#max-note")).to_have_text("max_tokens is the answer's limit (6).")
    page.click("#new")
    send(page, "No thinking")
    assert (p.sent[-1]["reasoning_effort"], p.sent[-1]["max_tokens"]) == ("none", 6), p.sent[-1]
    assert "thinking_budget" not in p.sent[-1], p.sent[-1]
    page.check("#thinking")
    page.select_option("#effort", "low")
    setting(page, "#budget", "")
    expect(page.locator("#max-note")).to_contain_text("No thinking budget")
    page.click("#new")
    send(page, "Think a little")
    assert (p.sent[-1]["reasoning_effort"], p.sent[-1]["max_tokens"]) == ("low", 6), p.sent[-1]
    assert "thinking_budget" not in p.sent[-1], p.sent[-1]
    setting(page, "#budget", "20")
    page.uncheck("#thinking")
    panel(page, False)
    page.click("#new")
    print("chat page: K3's thinking switch, effort, thinking_budget and max_tokens (answer + budget) sent ok")


def png(width=48, height=32):
    """A small RGB PNG."""
    rows = b"".join(b"\0" + bytes(v for x in range(width) for v in (x * 5 % 256, y * 7 % 256, 128)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


FILE_JS = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], "pic.png", { type: "image/png" }));
  return dt;
}"""


PASTE_JS = """(dt) => document.getElementById("prompt").dispatchEvent(
  new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }))"""


def images(browser, cli, model, shot):
    """A model that reads images: by button, paste and drop, thumbnails, sent as data URLs."""
    data = png()
    b64 = base64.b64encode(data).decode()
    with serve(cli, model) as base:
        p = Page(browser, base)
        page = p.page
        expect(page.locator("#vision")).to_be_visible()
        k3_thinking(p, shot)
        page.set_input_files("#file", files=[{"name": "pic.png", "mimeType": "image/png", "buffer": data}])
        expect(page.locator("#thumbs .thumb")).to_have_count(1)
        dt = page.evaluate_handle(FILE_JS, b64)
        page.evaluate(PASTE_JS, dt)
        expect(page.locator("#thumbs .thumb")).to_have_count(2)
        page.dispatch_event("#log", "dragover", {"dataTransfer": dt})
        page.dispatch_event("#log", "drop", {"dataTransfer": dt})
        expect(page.locator("#thumbs .thumb")).to_have_count(3)
        page.locator("#thumbs .unattach").nth(2).click()
        expect(page.locator("#thumbs .thumb")).to_have_count(2)
        page.dispatch_event("#log", "drop", {"dataTransfer": dt})
        expect(page.locator("#thumbs .thumb")).to_have_count(3)
        send(page, "What is in these pictures?")
        parts = p.sent[-1]["messages"][-1]["content"]
        assert parts[0] == {"type": "text", "text": "What is in these pictures?"}, parts
        urls = [x["image_url"]["url"] for x in parts[1:]]
        assert urls == ["data:image/png;base64," + b64] * 3, [u[:40] for u in urls]
        expect(page.locator(".user .images .thumb")).to_have_count(3)
        expect(page.locator(".error")).to_have_count(0)
        expect(page.locator(".assistant .meta")).to_contain_text("6 tokens")
        page.screenshot(path=shot.replace(".png", "-images.png"), full_page=True)
        p.close()
        print("chat page: images by button, paste and drop, thumbnails, sent as data URLs, answered ok")


def mocked_pages(browser, base, shot):
    checks = [lambda page, base: mocked.markdown(page, base, shot), mocked.progress, mocked.hostile, mocked.copy_fallback,
              mocked.full_storage, mocked.fuzz]
    for check in checks:
        p = Page(browser, base)
        expect(p.page.locator("#model")).to_have_text("default")
        check(p.page, base)
        p.close()


def main() -> None:
    cli, model, shot = sys.argv[1], sys.argv[2], sys.argv[3]
    with sync_playwright() as pw:
        browser = launch(pw)
        with serve(cli, model) as base:
            p = Page(browser, base, key=None)
            expect(p.page.locator("#model")).to_have_text("enter the API key")
            setting(p.page, "#key", "sesame")
            expect(p.page.locator("#model")).to_have_text("default")
            settings_and_answer(p, shot)
            stop_regenerate_edit(p)
            conversations(p)
            new_chat_while_streaming(p)
            p.close()
            mocked_pages(browser, base, shot)
        if len(sys.argv) > 4:
            thinking(browser, cli, sys.argv[4])
        if len(sys.argv) > 5:
            images(browser, cli, sys.argv[5], shot)
        browser.close()


if __name__ == "__main__":
    main()
