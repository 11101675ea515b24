"""The chat page's renderer under canned answers: Playwright's `page.route` answers
/v1/chat/completions with an SSE stream written here, so the model under test is the page
itself. Markdown renders into the right elements and a code block's Copy button copies; the
prompt's progress and the answer's figures show; and hostile model outputs (HTML and markdown
injection of every kind we know) run no script and leave no active element: a sentinel
function (`pwn`, exposed by Playwright) and `alert` dialogs would record any execution, and the
rendered DOM is checked against the renderer's allowlist of tags and attributes. Used by
chat_page_test.py."""

import json
import random

from playwright.sync_api import expect

# Elements the renderer may create in an assistant message (its own chrome included).
ALLOWED = {
    "DIV", "P", "H1", "H2", "H3", "H4", "H5", "H6", "STRONG", "EM", "DEL", "CODE", "PRE", "BR", "A", "UL",
    "OL", "LI", "BLOCKQUOTE", "HR", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "SPAN", "BUTTON", "DETAILS",
    "SUMMARY", "PROGRESS",
}
ALLOWED_ATTRS = {"class", "href", "target", "rel", "type", "start", "data-index", "open", "max", "value"}

# (name, reasoning, content pieces): each answer streamed in pieces, as a model would.
HOSTILE = [
    ("script tag", "", ["<script>pwn(1);alert(1)</script>"]),
    ("img onerror", "", ['<img src=x onerror="pwn(2);alert(2)">']),
    ("svg onload", "", ['<svg onload="pwn(3)"><circle r=5 /></svg><svg><script>pwn(3)</script></svg>']),
    ("javascript: link", "", ["[click me](javascript:pwn(4))", " [again](javascript:alert(4))"]),
    ("data: link", "", ["[x](data:text/html,<script>pwn(5)</script>) [y](data:text/html;base64,PHNjcmlwdD5wd24oNSk8L3NjcmlwdD4=)"]),
    ("iframes", "", ['<iframe src="javascript:pwn(6)"></iframe><iframe srcdoc="<script>parent.pwn(6)</script>"></iframe>']),
    ("style injection", "", ["<style>body{background:url(javascript:pwn(7))} *{display:none}</style>",
                             '<div style="background-image:url(javascript:pwn(7))">styled</div>']),
    ("event attributes", "", ['<a href="#" onclick="pwn(8)" onmouseover="pwn(8)">hover</a> <body onload=pwn(8)>',
                              '<details open ontoggle=pwn(8)><summary>x</summary></details>']),
    ("entity tricks", "", ["&lt;script&gt;pwn(9)&lt;/script&gt; &#60;img src=x onerror=pwn(9)&#62; ",
                           "[x](&#106;avascript:pwn(9)) [y](javascript&colon;pwn(9)) <img src=x onerror=&#112;wn(9)>"]),
    ("nested fences with html", "", ["````md\n```html\n<script>pwn(10)</script>\n```\n<img src=x onerror=pwn(10)>\n````\n",
                                     "```\n<svg onload=pwn(10)>\n``` trailing\n"]),
    ("tags in link text", "", ["[<img src=x onerror=pwn(11)>](https://example.com/a) ",
                               "[**<script>pwn(11)</script>**](https://example.com/b) [[inner](javascript:pwn(11))](https://example.com/c)"]),
    ("autolinks", "", ["<javascript:pwn(12)> <data:text/html;base64,PHNjcmlwdD5wd24oMTIpPC9zY3JpcHQ+> ",
                       '<https://example.com/"onmouseover="pwn(12)> https://example.com/x"onmouseover="pwn(12) <vbscript:pwn(12)>']),
    ("raw html block", "", ["<div>\n<p>block</p>\n<button onclick=pwn(13) autofocus onfocus=pwn(13)>b</button>\n</div>\n",
                            "<form action=javascript:pwn(13)><input type=submit></form>"]),
    ("closing code tags", "", ["`</code><script>pwn(14)</script>` and\n```\n</code></pre><script>pwn(14)</script>\n```\n",
                               "``</code><img src=x onerror=pwn(14)>``"]),
    ("mXSS", "", ['<noscript><p title="</noscript><img src=x onerror=pwn(15)>">',
                  "<math><mtext><table><mglyph><style><img src=x onerror=pwn(15)>",
                  '<svg></p><style><a id="</style><img src=1 onerror=pwn(15)>">']),
    ("markdown images", "", ["![x](javascript:pwn(16)) ![y](https://example.invalid/x.png\" onerror=\"pwn(16)) ",
                             "![z](data:image/svg+xml,<svg onload=pwn(16)>)"]),
    ("scheme obfuscation", "", ["[a](JaVaScRiPt:pwn(17)) [b]( javascript:pwn(17)) [c](java\tscript:pwn(17)) ",
                                "[d](vbscript:pwn(17)) [e](//evil.example/x) [f](\\u006aavascript:pwn(17))"]),
    ("object embed base meta", "", ['<object data="javascript:pwn(18)"></object><embed src="javascript:pwn(18)">',
                                    '<base href="javascript:pwn(18)//"><meta http-equiv="refresh" content="0;url=javascript:pwn(18)">',
                                    "<link rel=stylesheet href=data:text/css,*{x:y}>"]),
    ("html in tables, headings, lists", "", [
        "# <script>pwn(19)</script>\n> <img src=x onerror=pwn(19)>\n- <svg/onload=pwn(19)>\n\n",
        "| <img src=x onerror=pwn(19)> | a |\n|---|---|\n| <script>pwn(19)</script> | [x](javascript:pwn(19)) |\n"]),
    ("split across deltas", "", ["<scr", "ipt>pwn(20)</scr", "ipt> <img sr", "c=x oner", "ror=pwn(20)>"]),
    ("hostile thinking", "<img src=x onerror=pwn(21)><script>pwn(21)</script>", ["[ok](https://example.com/ok)"]),
    ("slow patterns", "", ["ok # a" + " " * 20000 + "b\n# c" + " " * 20000 + "#x\nhttps://a." + "." * 20000 + "x ",
                           "*a " * 4000 + "`" * 3000 + "\n" + "[" * 3000 + "\n" + "<a" * 3000]),
    ("unicode and template tricks", "", ["\u003cimg src=x onerror=pwn(22)\u003e ＜script＞pwn(22)＜/script＞ ",
                                        "${alert(22)} {{constructor.constructor('pwn(22)')()}} <scr\u0000ipt>pwn(22)</script>"]),
]


