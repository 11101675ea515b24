//! The llama.cpp switches people type by reflex. Clap would read `-ngl 99` as `-n` with the value
//! `gl` and complain about that; each is answered instead with what it means here, before any
//! parsing, and the command is refused (exit 2, as clap refuses).

/// Each switch (and its spellings) with why k3 takes none, and what it does instead.
const SWITCHES: &[(&[&str], &str)] = &[
    (
        &["-ngl", "--n-gpu-layers", "--gpu-layers"],
        "k3 has no GPU layers: it runs on the CPU and streams the routed experts from disk; \
         drop it (--mem sets the memory to live within)",
    ),
    (
        &["-fa", "--flash-attn"],
        "k3's attention is always computed in blocks with an online softmax on the CPU; there is \
         nothing to switch on: drop it",
    ),
    (
        &["--jinja"],
        "k3 always renders a model's own chat template when it ships one (Kimi's formats \
         otherwise): drop it",
    ),
    (&["-cnv", "--conversation"], "for a conversation run `k3-cli chat`"),
    (
        &["--mlock"],
        "k3 does not lock memory: the trunk is mapped read-only and experts are read on demand \
         into k3's own cache, within --mem",
    ),
    (
        &["--no-mmap"],
        "k3 maps the trunk and reads experts with O_DIRECT, never through the page cache; there is \
         no other way to load: drop it",
    ),
];

/// The refusal for the first llama.cpp switch among `args` (up to a `--`), if any.
pub fn refusal(args: &[String]) -> Option<String> {
    for arg in args.iter().take_while(|a| *a != "--") {
        let name = arg.split('=').next().unwrap_or(arg);
        if let Some((_, why)) = SWITCHES.iter().find(|(names, _)| names.contains(&name)) {
            return Some(format!("`{name}` is llama.cpp's switch: {why}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::refusal;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_switch_is_named_and_answered() {
        let r = refusal(&args(&["k3-cli", "generate", "-ngl", "99", "hi"])).unwrap();
        assert!(r.starts_with("`-ngl` is llama.cpp's switch") && r.contains("no GPU layers"), "{r}");
        let r = refusal(&args(&["k3-cli", "serve", "--n-gpu-layers=40"])).unwrap();
        assert!(r.starts_with("`--n-gpu-layers`"), "{r}");
        for s in ["-fa", "--flash-attn", "--jinja", "-cnv", "--mlock", "--no-mmap"] {
            assert!(refusal(&args(&["k3-cli", "chat", s])).is_some(), "{s}");
        }
        // A prompt that happens to say it, after `--`, is a prompt; ordinary flags pass.
        assert_eq!(refusal(&args(&["k3-cli", "generate", "--", "-ngl"])), None);
        assert_eq!(refusal(&args(&["k3-cli", "generate", "-n", "8", "hello"])), None);
    }
}
