//! How a chat answer looks: the answer streamed on standard output; thinking either counted on a
//! status line (hidden) or shown dimmed and apart (`--show-thinking`); tool calls as their name
//! and arguments; colour only on a terminal and never with `NO_COLOR`.

use std::io::{IsTerminal, Write};

use anyhow::Result;
use k3_generate::speculate::SpecStats;
use k3_generate::{Finish, Generator};
use k3_text::tokenizer::Tokenizer;
use k3_text::toolcall::{Piece, ToolCall, ToolCallReader};

/// Terminal escapes, or none.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// Standard output takes colour.
    pub color: bool,
    /// Standard error is a terminal: a status line can be redrawn there.
    pub status: bool,
    /// Standard error takes colour.
    note_color: bool,
}

impl Style {
    pub fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let status = std::io::stderr().is_terminal();
        Style { color: !no_color && std::io::stdout().is_terminal(), status, note_color: !no_color && status }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.color && !s.is_empty() { format!("\x1b[{code}m{s}\x1b[0m") } else { s.to_string() }
    }

    pub fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }

    pub fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }

    pub fn cyan(&self, s: &str) -> String {
        self.paint("36", s)
    }

    /// A note on standard error (why an answer stopped, a command's result).
    pub fn note(&self, s: &str) {
        if self.note_color {
            eprintln!("\x1b[33m{s}\x1b[0m");
        } else {
            eprintln!("{s}");
        }
    }
}

/// One answer as it was streamed: all of it, or what was said before `failed`.
#[derive(Default)]
pub struct Answered {
    pub text: String,
    pub thinking: String,
    /// The tool calls, apart from the text (shown as name and arguments).
    pub calls: Vec<ToolCall>,
    pub tokens: u64,
    pub finish: Option<Finish>,
    pub spec: SpecStats,
    /// What ended the answer early: the engine's error, or standard output's.
    pub failed: Option<anyhow::Error>,
    /// What was last written ends a line (a call is shown on a line of its own).
    at_line_start: bool,
}

/// Streams one answer to `out`, thinking shown apart (`show_thinking`) or counted on standard
/// error's status line. An error part way keeps what was said before it (`failed`).
pub fn answer(
    engine: &k3_engine::Engine<'_>,
    mut turn: Generator<'_, '_>,
    tok: &Tokenizer,
    calls: Option<ToolCallReader>,
    style: Style,
    show_thinking: bool,
    out: &mut impl Write,
) -> Answered {
    let mut a = Answered { at_line_start: true, ..Answered::default() };
    if let Err(e) = stream(engine, &mut turn, tok, calls, (style, show_thinking), out, &mut a) {
        // The line the answer was on is closed, if standard output still takes it.
        let _ = writeln!(out);
        a.failed = Some(e);
    }
    a.tokens = turn.produced();
    a.finish = turn.finish();
    a.spec = turn.spec;
    a
}

fn stream(
    engine: &k3_engine::Engine<'_>,
    turn: &mut Generator<'_, '_>,
    tok: &Tokenizer,
    mut calls: Option<ToolCallReader>,
    (style, show_thinking): (Style, bool),
    out: &mut impl Write,
    a: &mut Answered,
) -> Result<()> {
    let mut shown_thinking = false;
    let mut status = false;
    let clear_status = |status: &mut bool| {
        if std::mem::take(status) {
            eprint!("\r\x1b[2K");
        }
    };
    while let Some(t) = turn.step(engine)? {
        let reasoning = turn.take_reasoning();
        if !reasoning.is_empty() {
            a.thinking.push_str(&reasoning);
            if show_thinking {
                if !shown_thinking {
                    write!(out, "{}", style.dim("thinking: "))?;
                    shown_thinking = true;
                }
                write!(out, "{}", style.dim(&reasoning))?;
            }
        }
        if turn.thinking() && !show_thinking && style.status {
            let n = turn.thought();
            let line = format!("thinking... {n} token{}", if n == 1 { "" } else { "s" });
            eprint!("\r\x1b[2K{}", if style.note_color { format!("\x1b[2m{line}\x1b[0m") } else { line });
            status = true;
        }
        let pieces = match calls.as_mut() {
            Some(r) if !turn.thinking() => r.push(tok, t.id, &t.text),
            _ if t.text.is_empty() => Vec::new(),
            _ => vec![Piece::Text(t.text.clone())],
        };
        for p in pieces {
            clear_status(&mut status);
            if shown_thinking && a.text.is_empty() {
                // The answer starts apart from the thinking.
                writeln!(out, "\n")?;
                shown_thinking = false;
            }
            show(a, p, style, out)?;
        }
        out.flush()?;
    }
    clear_status(&mut status);
    let rest = turn.flush();
    if !rest.is_empty() {
        show(a, Piece::Text(rest), style, out)?;
    }
    for p in calls.as_mut().map(ToolCallReader::finish).unwrap_or_default() {
        show(a, p, style, out)?;
    }
    writeln!(out)?;
    Ok(())
}

/// Text as it is; a call as its name and arguments, on a line of its own, kept apart.
fn show(a: &mut Answered, p: Piece, style: Style, out: &mut impl Write) -> Result<()> {
    match p {
        Piece::Text(t) => {
            a.text.push_str(&t);
            if !t.is_empty() {
                a.at_line_start = t.ends_with('\n');
            }
            write!(out, "{t}")?;
        }
        Piece::Call(c) => {
            let line = format!("[tool call] {}({})", c.name, c.arguments);
            let newline = if a.at_line_start { "" } else { "\n" };
            a.calls.push(c);
            a.at_line_start = false;
            write!(out, "{newline}{}", style.cyan(&line))?;
        }
    }
    Ok(())
}
