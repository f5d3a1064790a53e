//! `sluice plugin new|check|test`: create a plugin project, validate a component, run rows
//! through a plugin on the relay's code path (optionally against a golden file).

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use sluice::plugin::PluginSource;
use sluice::plugin::{scaffold, testbench};

use crate::cli::PluginCommand;

/// Exit status of `sluice plugin test --expect` when the output differs from the golden file
/// (1 is any error, 2 a usage error).
const EXPECT_DIFFERS: u8 = 3;

pub fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::New { name, lang, dir } => {
            let dest = dir.unwrap_or_else(|| PathBuf::from(&name));
            scaffold::create(&name, lang, &dest)?;
            println!(
                "created {} ({lang} plugin {name}); next: {}/build.sh, then see {}/README.md",
                dest.display(),
                dest.display(),
                dest.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check { file } => {
            let info = testbench::check(&file)?;
            println!(
                "{}: OK (exports sluice:plugin/transformer@0.1.0)",
                file.display()
            );
            println!("name:    {}", info.name);
            println!("version: {}", info.version);
            if let Some(schema) = info.config_schema {
                println!("config schema: {schema}");
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Test {
            file,
            builtin,
            input,
            config,
            expect,
            memory_mb,
            call_timeout,
            recycle_memory_percent,
            batch_size,
        } => {
            let source = match (file, builtin) {
                (Some(file), _) => PluginSource::Wasm(file),
                (None, Some(name)) => PluginSource::Builtin(name),
                (None, None) => bail!("give a plugin file or --builtin NAME"),
            };
            let options = testbench::TestOptions {
                source,
                config,
                memory_mb,
                call_timeout,
                recycle_memory_percent,
                batch_size: batch_size.and_then(|n| usize::try_from(n).ok()),
            };
            plugin_test(&options, &input, expect.as_deref())
        }
    }
}

/// `sluice plugin test`: the messages on stdout, or with `expect` only the diff from it.
fn plugin_test(
    options: &testbench::TestOptions,
    input: &Path,
    expect: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let expected = match expect {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --expect {}", path.display()))?,
        ),
        None => None,
    };
    let mut captured = Vec::new();
    let summary = {
        let stdout = std::io::stdout();
        let out: Box<dyn Write + '_> = match expected {
            Some(_) => Box::new(&mut captured),
            None => Box::new(stdout.lock()),
        };
        if input.as_os_str() == "-" {
            testbench::run(options, std::io::stdin().lock(), out)?
        } else {
            let f = std::fs::File::open(input)
                .with_context(|| format!("cannot open --input {}", input.display()))?;
            testbench::run(options, BufReader::new(f), out)?
        }
    };
    std::io::stdout().flush()?;
    eprintln!(
        "{} rows, {} messages, {} failed rows, {} invalid lines",
        summary.rows, summary.messages, summary.failed_rows, summary.invalid_lines
    );
    if summary.invalid_lines > 0 {
        bail!("{} input lines were not valid rows", summary.invalid_lines);
    }
    let (Some(expected), Some(path)) = (expected, expect) else {
        return Ok(ExitCode::SUCCESS);
    };
    let actual = String::from_utf8_lossy(&captured);
    match testbench::diff_expected(&expected, &actual, &path.display().to_string()) {
        None => {
            eprintln!("output matches {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Some(diff) => {
            print!("{diff}");
            std::io::stdout().flush()?;
            eprintln!(
                "output differs from {} (- expected, + plugin output)",
                path.display()
            );
            Ok(ExitCode::from(EXPECT_DIFFERS))
        }
    }
}