def sse(content, reasoning="", progress=None, usage=None, finish="stop"):
    """A canned chat completion stream."""
    base = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 1, "model": "default"}
    chunks = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for p in progress or []:
        chunks.append(dict(base, choices=[], prompt_progress=p))
    if reasoning:
        chunks.append(dict(base, choices=[{"index": 0, "delta": {"reasoning_content": reasoning}, "finish_reason": None}]))
    for piece in content:
        chunks.append(dict(base, choices=[{"index": 0, "delta": {"content": piece}, "finish_reason": None}]))
    chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
    if usage:
        chunks.append(dict(base, choices=[], usage=usage))
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


class Canned:
    """Answers the page's chat completions with `self.body`."""

    def __init__(self, page, base):
        self.body = sse(["nothing yet"])
        self.requests = []
        page.route(base + "/v1/chat/completions", self.fulfill)

    def fulfill(self, route):
        self.requests.append(json.loads(route.request.post_data))
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=self.body)


def ask(page, text):
    page.click("#new")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    expect(page.locator(".assistant .actions")).to_have_count(1, timeout=30_000)


BAD_DOM = """() => {
  const allowed = new Set(%s), attrs = new Set(%s), bad = [];
  for (const e of document.querySelectorAll("#log .assistant, #log .assistant *")) {
    if (!allowed.has(e.tagName)) bad.push("element " + e.tagName);
    for (const a of e.attributes) {
      if (!attrs.has(a.name) || a.name.startsWith("on")) bad.push(e.tagName + " attribute " + a.name);
      if (a.name === "href" && !/^https?:\\/\\//i.test(a.value)) bad.push("href " + a.value);
    }
  }
  for (const e of document.querySelectorAll("#log script, #log iframe, #log object, #log embed, #log [style], #log [srcdoc]"))
    bad.push("in the log: " + e.tagName);
  for (const a of document.querySelectorAll("a[href]")) if (/^\\s*(javascript|data|vbscript):/i.test(a.href)) bad.push("link " + a.href);
  const scripts = [...document.scripts].map((s) => s.src);
  if (scripts.length !== 6 || scripts.some((s) => !s.startsWith(location.origin + "/"))) bad.push("scripts " + scripts);
  return bad;
}""" % (json.dumps(sorted(ALLOWED)), json.dumps(sorted(ALLOWED_ATTRS)))


