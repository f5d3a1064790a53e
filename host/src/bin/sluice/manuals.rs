//! `sluice completions` and `sluice man`: shell completion scripts and man pages, generated
//! from the command line's own definition ([`crate::cli`]), so they cannot drift from it.
//! The Debian package installs both (scripts/package writes them with the release binary).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

/// The completion script for `shell`.
pub(crate) fn completions(shell: Shell, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "sluice", out);
    Ok(())
}

/// sluice(1): the synopsis, every option and command, and the examples of `--help`.
pub(crate) fn man_page(out: &mut dyn Write) -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command())
        .render(out)
        .context("cannot write the man page")
}

/// sluice(1) and a page per command, `sluice-<command>[-<subcommand>].1`, into `dir`.
pub(crate) fn write_man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("cannot write the man pages into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn text(write: impl FnOnce(&mut Vec<u8>) -> anyhow::Result<()>) -> String {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn completions_know_every_command_in_each_shell() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = text(|out| completions(shell, out));
            for command in [
                "migrate", "run", "drain", "status", "config", "dead", "plugin",
            ] {
                assert!(script.contains(command), "{shell}: {command}");
            }
            assert!(script.contains("--config"), "{shell}");
        }
        // Each in its shell's own form.
        assert!(text(|out| completions(Shell::Bash, out)).contains("complete -F"));
        assert!(text(|out| completions(Shell::Zsh, out)).starts_with("#compdef sluice"));
        assert!(text(|out| completions(Shell::Fish, out)).contains("complete -c sluice"));
    }

    #[test]
    fn the_man_page_has_the_commands_and_the_help_examples() {
        let page = text(|out| man_page(out));
        assert!(page.contains(".TH sluice 1"), "{page}");
        for wanted in ["config check", "migrate", "dead replay", "Examples:"] {
            assert!(page.contains(wanted), "{wanted}: {page}");
        }
        let dir = tempfile::tempdir().unwrap();
        write_man_pages(dir.path()).unwrap();
        for page in [
            "sluice.1",
            "sluice-run.1",
            "sluice-config-check.1",
            "sluice-dead-replay.1",
        ] {
            assert!(dir.path().join(page).is_file(), "{page}");
        }
    }

    #[test]
    fn help_ends_with_examples_of_the_five_commands_operators_run_most() {
        let help = Cli::command().render_help().to_string();
        let examples = &help[help.find("Examples:").expect("examples")..];
        for command in [
            "sluice migrate --config",
            "sluice config check --config",
            "sluice run --config",
            "sluice status --config",
            "sluice dead replay --config",
        ] {
            assert!(examples.contains(command), "{command}: {examples}");
        }
        // Every example parses as the command line it shows.
        for line in examples.lines().filter(|l| l.starts_with("  sluice ")) {
            let args = line.split_whitespace();
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{line}: {e}"));
        }
    }
}
