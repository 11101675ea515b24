//! Chat's conveniences as Ollama's users type them, from standard input: `"""` for a message of
//! several lines, `/retry`, `/show`, `/set seed`, `/set system`, and `/load` printing what it
//! loaded. What the conversation holds is read back from `/save`'s file.

mod common;

use common::k3_stdin;
use serde_json::Value;

fn saved(path: &std::path::Path) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap_or_default().to_string()))
        .collect()
}

#[test]
fn a_message_of_several_lines_between_triple_quotes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    let input =
        format!("\"\"\"Who made\n\n  the light?\nSay it\"\"\"\n\"\"\"one line\"\"\"\n/save {}\n", file.display());
    let (ok, _, err) = k3_stdin(&["chat", "-n", "3", "--temp", "0"], &input);
    assert!(ok, "{err}");
    let users: Vec<String> = saved(&file).into_iter().filter(|(r, _)| r == "user").map(|(_, c)| c).collect();
    assert_eq!(users, ["Who made\n\n  the light?\nSay it", "one line"]);
}

#[test]
fn retry_drops_the_answer_and_sends_the_message_again() {
    let dir = tempfile::tempdir().unwrap();
    let (once, twice) = (dir.path().join("once.json"), dir.path().join("twice.json"));
    let (ok, _, err) = k3_stdin(
        &["chat", "-n", "6", "--temp", "0"],
        &format!("Who made the light?\n/save {}\n/retry\n/save {}\n", once.display(), twice.display()),
    );
    assert!(ok, "{err}");
    // Greedy: the same answer again, in place of the first (one question, one answer).
    let (a, b) = (saved(&once), saved(&twice));
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a, b);
    let (ok, _, err) = k3_stdin(&["chat", "-n", "2"], "/retry\n");
    assert!(ok && err.contains("nothing to retry"), "{err}");
}

#[test]
fn show_set_seed_and_set_system() {
    let (ok, _, err) = k3_stdin(
        &["chat", "-n", "2", "--temp", "0"],
        "Hello\n/show\n/set seed 41\n/set\n/set system Be brief.\n/show\n/set seed x\n",
    );
    assert!(ok, "{err}");
    assert!(err.contains("model     ") && err.contains("kimi_linear"), "{err}");
    let used: Vec<&str> = err.lines().filter(|l| l.starts_with("context   ")).collect();
    assert_eq!(used.len(), 2, "{err}");
    assert!(!used[0].starts_with("context   0 of") && used[0].contains("by 2 messages"), "{}", used[0]);
    assert!(err.contains("; seed 41;"), "{err}");
    assert!(err.contains("[a new conversation under the new system prompt]"), "{err}");
    assert!(err.contains("system    \"Be brief.\""), "{err}");
    assert!(used[1].starts_with("context   0 of") && used[1].contains("by 0 messages"), "{}", used[1]);
    assert!(err.contains("`x` is not a count"), "{err}");
}

#[test]
fn seeds_set_in_chat_repeat_answers() {
    let answer = |seed: &str| {
        let (ok, out, err) = k3_stdin(&["chat", "-n", "12", "--temp", "1.5"], &format!("/set seed {seed}\nHello\n"));
        assert!(ok, "{err}");
        out
    };
    assert_eq!(answer("7"), answer("7"));
    assert_ne!(answer("7"), answer("8"), "another seed, another answer at temperature 1.5");
}

#[test]
fn load_prints_the_conversation_it_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    std::fs::write(
        &file,
        r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who made the light?"},
            {"role": "assistant", "content": "God did."}]"#,
    )
    .unwrap();
    let (ok, _, err) = k3_stdin(&["chat", "-n", "2"], &format!("/load {}\n", file.display()));
    assert!(ok, "{err}");
    let at = err.find("[loaded 3 messages").expect(&err);
    let shown = &err[at..];
    for line in ["system: Be brief.", "you: Who made the light?", "model: God did."] {
        assert!(shown.contains(line), "{line} in {shown}");
    }
}