def hostile(page, base):
    """Every hostile output: no script runs, no dialog opens, nothing active is rendered."""
    hits, dialogs = [], []
    page.expose_function("pwn", lambda n: hits.append(n))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    canned = Canned(page, base)
    # The checks can see what they look for: the sentinel records a call, and the DOM check
    # reports an element it forbids put into an answer.
    page.evaluate("pwn(-1)")
    page.wait_for_timeout(100)
    assert hits == [-1], hits
    hits.clear()
    ask(page, "canary")
    # Trusted Types (the page's policy) refuse even to set an event attribute from script.
    refused = page.evaluate("""() => {
      try { document.createElement("img").setAttribute("onerror", "pwn(-2)"); return false; } catch (e) { return e instanceof TypeError; }
    }""")
    assert refused, "an event attribute could be set"
    page.evaluate("""() => {
      const frame = document.createElement("iframe");
      frame.className = "x";
      document.querySelector("#log .assistant .answer").appendChild(frame);
    }""")
    assert page.evaluate(BAD_DOM) == ["element IFRAME", "in the log: IFRAME"], page.evaluate(BAD_DOM)
    page.evaluate("document.querySelector('#log iframe').remove()")
    assert not hits
    for name, reasoning, pieces in HOSTILE:
        canned.body = sse(pieces, reasoning)
        ask(page, f"hostile: {name}")
        page.wait_for_timeout(150)  # time for any onerror/onload to fire
        bad = page.evaluate(BAD_DOM)
        assert not bad, f"{name}: {bad}"
        assert not hits and not dialogs, f"{name}: script ran ({hits}, dialogs {dialogs})"
        shown = page.locator(".assistant").inner_text()
        assert "pwn(" in shown or "ok" in shown, f"{name}: the payload is not shown as text: {shown!r}"
    # Raw HTML stays visible as the text it is.
    canned.body = sse(["<script>pwn(99)</script> <b>bold?</b>"])
    ask(page, "visible")
    expect(page.locator(".assistant .answer")).to_have_text("<script>pwn(99)</script> <b>bold?</b>")
    assert not hits and not dialogs
    print(f"chat page: {len(HOSTILE)} hostile outputs ran no script and rendered nothing active")


MARKDOWN = """## A heading

Some **bold**, *italic*, ~~gone~~ and `inline <code>` text with a [link](https://example.com/docs "t").
Also ***both*** and *it **nested** it* in snake_case_name.

```python
def f(x):
    return "<b>" + x
```

- one
- two with `code`
  - nested

1. first
2. second

> quoted **text**

| name | value |
|:-----|------:|
| a    | 1     |

---
plain https://example.org/path. end"""

CODE = 'def f(x):\n    return "<b>" + x'


