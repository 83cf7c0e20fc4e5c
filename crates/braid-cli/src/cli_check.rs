//! The consistency check of `braid`'s command line: one flag name, one meaning.

use std::collections::BTreeMap;

use clap::CommandFactory;

use crate::Cli;

/// What a flag is, as far as the parser can tell: its short letter, the Rust type its value
/// parses to, its value's placeholder, and whether it takes a value.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    short: Option<char>,
    value_type: String,
    value_names: Vec<String>,
    takes_value: bool,
}

/// Every visible flag of every visible subcommand: long name -> (subcommand path, shape).
fn flags() -> BTreeMap<String, Vec<(String, Shape)>> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, Vec<(String, Shape)>>) {
        for a in cmd.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if a.is_hide_set() || long == "help" || long == "version" {
                continue;
            }
            let shape = Shape {
                short: a.get_short(),
                value_type: format!("{:?}", a.get_value_parser().type_id()),
                value_names: a
                    .get_value_names()
                    .unwrap_or_default()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                takes_value: a.get_action().takes_values(),
            };
            out.entry(long.to_owned())
                .or_default()
                .push((path.to_owned(), shape));
        }
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            walk(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = BTreeMap::new();
    walk(&Cli::command(), "braid", &mut out);
    out
}

#[test]
fn the_command_line_is_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn each_flag_has_one_meaning_across_subcommands() {
    let all = flags();
    assert!(all.len() > 40, "walked too few flags: {:?}", all.keys());
    let mut bad = Vec::new();
    for (long, uses) in &all {
        let (first_path, first) = &uses[0];
        for (path, shape) in &uses[1..] {
            if shape != first {
                bad.push(format!(
                    "--{long}: {first_path} {first:?} but {path} {shape:?}"
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "flags with two meanings:\n{}",
        bad.join("\n")
    );
    // The vocabulary of `braid --help`: a count is --rail-count, an address list --rails.
    let ty = |l: &str| all[l][0].1.value_type.clone();
    assert_eq!(ty("rail-count"), ty("hosts"), "--rail-count is a count");
    assert_ne!(ty("rails"), ty("rail-count"), "--rails is an address list");
    for old in ["spin-us", "op-timeout", "np", "braid-rails", "limit"] {
        assert!(!all.contains_key(old), "--{old} is visible: {:?}", all[old]);
    }
}

#[test]
fn dash_n_means_ranks_only() {
    for (long, uses) in flags() {
        for (path, shape) in uses {
            if shape.short == Some('n') {
                assert_eq!(
                    (path.as_str(), long.as_str()),
                    ("braid run", "ranks"),
                    "-n is --{long} in {path}"
                );
            }
        }
    }
}

#[test]
fn help_documents_exit_statuses_and_the_vocabulary() {
    let help = Cli::command().render_long_help().to_string();
    for s in [
        "Exit status:",
        "124",
        "128+N",
        "--rail-count N",
        "--rails LOCAL=REMOTE",
    ] {
        assert!(help.contains(s), "braid --help lacks {s:?}:\n{help}");
    }
}
