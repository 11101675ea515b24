//! Every option and argument of every subcommand of a clap command says what it is for (used by
//! the unit tests of `k3-cli` and `cargo xtask`, included by path).

/// `path arg` for each argument or subcommand without help text.
pub fn gaps(cmd: &clap::Command, path: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if id != "help" && id != "version" && a.get_help().is_none() {
            missing.push(format!("{path} {id}"));
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
