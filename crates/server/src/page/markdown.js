"use strict";
// Markdown into DOM nodes for the chat page. Model text is untrusted: every node is made with
// createElement from a fixed set of tags and every piece of text goes in with createTextNode,
// so no markup the model writes (HTML, scripts, event attributes) ever becomes live. The only
// attribute taken from the text is a link's href, and only an http(s) URL as the URL parser
// reads it; anything else (javascript:, data:, relative) stays visible as text. Images in the
// text are never loaded (the page's policy forbids other origins anyway): they show as links.
const K3Markdown = (() => {
  const MAX_DEPTH = 12;
  const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+|$)/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])(?:[ \t]+(.*)|$)/;
  const TABLE_RULE = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
  const PUNCT = /[!-/:-@[-`{-~]/;
  // Sticky patterns, matched where the inline scan is (no copies of the rest of the text).
  const AUTOLINK = /<([a-zA-Z][a-zA-Z0-9+.-]{1,31}:[^\s<>]*)>/y;
  const BARE_URL = /https?:\/\/[^\s<>"]+/iy;
  const TRAILING = ".,;:!?)]'*_~";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.appendChild(document.createTextNode(text));
    return e;
  }

  // The URL a link may point to: an absolute http(s) URL, normalised by the parser; else null.
  function safeUrl(raw) {
    try {
      const u = new URL(raw.trim());
      return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
    } catch {
      return null;
    }
  }

  function link(href, children) {
    const a = el("a");
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    a.append(...children);
    return a;
  }

  // ---- inline ----

  // The length of the run of `c` at `i`.
  function run(s, i, c) {
    let j = i;
    while (s[j] === c) j++;
    return j - i;
  }

  function sticky(re, s, i) {
    re.lastIndex = i;
    return re.exec(s);
  }

  // A heading's text: after its marks, without a closing run of #s.
  function headingText(line, marks) {
    let t = line.slice(marks).trim();
    let end = t.length;
    while (end > 0 && t[end - 1] === "#") end--;
    if (end === 0) return "";
    if (end < t.length && (t[end - 1] === " " || t[end - 1] === "\t")) t = t.slice(0, end).trimEnd();
    return t;
  }

  // The end of a `[...]` starting at `open`, brackets nested, or -1.
  function closeBracket(s, open) {
    let depth = 0;
    for (let i = open; i < s.length; i++) {
      if (s[i] === "\\") i++;
      else if (s[i] === "`") {
        const ticks = "`".repeat(run(s, i, "`"));
        const end = s.indexOf(ticks, i + ticks.length);
        i = end > 0 ? end + ticks.length - 1 : i + ticks.length - 1;
      } else if (s[i] === "[") depth++;
      else if (s[i] === "]" && --depth === 0) return i;
    }
    return -1;
  }

  // `(url "title")` right after a link's text: [url, end index after `)`] or null.
  function destination(s, at) {
    const m = s.slice(at).match(/^\(\s*<?([^\s<>()]*(?:\([^\s()]*\)[^\s<>()]*)*)>?(?:\s+"[^"]*")?\s*\)/);
    return m ? [m[1], at + m[0].length] : null;
  }

  // Emphasis: a run of `*` or `_` (1 em, 2 strong, 3 both) or `~~` (del), closed by the next
  // run of the same character and length; runs of other lengths are nested emphasis, skipped
  // whole. A closing run must not follow a space; `_` must not be inside a word. The index
  // after the closing run, or -1 (the caller then takes the opening run as text).
  function emphasis(s, i, out, depth) {
    const c = s[i], len = run(s, i, c);
    if ((c === "~" && len !== 2) || len > 3 || /\s/.test(s[i + len] || " ")) return -1;
    if (c === "_" && i > 0 && /[\p{L}\p{N}]/u.test(s[i - 1])) return -1;
    for (let end = s.indexOf(c, i + len); end > 0; end = s.indexOf(c, end)) {
      const n = run(s, end, c);
      const after = s[end + n] || " ";
      if (n !== len || s[end - 1] === "\\" || /\s/.test(s[end - 1]) || (c === "_" && /[\p{L}\p{N}]/u.test(after))) {
        end += n;
        continue;
      }
      const outer = el(c === "~" ? "del" : len === 1 ? "em" : "strong");
      const inner = len === 3 ? outer.appendChild(el("em")) : outer;
      inline(s.slice(i + len, end), inner, depth + 1);
      out.appendChild(outer);
      return end + n;
    }
    return -1;
  }

  // Appends `s` as inline nodes to `out`: code spans, links, emphasis, line breaks, text.
  function inline(s, out, depth = 0, inLink = false) {
    let text = "";
    const flush = () => { if (text) out.appendChild(document.createTextNode(text)); text = ""; };
    if (depth > MAX_DEPTH) { out.appendChild(document.createTextNode(s)); return; }
    for (let i = 0; i < s.length;) {
      const c = s[i];
      if (c === "\\" && PUNCT.test(s[i + 1] || "")) { text += s[i + 1]; i += 2; continue; }
      if (c === "\n") { flush(); out.appendChild(el("br")); i++; continue; }
      if (c === "`") {
        const ticks = "`".repeat(run(s, i, "`"));
        const end = s.indexOf(ticks, i + ticks.length);
        if (end > 0 && s[end + ticks.length] !== "`") {
          let code = s.slice(i + ticks.length, end).replace(/\n/g, " ");
          if (code.length > 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) code = code.slice(1, -1);
          flush();
          out.appendChild(el("code", "", code));
          i = end + ticks.length;
          continue;
        }
        text += ticks; i += ticks.length; continue;
      }
      if (!inLink && (c === "[" || (c === "!" && s[i + 1] === "["))) {
        const open = c === "!" ? i + 1 : i;
        const close = closeBracket(s, open);
        const dest = close > 0 ? destination(s, close + 1) : null;
        if (dest) {
          const href = safeUrl(dest[0]);
          const label = s.slice(open + 1, close);
          flush();
          if (href && c === "!") out.appendChild(link(href, [document.createTextNode("image: " + (label || href))]));
          else if (href) { const a = link(href, []); inline(label, a, depth + 1, true); out.appendChild(a); }
          else out.appendChild(document.createTextNode(s.slice(i, dest[1])));
          i = dest[1];
          continue;
        }
      }
      if (c === "<") {
        const m = sticky(AUTOLINK, s, i);
        const href = m && !inLink ? safeUrl(m[1]) : null;
        if (href) { flush(); out.appendChild(link(href, [document.createTextNode(m[1])])); i += m[0].length; continue; }
      }
      if (!inLink && (c === "h" || c === "H") && (i === 0 || /[\s(]/.test(s[i - 1]))) {
        const m = sticky(BARE_URL, s, i);
        let raw = m && m[0];
        const balanced = (u) => u.split("(").length >= u.split(")").length;
        while (raw && TRAILING.includes(raw[raw.length - 1]) && !(raw.endsWith(")") && balanced(raw))) raw = raw.slice(0, -1);
        const href = raw ? safeUrl(raw) : null;
        if (href) { flush(); out.appendChild(link(href, [document.createTextNode(raw)])); i += raw.length; continue; }
      }
      if (c === "*" || c === "_" || c === "~") {
        flush();
        const next = emphasis(s, i, out, depth);
        if (next > 0) { i = next; continue; }
        const len = run(s, i, c);
        text += c.repeat(len); i += len; continue;
      }
      text += c; i++;
    }
    flush();
  }

  // ---- blocks ----

  function isBlockStart(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  function codeBlock(lines, i, out) {
    const [, fence, info] = lines[i].match(FENCE);
    const indent = lines[i].match(/^ */)[0].length;
    const body = [];
    let j = i + 1;
    const closes = new RegExp("^ {0,3}" + (fence[0] === "`" ? "`" : "~") + "{" + fence.length + ",}[ \\t]*$");
    for (; j < lines.length && !closes.test(lines[j]); j++) body.push(lines[j].replace(new RegExp("^ {0," + indent + "}"), ""));
    const box = el("div", "code");
    const bar = el("div", "code-bar");
    bar.appendChild(el("span", "code-lang", info.trim().split(/\s+/)[0] || "code"));
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    const code = body.join("\n");
    copy.addEventListener("click", () => K3Markdown.copy(code, copy));
    bar.appendChild(copy);
    const pre = el("pre");
    pre.appendChild(el("code", "", code));
    box.append(bar, pre);
    out.appendChild(box);
    return j + 1;
  }

  function cells(line) {
    let t = line.trim();
    if (t.startsWith("|")) t = t.slice(1);
    if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
    return t.split(/(?<!\\)\|/).map((c) => c.trim());
  }

  function table(lines, i, out, depth) {
    const head = cells(lines[i]);
    const align = cells(lines[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : "left"));
    const t = el("table");
    const row = (values, tag) => {
      const tr = el("tr");
      for (let k = 0; k < head.length; k++) {
        const cell = el(tag, "al-" + (align[k] || "left"));
        inline(values[k] || "", cell, depth + 1);
        tr.appendChild(cell);
      }
      return tr;
    };
    const thead = el("thead");
    thead.appendChild(row(head, "th"));
    const tbody = el("tbody");
    let j = i + 2;
    for (; j < lines.length && lines[j].trim() && lines[j].includes("|"); j++) tbody.appendChild(row(cells(lines[j]), "td"));
    t.append(thead, tbody);
    const wrap = el("div", "table");
    wrap.appendChild(t);
    out.appendChild(wrap);
    return j;
  }

  function list(lines, i, out, depth) {
    const first = lines[i].match(ITEM);
    const ordered = /\d/.test(first[2]);
    const base = first[1].length;
    const node = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = Math.min(parseInt(first[2], 10), 1e9);
    let j = i, loose = false;
    while (j < lines.length) {
      const m = lines[j].match(ITEM);
      if (!m || m[1].length !== base || /\d/.test(m[2]) !== ordered) break;
      const width = m[1].length + m[2].length + 1;
      const body = [m[3] || ""];
      j++;
      while (j < lines.length) {
        const line = lines[j];
        if (!line.trim()) {
          const next = lines[j + 1];
          if (next !== undefined && next.match(/^ */)[0].length >= width && next.trim()) { body.push(""); loose = true; j++; continue; }
          break;
        }
        const indent = line.match(/^ */)[0].length;
        if (indent >= width) { body.push(line.slice(width)); j++; continue; }
        if (ITEM.test(line) || (isBlockStart(line) && indent <= base)) break;
        body.push(line.trim()); j++;
      }
      const li = el("li");
      blocks(body, li, depth + 1, !loose);
      node.appendChild(li);
      if (j < lines.length && !lines[j].trim() && lines[j + 1] !== undefined && ITEM.test(lines[j + 1])) j++;
    }
    out.appendChild(node);
    return j;
  }

  // Renders `lines` as blocks into `out`; `tight`: a lone paragraph goes in without a <p>.
  function blocks(lines, out, depth, tight = false) {
    if (depth > MAX_DEPTH) { out.appendChild(el("p", "", lines.join("\n"))); return; }
    const start = out.childNodes.length;
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) { i++; continue; }
      if (FENCE.test(line) && !(line.trim()[0] === "`" && line.match(FENCE)[2].includes("`"))) { i = codeBlock(lines, i, out); continue; }
      let m = line.match(HEADING);
      if (m) { const h = el("h" + m[1].length); inline(headingText(line, m[0].length), h, depth); out.appendChild(h); i++; continue; }
      if (RULE.test(line)) { out.appendChild(el("hr")); i++; continue; }
      if (QUOTE.test(line)) {
        const inner = [];
        // A quote goes on over lines without `>` until a blank line or another block.
        for (; i < lines.length && lines[i].trim(); i++) {
          if ((m = lines[i].match(QUOTE))) inner.push(m[1]);
          else if (!isBlockStart(lines[i])) inner.push(lines[i]);
          else break;
        }
        const q = el("blockquote");
        blocks(inner, q, depth + 1);
        out.appendChild(q);
        continue;
      }
      if (ITEM.test(line) && line.match(ITEM)[1].length <= 3) { i = list(lines, i, out, depth); continue; }
      if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        i = table(lines, i, out, depth);
        continue;
      }
      const para = [line.trim()];
      for (i++; i < lines.length && lines[i].trim() && !isBlockStart(lines[i]); i++) para.push(lines[i].trim());
      const p = el("p");
      inline(para.join("\n"), p, depth);
      out.appendChild(p);
    }
    // A tight list item's paragraphs are its text, not spaced paragraphs.
    if (tight) for (const p of [...out.childNodes].slice(start)) if (p.nodeName === "P") p.replaceWith(...p.childNodes);
  }

  return {
    // An element with a class and text (never markup): the page's one way to make one.
    el,
    // A fragment of the rendered markdown of `text`.
    render(text) {
      const frag = document.createDocumentFragment();
      blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag, 0);
      return frag;
    },
    // Copies `text` (the clipboard API where the page is a secure context, else a selection),
    // saying so on `button`.
    async copy(text, button) {
      let ok = false;
      try {
        if (navigator.clipboard && window.isSecureContext) { await navigator.clipboard.writeText(text); ok = true; }
      } catch { ok = false; }
      if (!ok) {
        const area = el("textarea", "offscreen");
        area.value = text;
        document.body.appendChild(area);
        area.select();
        try { ok = document.execCommand("copy"); } catch { ok = false; }
        area.remove();
      }
      if (button) {
        button.textContent = ok ? "Copied" : "Copy failed";
        setTimeout(() => { button.textContent = "Copy"; }, 1500);
      }
      return ok;
    },
  };
})();
