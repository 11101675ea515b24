"""The chat page at `/` in headless Chromium (Debian's `chromium` package, driven by Playwright
from PyPI with `executable_path`, so no browser is downloaded): the page asks for the API key,
a message goes out and a streamed answer renders, a thinking model's thinking shows apart in a
collapsed section, Stop ends an answer, New chat empties the page (and, while an answer streams,
stops and forgets it), and the page fetches nothing
but this server. Saves a screenshot. Run by .ci/run when Chromium is installed (or installable):

    python tools/server/chat_page_test.py target/debug/k3-cli fixtures/default.waste SCREENSHOT.png [TOOL_CALLER]
"""

import json
import os
import sys

from playwright.sync_api import expect, sync_playwright

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


def open_page(browser, base):
    page = browser.new_page()
    outside = []
    page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
    page.goto(base + "/")
    return page, outside


def new_chat_while_streaming(page) -> None:
    """New chat while an answer streams stops it and forgets it: no partial answer and no
    "(stopped)" note reach the new conversation, whose first request carries only its own
    message."""
    sent = []
    page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/v1/chat/completions") else None)
    page.fill("#prompt", "Let there be light")
    page.press("#prompt", "Enter")
    expect(page.locator(".assistant .answer").first).not_to_be_empty(timeout=60_000)
    expect(page.locator("#stop")).to_be_visible()
    page.click("#new")
    expect(page.locator("#send")).to_be_visible()
    page.fill("#max", "5")
    page.dispatch_event("#max", "change")
    page.fill("#prompt", "In the beginning")
    page.press("#prompt", "Enter")
    expect(page.locator("#send")).to_be_visible(timeout=120_000)
    assert len(sent) == 2, f"{len(sent)} requests"
    messages = json.loads(sent[1])["messages"]
    assert messages == [{"role": "user", "content": "In the beginning"}], f"the new chat sent {messages}"
    expect(page.locator(".user")).to_have_count(1)
    expect(page.locator(".assistant")).to_have_count(1)
    expect(page.locator(".note", has_text="stopped")).to_have_count(0)


def main() -> None:
    cli, model, shot = sys.argv[1], sys.argv[2], sys.argv[3]
    with sync_playwright() as p:
        browser = launch(p)
        with serve(cli, model) as base:
            page, outside = open_page(browser, base)
            expect(page.locator("#model")).to_have_text("enter the API key")
            page.fill("#key", "sesame")
            page.dispatch_event("#key", "change")
            expect(page.locator("#model")).to_have_text("default")
            # Short enough that an unseeded answer is cut by it, not ended by the model (at 40
            # the default model's answer ended by itself at 34 tokens in one CI run).
            page.fill("#max", "8")
            page.dispatch_event("#max", "change")
            page.fill("#prompt", "In the beginning")
            page.press("#prompt", "Enter")
            expect(page.locator(".user")).to_have_text("In the beginning")
            # A short answer: the page notes that it was cut at the limit.
            answer = page.locator(".assistant .answer").first
            expect(answer).not_to_be_empty(timeout=60_000)
            expect(page.locator("#send")).to_be_visible(timeout=120_000)
            page.screenshot(path=shot, full_page=True)
            first = answer.inner_text()
            assert first.strip(), "an answer rendered"
            expect(page.locator(".note")).to_contain_text("cut at its length limit")

            # A second message keeps the conversation; Stop ends a long answer.
            page.fill("#max", "")
            page.dispatch_event("#max", "change")
            page.fill("#prompt", "And God said")
            page.press("#prompt", "Enter")
            expect(page.locator(".assistant .answer").nth(1)).not_to_be_empty(timeout=60_000)
            page.click("#stop")
            expect(page.locator(".note").last).to_have_text("(stopped)")
            expect(page.locator("#send")).to_be_visible()
            page.click("#new")
            expect(page.locator(".msg")).to_have_count(0)
            new_chat_while_streaming(page)
            assert not outside, f"the page fetched {outside}"
            print(f"chat page: key, a streamed answer ({len(first)} characters), stop, new chat ok; screenshot {shot}")
        if len(sys.argv) > 4:
            with serve(cli, sys.argv[4]) as base:
                page, outside = open_page(browser, base)
                page.fill("#key", "sesame")
                page.dispatch_event("#key", "change")
                page.fill("#prompt", "Weather?")
                page.press("#prompt", "Enter")
                expect(page.locator("#send")).to_be_visible(timeout=60_000)
                details = page.locator(".assistant details")
                expect(details).to_have_count(1)
                assert details.get_attribute("open") is None, "thinking starts collapsed"
                assert "The user wants the weather." in details.inner_text() or details.locator("div").text_content()
                expect(page.locator(".assistant .answer")).to_contain_text("Let me check the weather.")
                assert not outside, f"the page fetched {outside}"
                print("chat page: thinking shown apart (collapsed) ok")
        browser.close()


if __name__ == "__main__":
    main()
