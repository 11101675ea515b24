//! Every option and argument of every subcommand of a clap command says what it is for, and every
//! option that takes a value and may be left out says what happens then (used by the unit tests
//! of `k3-cli` and `cargo xtask`, included by path).

/// `path arg` for each argument or subcommand without help text, and for each optional valued
/// option whose help states no default (clap's `[default: ...]`, or "default" in its text).
pub fn gaps(cmd: &clap::Command, path: &str) -> Vec<String> {
    let mut missing = Vec::new();
    // One of a required group's options must be given: none of them has a default.
    let grouped: Vec<&str> =
        cmd.get_groups().filter(|g| g.is_required_set()).flat_map(|g| g.get_args().map(|a| a.as_str())).collect();
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if id != "help" && id != "version" && a.get_help().is_none() {
            missing.push(format!("{path} {id}"));
        }
        let help = a.get_long_help().or(a.get_help()).map(|h| h.to_string().to_lowercase()).unwrap_or_default();
        let valued =
            a.get_action().takes_values() && !a.is_positional() && !a.is_required_set() && !grouped.contains(&id);
        let said = !a.get_default_values().is_empty() || help.contains("default") || a.is_hide_default_value_set();
        if valued && !said {
            missing.push(format!("{path} {id} (no default stated)"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_about().is_none() {
            missing.push(format!("{path} {}", sub.get_name()));
        }
        missing.extend(gaps(sub, &format!("{path} {}", sub.get_name())));
    }
    missing
}
