//! Chat's slash commands, as Ollama's and llama-cli's users type them. A line that starts with
//! `/` is a command and never reaches the model (`//` sends a line that starts with `/`).

use std::path::PathBuf;

/// What a line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Text for the model.
    Say(String),
    Help,
    /// A new conversation (the system prompt kept).
    Clear,
    /// A new conversation under this system prompt (none when empty).
    System(String),
    /// `/set` alone: the settings in force.
    Settings,
    /// `/show`: the model, the settings, the system prompt, the context used.
    Show,
    /// The last message again, its answer dropped.
    Retry,
    Set(Setting),
    Save(PathBuf),
    Load(PathBuf),
    /// An image for the next message.
    Image(PathBuf),
    Exit,
}

/// A setting `/set` changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    Temperature(f32),
    TopP(f32),
    TopK(usize),
    MinP(f32),
    MaxTokens(u64),
    MaxThinking(u64),
    Think(bool),
    Seed(u64),
}

pub const HELP: &str = "\
/help                      this list
/clear                     start a new conversation (the system prompt stays)
/system TEXT               start a new conversation under this system prompt (/system alone: none)
/show                      the model, the settings, the system prompt, the context used
/retry                     drop the last answer and send your last message again
/set                       show the settings
/set temperature|top_p|top_k|min_p VALUE
/set seed N                the sampling seed (answers at a temperature above 0 repeat with it)
/set system TEXT           the same as /system TEXT
/set max_tokens N          the most tokens of an answer
/set max_thinking N        the most tokens of thinking before the model must answer
/set think on|off          K3 and thinking models: think before answering
/save FILE                 write the conversation as JSON messages (an existing file is kept)
/load FILE                 start a new conversation from JSON messages
/image FILE                send an image (PNG, JPEG, WebP) with your next message (K3)
/exit, /bye                quit (also Ctrl-D)
//TEXT                     send TEXT starting with a slash
Ctrl-C stops an answer; the conversation keeps what was said.";

/// Reads one line: a command, or text for the model; an unusable command says why.
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim_end();
    if let Some(text) = line.strip_prefix("//") {
        return Ok(Command::Say(format!("/{text}")));
    }
    let Some(cmd) = line.strip_prefix('/') else { return Ok(Command::Say(line.to_string())) };
    let (name, rest) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
    let rest = rest.trim();
    let path = |what: &str| {
        if rest.is_empty() { Err(format!("/{what} needs a file name")) } else { Ok(PathBuf::from(rest)) }
    };
    Ok(match name {
        "help" | "?" => Command::Help,
        "clear" | "new" => Command::Clear,
        "system" => Command::System(rest.to_string()),
        "set" if rest.is_empty() => Command::Settings,
        "set" if rest.split_whitespace().next() == Some("system") => {
            Command::System(rest.strip_prefix("system").unwrap_or_default().trim().to_string())
        }
        "set" => Command::Set(setting(rest)?),
        "show" => Command::Show,
        "retry" | "regenerate" => Command::Retry,
        "save" => Command::Save(path("save")?),
        "load" => Command::Load(path("load")?),
        "image" | "img" => Command::Image(path("image")?),
        "exit" | "bye" | "quit" => Command::Exit,
        other => return Err(format!("unknown command /{other}: /help lists them (// sends a line starting with /)")),
    })
}

fn setting(s: &str) -> Result<Setting, String> {
    let (name, value) = s.split_once(char::is_whitespace).map(|(n, v)| (n, v.trim())).unwrap_or((s, ""));
    if value.is_empty() {
        return Err(format!("/set {name} needs a value"));
    }
    let number = |v: &str| v.parse::<f32>().map_err(|_| format!("`{v}` is not a number"));
    let count = |v: &str| v.parse::<u64>().map_err(|_| format!("`{v}` is not a count"));
    use k3_generate::sample::{check_min_p, check_temperature, check_top_p};
    Ok(match name {
        "temperature" | "temp" => Setting::Temperature(check_temperature(number(value)?)?),
        "top_p" | "top-p" => Setting::TopP(check_top_p(number(value)?)?),
        "top_k" | "top-k" => Setting::TopK(count(value)? as usize),
        "min_p" | "min-p" => Setting::MinP(check_min_p(number(value)?)?),
        "max_tokens" | "max-tokens" => match count(value)? {
            0 => return Err("max_tokens must be at least 1".into()),
            n => Setting::MaxTokens(n),
        },
        "max_thinking" | "max-thinking" => Setting::MaxThinking(count(value)?),
        "seed" => Setting::Seed(count(value)?),
        "think" => match value {
            "on" | "true" | "yes" => Setting::Think(true),
            "off" | "false" | "no" => Setting::Think(false),
            other => return Err(format!("`{other}`: give on or off")),
        },
        other => {
            return Err(format!(
                "`{other}` is not a setting: temperature, top_p, top_k, min_p, max_tokens, max_thinking, think, seed, system"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_commands_or_text() {
        assert_eq!(parse("hello"), Ok(Command::Say("hello".into())));
        assert_eq!(parse("//etc/passwd"), Ok(Command::Say("/etc/passwd".into())));
        assert_eq!(parse("/bye"), Ok(Command::Exit));
        assert_eq!(parse("/system  Be brief. "), Ok(Command::System("Be brief.".into())));
        assert_eq!(parse("/set temperature 0.2"), Ok(Command::Set(Setting::Temperature(0.2))));
        assert_eq!(parse("/set think off"), Ok(Command::Set(Setting::Think(false))));
        assert_eq!(parse("/set seed 42"), Ok(Command::Set(Setting::Seed(42))));
        assert_eq!(parse("/set system Be brief. "), Ok(Command::System("Be brief.".into())));
        assert_eq!(parse("/set system"), Ok(Command::System(String::new())));
        assert_eq!(parse("/set"), Ok(Command::Settings));
        assert_eq!(parse("/show"), Ok(Command::Show));
        assert_eq!(parse("/retry"), Ok(Command::Retry));
        assert_eq!(parse("/save my chat.json"), Ok(Command::Save("my chat.json".into())));
        assert_eq!(parse("/image my cat.png"), Ok(Command::Image("my cat.png".into())));
        for (bad, says) in [
            ("/frobnicate", "unknown command /frobnicate"),
            ("/save", "needs a file name"),
            ("/image", "needs a file name"),
            ("/set temperature", "needs a value"),
            ("/set temperature hot", "not a number"),
            ("/set top_p 2", "top-p"),
            ("/set max_tokens 0", "at least 1"),
            ("/set seed -1", "not a count"),
            ("/set color red", "not a setting"),
        ] {
            assert!(parse(bad).is_err_and(|e| e.contains(says)), "{bad}");
        }
    }
}
