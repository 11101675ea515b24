//! Kimi K3's XTML turns, as K3's template renders them (`Kimi-K3.jinja`, a rendering of K3's
//! Python encoder): an element is `<|open|>TAG ATTR="VALUE"...<|sep|>` BODY `<|close|>TAG<|sep|>`,
//! the tag, each ` ATTR`, `="`, each value and `"` their own text segments. Tools are declared in
//! a system message (`type="tool-declare"`, JSON with sorted keys), an assistant's calls follow its
//! response as `call` elements with typed `argument` children, results are `role="tool"` messages
//! matched to the calls by id. System notes carry the thinking effort, `tool_choice` and
//! `response_format`.

use crate::json_style::{json_type, object_entries, python_json, sorted_json};
use crate::message::{Call, ChatError, Message, PromptOptions, Role, ToolChoice, Writer};
use crate::tokenizer::TokenizerError;

const EFFORTS: [&str; 3] = ["low", "high", "max"];

impl Writer<'_> {
    /// `<|open|>TAG ATTR="VALUE"...<|sep|>`.
    fn xtml_open(&self, out: &mut Vec<u32>, tag: &str, attrs: &[(&str, &str)]) -> Result<(), TokenizerError> {
        out.push(self.special("<|open|>")?);
        out.extend(self.tok.encode(tag));
        for (key, value) in attrs {
            out.extend(self.tok.encode(&format!(" {key}")));
            out.extend(self.tok.encode("=\""));
            out.extend(self.tok.encode(&value.replace('&', "&amp;").replace('"', "&quot;")));
            out.extend(self.tok.encode("\""));
        }
        out.push(self.special("<|sep|>")?);
        Ok(())
    }

    /// `<|close|>TAG<|sep|>`.
    fn xtml_close(&self, out: &mut Vec<u32>, tag: &str) -> Result<(), TokenizerError> {
        out.push(self.special("<|close|>")?);
        out.extend(self.tok.encode(tag));
        out.push(self.special("<|sep|>")?);
        Ok(())
    }

    /// A whole message whose body is `text`.
    fn xtml_message(&self, out: &mut Vec<u32>, attrs: &[(&str, &str)], text: &str) -> Result<(), TokenizerError> {
        self.xtml_message_with(out, attrs, text, &[])
    }

    /// A message whose text has images at byte offsets `images`: the placeholder token there.
    fn xtml_message_with(
        &self,
        out: &mut Vec<u32>,
        attrs: &[(&str, &str)],
        text: &str,
        images: &[usize],
    ) -> Result<(), TokenizerError> {
        self.xtml_open(out, "message", attrs)?;
        let mut from = 0;
        for &at in images {
            out.extend(self.tok.encode(&text[from..at]));
            out.push(self.special(crate::message::IMAGE_PLACEHOLDER)?);
            from = at;
        }
        out.extend(self.tok.encode(&text[from..]));
        self.xtml_close(out, "message")?;
        out.push(self.special("<|end_of_msg|>")?);
        Ok(())
    }

    /// A note from the system (`type` names it).
    fn xtml_note(&self, out: &mut Vec<u32>, kind: &str, body: &str) -> Result<(), TokenizerError> {
        self.xtml_message(out, &[("role", "system"), ("type", kind)], body.trim())
    }

    pub(crate) fn xtml_prompt(&self, messages: &[Message], o: &PromptOptions<'_>) -> Result<Vec<u32>, ChatError> {
        let mut out = self.xtml_preamble(o)?;
        let mut calls: &[Call] = &[];
        let mut i = 0;
        while i < messages.len() {
            let m = &messages[i];
            if m.role == Role::Tool {
                let run = messages[i..].iter().take_while(|m| m.role == Role::Tool).count();
                self.xtml_results(&mut out, &messages[i..i + run], calls, i)?;
                i += run;
                continue;
            }
            if m.role == Role::Assistant {
                calls = &m.tool_calls;
            }
            out.extend(self.xtml_turn(m, o.think)?);
            i += 1;
        }
        match o.tool_choice {
            ToolChoice::Auto => {}
            ToolChoice::Required => self.xtml_note(
                &mut out,
                "tool-choice",
                "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
            )?,
            ToolChoice::None => self.xtml_note(
                &mut out,
                "tool-choice",
                "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
            )?,
        }
        const RAW: &str =
            "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
        if let Some(schema) = o.json_schema {
            let schema = sorted_json(schema)
                .map_err(|e| ChatError::invalid("response_format", format!("the schema is not valid JSON: {e}")))?;
            let body = format!(
                "The system is invoked with `response_format=json_schema`.\n{RAW}\nThe JSON data must match the \
                 following schema:\n```json\n{schema}\n```"
            );
            self.xtml_note(&mut out, "response-format", &body)?;
        } else if o.json_object {
            self.xtml_note(
                &mut out,
                "response-format",
                &format!("The system is invoked with `response_format=json_object`.\n{RAW}"),
            )?;
        }
        out.extend(self.xtml_generation_prompt(o.think)?);
        Ok(out)
    }

    /// Tool declarations, then the thinking effort when thinking.
    pub(crate) fn xtml_preamble(&self, o: &PromptOptions<'_>) -> Result<Vec<u32>, ChatError> {
        let mut out = Vec::new();
        if let Some(tools) = o.tools {
            let json = sorted_json(tools).map_err(|e| ChatError::invalid("tools", format!("not valid JSON: {e}")))?;
            let body =
                format!("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{json}\n```");
            self.xtml_open(&mut out, "message", &[("role", "system"), ("type", "tool-declare")])?;
            out.extend(self.tok.encode(&body));
            self.xtml_close(&mut out, "message")?;
            out.push(self.special("<|end_of_msg|>")?);
        }
        if let (true, Some(effort)) = (o.think, o.effort) {
            if !EFFORTS.contains(&effort) {
                return Err(ChatError::invalid(
                    "reasoning_effort",
                    format!("`{effort}`: K3 takes low, high or max (or thinking off)"),
                ));
            }
            let body = format!(
                "`thinking_effort` guides on how much to think in your thinking channel (not including the response \
                 channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked \
                 with `thinking_effort={effort}`."
            );
            self.xtml_note(&mut out, "thinking-effort", &body)?;
        }
        Ok(out)
    }

    pub(crate) fn xtml_generation_prompt(&self, think: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        self.xtml_open(&mut out, "message", &[("role", "assistant")])?;
        self.xtml_open(&mut out, if think { "think" } else { "response" }, &[])?;
        Ok(out)
    }

    /// A system, user or assistant message (an assistant's in its channels, with its calls).
    pub(crate) fn xtml_turn(&self, m: &Message, think: bool) -> Result<Vec<u32>, ChatError> {
        let mut out = Vec::new();
        let mut attrs = vec![("role", m.role.name())];
        if let Some(name) = m.name.as_deref().filter(|n| !n.is_empty()) {
            attrs.push(("name", name));
        }
        match m.role {
            Role::System | Role::User => self.xtml_message_with(&mut out, &attrs, &m.content, &m.images)?,
            Role::Assistant => {
                self.xtml_open(&mut out, "message", &attrs)?;
                if think {
                    self.xtml_open(&mut out, "think", &[])?;
                    let reasoning = m.thinking.as_deref().unwrap_or("");
                    if !reasoning.trim().is_empty() {
                        out.extend(self.tok.encode(reasoning));
                    }
                    self.xtml_close(&mut out, "think")?;
                }
                self.xtml_open(&mut out, "response", &[])?;
                out.extend(self.tok.encode(&m.content));
                self.xtml_close(&mut out, "response")?;
                self.xtml_calls(&mut out, &m.tool_calls)?;
                self.xtml_close(&mut out, "message")?;
                out.push(self.special("<|end_of_msg|>")?);
            }
            Role::Tool => {
                let name = m.name.as_deref().ok_or_else(|| {
                    ChatError::invalid("messages", "a tool result needs the tool's name or the call it answers")
                })?;
                self.xtml_message(&mut out, &[("role", "tool"), ("tool", name), ("index", "1")], &m.content)?;
            }
        }
        Ok(out)
    }

    /// An assistant's calls: an object's entries as typed `argument` elements in the order
    /// written, any other arguments text as a `json` element.
    fn xtml_calls(&self, out: &mut Vec<u32>, calls: &[Call]) -> Result<(), TokenizerError> {
        if calls.is_empty() {
            return Ok(());
        }
        self.xtml_open(out, "tools", &[])?;
        for (i, call) in calls.iter().enumerate() {
            self.xtml_open(out, "call", &[("tool", &call.name), ("index", &(i + 1).to_string())])?;
            match object_entries(&call.arguments) {
                Some(entries) => {
                    for (key, value) in entries {
                        let raw = value.get();
                        self.xtml_open(out, "argument", &[("key", &key), ("type", json_type(raw))])?;
                        let text = match serde_json::from_str::<String>(raw) {
                            Ok(s) => s,
                            Err(_) => python_json(raw).unwrap_or_else(|_| raw.to_string()),
                        };
                        out.extend(self.tok.encode(&text));
                        self.xtml_close(out, "argument")?;
                    }
                }
                None if !call.arguments.trim().is_empty() => {
                    self.xtml_open(out, "json", &[("type", "object")])?;
                    out.extend(self.tok.encode(&call.arguments));
                    self.xtml_close(out, "json")?;
                }
                None => {}
            }
            self.xtml_close(out, "call")?;
        }
        self.xtml_close(out, "tools")
    }

    /// A run of tool results after the assistant turn whose `calls` they answer (`first` is the
    /// run's index in the conversation). When every result names a call by id they are written in
    /// the calls' order under the calls' names; otherwise in the order given, each named by its
    /// own `name` or else by the call in its position.
    fn xtml_results(&self, out: &mut Vec<u32>, run: &[Message], calls: &[Call], first: usize) -> Result<(), ChatError> {
        let answers = |m: &Message, c: &Call| m.tool_call_id.is_some() && m.tool_call_id == c.id;
        let mut ordered: Vec<(&Message, &str)> = Vec::new();
        if run.iter().all(|m| calls.iter().any(|c| answers(m, c))) {
            let mut seen: Vec<&str> = Vec::new();
            for c in calls {
                let Some(id) = c.id.as_deref().filter(|id| !seen.contains(id)) else { continue };
                seen.push(id);
                ordered.extend(run.iter().filter(|m| answers(m, c)).map(|m| (m, c.name.as_str())));
            }
        } else {
            for (k, m) in run.iter().enumerate() {
                let name = m.name.as_deref().or_else(|| calls.get(k).map(|c| c.name.as_str())).ok_or_else(|| {
                    ChatError::invalid(
                        format!("messages[{}]", first + k),
                        "a tool result needs the tool's name, or a tool_call_id or position matching a call",
                    )
                })?;
                ordered.push((m, name));
            }
        }
        for (k, (m, name)) in ordered.into_iter().enumerate() {
            let index = (k + 1).to_string();
            self.xtml_message(out, &[("role", "tool"), ("tool", name), ("index", &index)], &m.content)?;
        }
        Ok(())
    }
}
