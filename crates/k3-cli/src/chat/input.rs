//! Where chat's lines come from: rustyline on a terminal (arrows, history kept in the data
//! directory), standard input line by line otherwise.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::{Context, Result};

/// Opens and closes a message of several lines.
const QUOTES: &str = "\"\"\"";

/// Where the user's lines come from.
pub enum Input {
    /// A terminal: rustyline, with the history file it loads and saves.
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    Piped(std::io::StdinLock<'static>),
    /// One message from the command line, then the end.
    Once(Option<String>),
}

impl Input {
    pub fn open() -> Result<Input> {
        if !std::io::stdin().is_terminal() {
            return Ok(Input::Piped(std::io::stdin().lock()));
        }
        let mut ed = rustyline::DefaultEditor::new().context("starting the line editor")?;
        let history = crate::default_model::data_dir().ok().map(|d| d.join("chat-history"));
        // One line per entry; an unreadable history only costs the recall of old lines.
        // Opened without blocking and bounded (1,000 lines are kept): a FIFO there is not waited on.
        let text = history.as_ref().and_then(|h| k3_format::read_input(h, "the line history is", 16 << 20).ok());
        if let Some(text) = text.and_then(|b| String::from_utf8(b).ok()) {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let _ = ed.add_history_entry(line);
            }
        }
        Ok(Input::Editor(Box::new(ed), history))
    }

    /// Where the line history is kept (on a terminal).
    pub fn history(&self) -> Option<&std::path::Path> {
        match self {
            Input::Editor(_, h) => h.as_deref(),
            Input::Piped(_) | Input::Once(_) => None,
        }
    }

    /// The next message: a line, or, from a line starting with `"""` to one ending with it,
    /// several lines as one (as in Ollama); `None` at the end of input.
    pub fn line(&mut self) -> Result<Option<String>> {
        let Some(first) = self.one_line("> ")? else { return Ok(None) };
        let Some(open) = first.trim_start().strip_prefix(QUOTES) else { return Ok(Some(first)) };
        if let Some(text) = open.trim_end().strip_suffix(QUOTES) {
            return Ok(Some(text.to_string()));
        }
        let mut lines = vec![open.to_string()];
        // The input may end inside the quotes: what was typed is the message.
        while let Some(l) = self.one_line("... ")? {
            if let Some(last) = l.trim_end().strip_suffix(QUOTES) {
                lines.push(last.to_string());
                break;
            }
            lines.push(l);
        }
        let text = lines.join("\n").trim_matches('\n').to_string();
        // The history file keeps one entry a line: a message of several lines is recalled as
        // one line, its lines joined by spaces.
        if let Input::Editor(ed, _) = self {
            let _ = ed.add_history_entry(format!("{QUOTES}{}{QUOTES}", text.replace('\n', " ")));
        }
        Ok(Some(text))
    }

    /// One line of input after `prompt`.
    fn one_line(&mut self, prompt: &str) -> Result<Option<String>> {
        match self {
            Input::Once(m) => Ok(m.take()),
            Input::Piped(stdin) => {
                eprint!("{prompt}");
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading standard input")? == 0 {
                    eprintln!();
                    return Ok(None);
                }
                Ok(Some(line.trim_end_matches(['\n', '\r']).to_string()))
            }
            Input::Editor(ed, _) => loop {
                match ed.readline(prompt) {
                    Ok(line) => {
                        if prompt == "> " && !line.trim().is_empty() && !line.trim_start().starts_with(QUOTES) {
                            let _ = ed.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    // Ctrl-C at the prompt clears the line, as in a shell.
                    Err(rustyline::error::ReadlineError::Interrupted) => continue,
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(e) => return Err(e).context("reading a line"),
                }
            },
        }
    }

    /// Saves the editor's history (atomically; the data directory made if needed).
    pub fn save(&mut self) -> Result<()> {
        if let Input::Editor(ed, Some(path)) = self {
            // The last 1,000 lines, one per line.
            let entries: Vec<&String> = ed.history().into_iter().collect();
            let mut text = String::new();
            for entry in entries.iter().skip(entries.len().saturating_sub(1000)) {
                text.push_str(entry);
                text.push('\n');
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            k3_engine::write_atomic(&*path, text.as_bytes())?;
        }
        Ok(())
    }
}