def markdown(page, base, shot=None):
    """Markdown renders into elements; a code block's Copy button copies its code."""
    canned = Canned(page, base)
    usage = {"prompt_tokens": 24, "completion_tokens": 131, "total_tokens": 155, "prompt_tokens_details": {"cached_tokens": 0}}
    steps = [{"total": 24, "cache": 0, "processed": 24, "time_ms": 50}]
    canned.body = sse([MARKDOWN[:60], MARKDOWN[60:200], MARKDOWN[200:]], progress=steps, usage=usage)
    ask(page, "show markdown")
    a = page.locator(".assistant .answer")
    expect(a.locator("h2")).to_have_text("A heading")
    expect(a.locator("p strong").first).to_have_text("bold")
    expect(a.locator("em").first).to_have_text("italic")
    expect(a.locator("del")).to_have_text("gone")
    expect(a.locator("strong > em")).to_have_text("both")
    expect(a.locator("em > strong")).to_have_text("nested")
    expect(a.locator("p").first).to_contain_text("in snake_case_name.")
    expect(a.locator("p code").first).to_have_text("inline <code>")
    link = a.locator('a[href="https://example.com/docs"]')
    expect(link).to_have_text("link")
    assert link.get_attribute("rel") == "noopener noreferrer" and link.get_attribute("target") == "_blank"
    expect(a.locator(".code .code-lang")).to_have_text("python")
    expect(a.locator(".code pre code")).to_have_text(CODE)
    expect(a.locator(":scope > ul > li")).to_have_count(2)
    expect(a.locator("ul ul > li")).to_have_text("nested")
    expect(a.locator("ol > li")).to_have_count(2)
    expect(a.locator("blockquote strong")).to_have_text("text")
    expect(a.locator("table th.al-right")).to_have_text("value")
    expect(a.locator("table td")).to_have_count(2)
    expect(a.locator("hr")).to_have_count(1)
    expect(a.locator('a[href="https://example.org/path"]')).to_have_text("https://example.org/path")
    page.click(".code .copy")
    expect(page.locator(".code .copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    if shot:
        page.screenshot(path=shot, full_page=True)
    print("chat page: markdown (heading, emphasis, code, fenced code with Copy, lists, quote, table, links) ok")


def copy_fallback(page, base):
    """Without the clipboard API (a page not served from a secure context), Copy selects and
    copies the code through the document instead."""
    page.add_init_script("Object.defineProperty(Navigator.prototype, 'clipboard', { get: () => undefined })")
    page.reload()
    canned = Canned(page, base)
    canned.body = sse(["```\n" + CODE + "\n```"])
    ask(page, "copy without the clipboard API")
    page.click(".code .copy")
    expect(page.locator(".code .copy")).to_have_text("Copied")
    assert page.evaluate("document.querySelectorAll('textarea.offscreen').length") == 0
    print("chat page: Copy without the clipboard API (execCommand) ok")


def progress(page, base):
    """The prompt's progress shows while it is read; the answer's figures after."""
    canned = Canned(page, base)
    steps = [{"total": 120, "cache": 100, "processed": 100, "time_ms": 0},
             {"total": 120, "cache": 100, "processed": 120, "time_ms": 500}]
    usage = {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123, "prompt_tokens_details": {"cached_tokens": 100}}
    canned.body = sse(["one ", "two ", "three"], progress=steps, usage=usage)
    watch_progress(page)
    ask(page, "progress please")
    seen = page.evaluate("window.__progress")
    assert "Reading the prompt: 100 / 120 tokens (100 cached)" in seen, seen
    expect(page.locator(".assistant .meta")).to_contain_text("3 tokens")
    expect(page.locator(".assistant .meta")).to_contain_text("prompt 120 tokens, 100 cached, 20 read in 0.50 s (40.0 tok/s)")
    print("chat page: prompt progress shown while read, its figures after ok")


def watch_progress(page):
    """Records every progress line the page shows (they may be replaced within milliseconds)."""
    page.evaluate("""() => {
      window.__progress = [];
      new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes)
          if (n.nodeType === 1) for (const p of [n, ...n.querySelectorAll('.progress')])
            if (p.classList && p.classList.contains('progress')) window.__progress.push(p.textContent);
      }).observe(document.getElementById('log'), { childList: true, subtree: true });
    }""")


# Fills the origin's storage (in ever smaller pieces, to the last kilobyte), then frees the
# first piece: 256K characters of room.
FILL_STORAGE = """() => {
  let i = 0;
  for (const size of [1 << 18, 1 << 14, 1 << 10]) {
    const chunk = "x".repeat(size);
    try { for (;; i++) localStorage.setItem("filler-" + i, chunk); } catch (e) { i++; }
  }
  localStorage.removeItem("filler-0");
  return i;
}"""


def full_storage(page, base):
    """A full store drops the oldest conversation, says so, and keeps the current one."""
    canned = Canned(page, base)
    filled = page.evaluate(FILL_STORAGE)
    assert filled > 1, filled
    for n in range(1, 4):
        canned.body = sse([f"answer {n} " + "y" * 100_000])
        ask(page, f"conversation {n}")
    expect(page.locator("#storage")).to_contain_text("1 old conversation(s) dropped")
    expect(page.locator(".conversation")).to_have_count(2)
    titles = page.evaluate("JSON.parse(localStorage.getItem('k3-conversations')).map((c) => c.title)")
    assert titles == ["conversation 3", "conversation 2"], titles
    print("chat page: a full store drops the oldest conversation and says so ok")


FRAGMENTS = [
    "<script>pwn(1)</script>", "<img src=x onerror=pwn(2)>", "<svg onload=pwn(3)>", "javascript:pwn(4)",
    "data:text/html,<script>pwn(5)</script>", "[", "]", "(", ")", "![", "<", ">", "`", "```", "~~~", "*", "**",
    "_", "__", "~~", "\\", "\n", "\n\n", "# ", "> ", "- ", "1. ", "| a | b |\n|---|---|\n", "&lt;", "&#x3c;",
    "https://example.com/x", "http://a.b/<c>", "<https://e.com>", "<javascript:pwn(6)>", "\"", "'", " onmouseover=pwn(7) ",
    "<a href=\"javascript:pwn(8)\">", "</a>", "<iframe srcdoc=x>", "<style>", "</code>", "</pre>", "text", " ",
]

FUZZ_CHECK = """(inputs) => {
  const allowed = new Set(%s), attrs = new Set(%s), bad = [];
  for (const text of inputs) {
    const box = document.createElement("div");
    box.appendChild(K3Markdown.render(text));
    for (const e of box.querySelectorAll("*")) {
      if (!allowed.has(e.tagName)) bad.push([text, "element " + e.tagName]);
      for (const a of e.attributes) {
        if (!attrs.has(a.name)) bad.push([text, "attribute " + a.name]);
        if (a.name === "href" && !/^https?:\\/\\//i.test(a.value)) bad.push([text, "href " + a.value]);
      }
    }
  }
  return bad.slice(0, 5);
}""" % (json.dumps(sorted(ALLOWED)), json.dumps(sorted(ALLOWED_ATTRS)))


def fuzz(page, base, count=2000):
    """Random mixes of markdown and HTML pieces through the renderer itself: every element and
    attribute it makes is on its allowlist, every link http(s), and nothing runs."""
    hits, dialogs = [], []
    page.expose_function("pwn", lambda n: hits.append(n))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    rng = random.Random(60)
    inputs = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 30))) for _ in range(count)]
    bad = page.evaluate(FUZZ_CHECK, inputs)
    page.wait_for_timeout(200)
    assert not bad, bad
    assert not hits and not dialogs, (hits, dialogs)
    print(f"chat page: {count} random markdown/HTML mixes rendered only allowed elements and http(s) links ok")
