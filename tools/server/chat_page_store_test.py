"""The chat page's model picker in headless Chromium, against `k3-cli serve` without `--model`
(every model in the store and the built-in `default`, each loaded when asked for), its store a
scratch `K3_DATA_DIR` holding two models converted here: the tiny K3 with its vision tower
(`tiny-k3`: reads images, thinks) and the scripted tool caller (`caller`: neither). Checks:

- the picker lists both stored models and `default`, the first preselected;
- choosing tiny-k3 shows the image button and the thinking switch, choosing another hides them;
- a message sent with each model is answered, its request naming that model (tiny-k3's with
  its thinking budget), the answer's status saying the model loads while it does;
- the choice survives a reload (the conversation shown is shown again, with its model); each
  conversation brings back its own model when switched to;
- the page fetches nothing but this server.

    python tools/server/chat_page_store_test.py target/debug/k3-cli TOOL_CALLER fixtures/golden/tiny-k3-vision [SHOT.png]

Run by .ci/run next to chat_page_test.py when Chromium is installed (or installable).
"""

import sys
import tempfile

from playwright.sync_api import expect, sync_playwright

from chat_page_test import Page, launch, panel, send, setting
from k3serve import k3, serve

# Records every status line an answer shows (each may be replaced within milliseconds).
WATCH_STATUS = """() => {
  window.__status = [];
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes)
      if (n.nodeType === 1) for (const m of [n, ...n.querySelectorAll('.meta')])
        if (m.classList && m.classList.contains('meta')) window.__status.push(m.textContent);
  }).observe(document.getElementById('log'), { childList: true, subtree: true });
}"""


def store(cli, caller, vision, data):
    """Converts the two models into the store at `data`."""
    for source, name in [(vision, "tiny-k3"), (caller, "caller")]:
        k3(cli, data, "convert", "--hf", source, "--name", name)


def options(page):
    return page.eval_on_selector("#model-pick", "(s) => [...s.options].map((o) => o.value)")


def follows(page, sees):
    """The image button and the thinking switch are shown for a model that reads images and
    thinks (tiny-k3), hidden for one that does neither."""
    for sel in ["#attach", "#vision"]:
        (expect(page.locator(sel)).to_be_visible if sees else expect(page.locator(sel)).to_be_hidden)()
    panel(page, True)
    (expect(page.locator("#thinking")).to_be_visible if sees else expect(page.locator("#thinking")).to_be_hidden)()
    (expect(page.locator("#budget")).to_be_visible if sees else expect(page.locator("#budget")).to_be_hidden)()
    panel(page, False)


def answered_by(p, model, text):
    """Sends `text`; the request named `model`, and the answer came while the status first said
    the model was loading."""
    page = p.page
    page.evaluate("window.__status = []")
    send(page, text)
    body = p.sent[-1]
    assert body["model"] == model, body
    expect(page.locator(".assistant .answer").last).not_to_be_empty()
    expect(page.locator(".assistant .error")).to_have_count(0)
    status = page.evaluate("window.__status")
    assert status and status[0] == f"Loading {model}…", status
    return body


def picker(p, shot):
    page = p.page
    picker = page.locator("#model-pick")
    expect(picker).to_be_visible()
    expect(page.locator("#model")).to_be_hidden()
    assert options(page) == ["caller", "tiny-k3", "default"], options(page)
    # Nothing is loaded yet and nothing was chosen before: the first.
    expect(picker).to_have_value("caller")
    follows(page, False)
    page.evaluate(WATCH_STATUS)

    page.click("#new")
    picker.select_option("tiny-k3")
    follows(page, True)
    setting(page, "#max", "30")
    setting(page, "#budget", "4")
    page.check("#thinking")
    panel(page, False)
    body = answered_by(p, "tiny-k3", "Think about a picture")
    assert (body["thinking_budget"], body["max_tokens"], body["reasoning_effort"]) == (4, 34, "max"), body
    expect(page.locator(".assistant details")).to_have_count(1)
    if shot:
        page.screenshot(path=shot)

    page.click("#new")
    picker.select_option("caller")
    follows(page, False)
    body = answered_by(p, "caller", "Weather?")
    assert "thinking_budget" not in body and "reasoning_effort" not in body, body
    expect(page.locator(".assistant .answer")).to_contain_text("Let me check the weather.")
    print("chat page (store): the picker lists the store and default; images and thinking follow the model; "
          "each answer from the model chosen, loaded on demand ok")

    # The choice survives a reload; a conversation brings back its model, and is shown again
    # after a reload with it.
    page.reload()
    expect(picker).to_have_value("caller")
    follows(page, False)
    page.click(".conversation .open >> text=Think about a picture")
    expect(picker).to_have_value("tiny-k3")
    follows(page, True)
    page.reload()
    expect(page.locator(".conversation.current")).to_contain_text("Think about a picture")
    expect(picker).to_have_value("tiny-k3")
    page.click(".conversation .open >> text=Weather?")
    expect(picker).to_have_value("caller")

    page.evaluate(WATCH_STATUS)
    page.click("#new")
    picker.select_option("default")
    follows(page, False)
    answered_by(p, "default", "In the beginning")
    expect(page.locator("#model-pick option[value=default]")).to_have_text("default (loaded)")
    page.reload()
    expect(picker).to_have_value("default")
    # Picked in a conversation without sending: still its model after a reload.
    picker.select_option("tiny-k3")
    page.reload()
    expect(picker).to_have_value("tiny-k3")
    expect(page.locator(".conversation.current")).to_contain_text("In the beginning")
    # A new chat keeps the model chosen last.
    page.click("#new")
    expect(picker).to_have_value("tiny-k3")
    page.reload()
    expect(page.locator(".msg")).to_have_count(0)
    expect(picker).to_have_value("tiny-k3")
    print("chat page (store): the choice kept over a reload, each conversation's model restored, default answered ok")


def main() -> None:
    cli, caller, vision = sys.argv[1], sys.argv[2], sys.argv[3]
    shot = sys.argv[4] if len(sys.argv) > 4 else None
    with tempfile.TemporaryDirectory() as data:
        store(cli, caller, vision, data)
        with sync_playwright() as pw:
            browser = launch(pw)
            with serve(cli, None, env={"K3_DATA_DIR": data}) as base:
                p = Page(browser, base)
                picker(p, shot)
                p.close()
            browser.close()


if __name__ == "__main__":
    main()
