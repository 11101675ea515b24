//! What the user documents say against what the binary's parsers take: every `k3-cli` command
//! line they show parses, every `--switch` they name exists (or is one of llama.cpp's that k3
//! refuses with a sentence), and every default they state for a switch is the parser's.

use std::collections::BTreeMap;

/// Where a switch is taken: its command's path, its default values, its help.
pub type Taken = (String, Vec<String>, String);

/// Long switches of every subcommand: `--name` -> where each is taken.
pub fn switches(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, Vec<Taken>>) {
    for a in cmd.get_arguments() {
        let defaults: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let help = a.get_long_help().or(a.get_help()).map(ToString::to_string).unwrap_or_default();
        let mut names: Vec<&str> = a.get_long().into_iter().collect();
        names.extend(a.get_all_aliases().unwrap_or_default());
        for n in names {
            out.entry(format!("--{n}")).or_default().push((path.to_string(), defaults.clone(), help.clone()));
        }
    }
    for sub in cmd.get_subcommands() {
        switches(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// A markdown file cut into its code blocks' lines and its prose.
pub struct Doc {
    pub code: Vec<String>,
    pub prose: String,
    /// A code fence was left open at the end (the prose and code would be swapped after it).
    pub open_fence: bool,
}

impl Doc {
    pub fn read(text: &str) -> Doc {
        let (mut code, mut prose, mut inside) = (Vec::new(), String::new(), false);
        let mut pending = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                inside = !inside;
                continue;
            }
            if !inside {
                prose.push_str(line);
                prose.push('\n');
                continue;
            }
            // A shell line continued with `\` is one command.
            match line.strip_suffix('\\') {
                Some(head) => pending.push_str(head),
                None => {
                    pending.push_str(line);
                    code.push(std::mem::take(&mut pending));
                }
            }
        }
        Doc { code, prose, open_fence: inside }
    }

    /// The spans in backticks of its prose.
    pub fn spans(&self) -> Vec<&str> {
        self.prose.split('`').skip(1).step_by(2).collect()
    }

    /// Every `k3-cli ...` command it shows: in code blocks, and whole in a prose span.
    pub fn commands(&self) -> Vec<String> {
        let mut out = Vec::new();
        for line in &self.code {
            // `k3-cli` as the program run, or `cargo run ... -p k3-cli -- ARGS`; not a synopsis.
            if line.contains(" [--") {
                continue;
            }
            if let Some((_, args)) = line.split_once("-p k3-cli -- ") {
                out.push(cut(&format!("k3-cli {args}")));
                continue;
            }
            let run = |at: usize| at == 0 || line[..at].ends_with([' ', '|']);
            if let Some(at) = line.find("k3-cli ").filter(|&at| run(at)) {
                out.push(cut(&line[at..]));
            }
        }
        for span in self.spans() {
            // A synopsis (`[--port N]`, `a|b`, `...`) is not a command line.
            if span.starts_with("k3-cli ") && !span.contains(['|', '<', '[']) && !span.contains("...") {
                out.push(cut(span));
            }
        }
        out
    }
}

/// A command up to where the shell ends it: a comment, a pipe, a redirection, `&`.
fn cut(line: &str) -> String {
    let mut end = line.len();
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '#' | '|' | '>' | '&' | ';') if i > 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    line[..end].trim().to_string()
}

/// Splits a command line into words as a shell does (quotes, no expansion).
pub fn words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

/// `(switch, value)` for every default the prose states: "`--x` (default V)", "`--x`, default
/// V", "`--x` (V)" for a number or size; V one word or an amount (`10 s`, `1,000`).
pub fn stated_defaults(prose: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("`--") {
        rest = &rest[at + 1..];
        let Some(end) = rest.find('`') else { break };
        let flag = rest[..end].split_whitespace().next().unwrap_or_default().to_string();
        let after = rest[end + 1..].trim_start();
        let value = if let Some(v) = after.strip_prefix("(default ").or(after.strip_prefix("(default: ")) {
            v.split([')', ';']).next().and_then(|v| v.split(", ").next())
        } else if let Some(v) = after.strip_prefix(", default ") {
            v.split([')', ';', ' ']).next()
        } else if let Some(v) = after.strip_prefix('(') {
            v.split(')').next().filter(|v| looks_like_amount(v))
        } else {
            None
        };
        // A default said in words ("every core") is a description, not a value to compare.
        if let Some(v) = value
            .map(|v| v.trim().trim_end_matches('.'))
            .filter(|v| looks_like_amount(v) || !v.contains(char::is_whitespace))
        {
            out.push((flag, v.to_string()));
        }
    }
    out
}

fn looks_like_amount(v: &str) -> bool {
    let v = v.trim();
    v.starts_with(|c: char| c.is_ascii_digit())
        && v.trim_end_matches(" s")
            .trim_end_matches(['K', 'M', 'G', 'T'])
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',')
}

/// A stated default as the parser spells it: `1,000` -> `1000`, `10 s` -> `10`.
pub fn normal(v: &str) -> String {
    v.replace(',', "").trim_end_matches(" s").trim_end_matches(" seconds").to_string()
}
