"use strict";
// The chat page's side of /v1/chat/completions: the request body a conversation and the
// settings make, and the SSE stream read back into callbacks.
const K3Stream = (() => {
  const posInt = (v) => { const n = parseInt(v, 10); return n > 0 ? n : null; };
  const num = (v) => (v === "" || v === null || !Number.isFinite(Number(v)) ? undefined : Number(v));

  // Only K3's chat format has a thinking switch on this route (`reasoning_effort`: low, high,
  // max, or none to turn it off); other families refuse it.
  const switchable = (model) => model.family === "kimi_k3";

  // The thinking budget sent (`thinking_budget`: at most that many tokens of thinking, then the
  // model answers), while K3 thinks; none when the setting is empty or 0.
  function thinkingBudget(settings, model) {
    return switchable(model) && settings.thinking ? posInt(settings.allowance) : null;
  }

  // The request's max_tokens. The server counts thinking inside max_tokens (OpenAI's meaning),
  // so with a thinking budget it is the answer's tokens plus the budget: the answer always
  // gets its share, whatever the thinking takes of its own.
  function maxTokens(settings, model) {
    const answer = posInt(settings.max_answer);
    if (answer === null) return undefined;
    return answer + (thinkingBudget(settings, model) || 0);
  }

  function apiMessage(m, vision) {
    if (m.role === "assistant") return { role: "assistant", content: m.text };
    if (!vision || !m.images.length) return { role: "user", content: m.text };
    const parts = m.text ? [{ type: "text", text: m.text }] : [];
    for (const url of m.images) parts.push({ type: "image_url", image_url: { url } });
    return { role: "user", content: parts };
  }

  function body(messages, settings, model) {
    const api = [];
    if (settings.system.trim()) api.push({ role: "system", content: settings.system });
    // An answer that failed or was stopped before any text is no turn of the conversation.
    for (const m of messages) if (m.role === "user" || m.text) api.push(apiMessage(m, model.vision));
    const b = {
      model: model.id || undefined, messages: api, stream: true,
      stream_options: { include_usage: true }, return_progress: true,
      temperature: num(settings.temperature), top_p: num(settings.top_p), max_tokens: maxTokens(settings, model),
    };
    if (switchable(model)) b.reasoning_effort = settings.thinking ? settings.effort : "none";
    const budget = thinkingBudget(settings, model);
    if (budget !== null) b.thinking_budget = budget;
    return b;
  }

  // Reads an SSE response, calling on.progress(prompt_progress, at), on.delta({content,
  // reasoning}, at), on.finish(reason), on.usage(usage); an error chunk throws. `at` is when
  // the network read that brought the chunk returned (chunks read together share it).
  async function read(response, on) {
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "", at = 0;
    const handle = (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server failed");
      if (chunk.prompt_progress) on.progress(chunk.prompt_progress, at);
      if (chunk.usage) on.usage(chunk.usage);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      if (d.reasoning_content || d.content) on.delta({ content: d.content || "", reasoning: d.reasoning_content || "" }, at);
      if (choice.finish_reason) on.finish(choice.finish_reason);
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      at = performance.now();
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) if (line.startsWith("data:")) handle(line.slice(5).trim());
      }
    }
  }

  return { body, read, switchable, maxTokens, thinkingBudget };
})();
