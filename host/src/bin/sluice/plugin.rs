//! `sluice plugin new|check|test`: create a plugin project, validate a component, run rows
//! through a plugin on the relay's code path (optionally against a golden file).

use sluice::encoding::FormatsSpec;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use sluice::config::Config;
use sluice::plugin::PluginSource;

use crate::cli::PluginCommand;

pub(crate) mod scaffold;
pub(crate) mod testbench;

/// The plugin supply of `--config FILE`'s `[plugins]` (registries, trusted keys, cache), with
/// `trusted_keys` added.
fn supply(
    config: Option<&Path>,
    mut trusted_keys: Vec<String>,
) -> anyhow::Result<sluice::plugin::supply::PluginSupply> {
    let mut plugins = match config {
        Some(path) => Config::load(path)?.plugins,
        None => sluice::plugin::PluginsSettings::default(),
    };
    trusted_keys.append(&mut plugins.trusted_keys);
    Ok(sluice::plugin::supply::PluginSupply::new(
        &trusted_keys,
        &plugins.registries,
        sluice::plugin::settings::plugin_cache_dir(plugins.cache_dir.as_deref()).as_deref(),
    )?
    .with_cache_max_bytes(plugins.cache_max_mb.saturating_mul(1024 * 1024)))
}

/// Exit status of `sluice plugin test --expect` when the output differs from the golden file
/// (1 is any error, 2 a usage error).
const EXPECT_DIFFERS: u8 = 3;

pub(crate) fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
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
        PluginCommand::Push { file, to, config } => {
            let supply = supply(config.as_deref(), Vec::new())?;
            let pushed = supply.push(&file, &to)?;
            println!("pushed {} to {to}@{}", file.display(), pushed.manifest);
            println!("digest:  {}", pushed.component);
            println!(
                "pin:     sha256 = \"{}\"",
                pushed.component.trim_start_matches("sha256:")
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check {
            file,
            config,
            trusted_keys,
        } => {
            let supply = supply(config.as_deref(), trusted_keys)?;
            let check = sluice::plugin::inspect(&file, &supply)?;
            println!("{}: OK (exports {})", file.display(), check.contract);
            println!("digest:  {}", check.digest);
            println!(
                "pin:     sha256 = \"{}\"",
                check.digest.trim_start_matches("sha256:")
            );
            if check.source != file.display().to_string() {
                println!("source:  {}", check.source);
            }
            if let Some(signer) = &check.signer {
                println!(
                    "signer:  {signer} ({})",
                    sluice::text::bounded(&signer.trusted_comment, 256)
                );
            }
            let info = check.info;
            println!("name:    {}", info.name);
            println!("version: {}", info.version);
            if let Some(schema) = info.config_schema {
                println!("config schema: {schema}");
            }
            for declared in &info.schemas {
                println!(
                    "record schema: {} ({}, {} bytes)",
                    sluice::text::bounded(&declared.record_name, 256),
                    match declared.format {
                        sluice::plugin::SchemaFormat::Avro => "avro",
                        sluice::plugin::SchemaFormat::Protobuf => "protobuf",
                        sluice::plugin::SchemaFormat::JsonSchema => "json-schema",
                    },
                    declared.schema.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Test {
            file,
            builtin,
            input,
            set,
            config,
            tenant,
            expect,
            memory_mb,
            call_timeout,
            recycle_memory_percent,
            batch_size,
            encoding,
        } => {
            let source = match (file, builtin) {
                (Some(file), _) => Some(PluginSource::Wasm(file)),
                (None, Some(name)) => Some(PluginSource::Builtin(name)),
                (None, None) => None,
            };
            let ConfigArgs { file, mut settings } = config_args(&config)?;
            settings.extend(set);
            // A key's value given on the command line is as secret as one from a file.
            sluice::secret::register(
                settings
                    .iter()
                    .filter(|(key, _)| sluice::secret::is_secret_key(key))
                    .map(|(_, value)| value),
            );
            let tenant = match (file, tenant) {
                (Some(file), Some(name)) => Some(configured_tenant(&file, &name, source.as_ref())?),
                (Some(file), None) => bail!(
                    "--config {} needs --tenant NAME: the tenant of that file to run as",
                    file.display()
                ),
                (None, Some(_)) => bail!(
                    "--tenant needs --config sluice.toml (the file that configures the tenant)"
                ),
                (None, None) => None,
            };
            if source.is_none() && tenant.is_none() {
                bail!("give a plugin file, --builtin NAME, or --config sluice.toml --tenant NAME");
            }
            let options = testbench::TestOptions {
                source,
                config: settings,
                memory_mb,
                call_timeout,
                recycle_memory_percent,
                batch_size: batch_size.and_then(|n| usize::try_from(n).ok()),
                tenant,
                formats: FormatsSpec {
                    value_format: encoding.value_format,
                    value_schema: encoding.value_schema,
                    value_record: encoding.value_record,
                    key_format: encoding.key_format,
                    key_schema: encoding.key_schema,
                    key_record: encoding.key_record,
                    ..FormatsSpec::default()
                },
            };
            plugin_test(&options, &input, expect.as_deref())
        }
    }
}

/// What one `plugin test --config` value is: the sluice.toml, or a plugin setting in the old
/// spelling of `--set`.
#[derive(Debug, PartialEq)]
enum ConfigArg {
    File(PathBuf),
    Setting(String, String),
}

/// A value is a setting when it reads as `KEY=VALUE` (a key without `/`) and no such file
/// exists; a file when it exists or does not read as a setting; refused when it is both.
fn classify_config_arg(value: &str, exists: impl Fn(&str) -> bool) -> anyhow::Result<ConfigArg> {
    let setting = value
        .split_once('=')
        .filter(|(key, _)| !key.is_empty() && !key.contains(['/', std::path::MAIN_SEPARATOR]));
    match (setting, exists(value)) {
        (Some(_), true) => bail!(
            "--config {value:?} is both an existing file and a KEY=VALUE plugin setting: write \
             --set {value} for the setting, or --config ./{value} for the file"
        ),
        (Some((key, v)), false) => Ok(ConfigArg::Setting(key.to_owned(), v.to_owned())),
        (None, _) => Ok(ConfigArg::File(PathBuf::from(value))),
    }
}

/// What the `--config` values of `plugin test` amount to.
#[derive(Debug, Default, PartialEq)]
struct ConfigArgs {
    /// The sluice.toml.
    file: Option<PathBuf>,
    /// Plugin settings in the deprecated `--config KEY=VALUE` spelling.
    settings: Vec<(String, String)>,
}

/// The sluice.toml among the `--config` values, and the settings given in the deprecated
/// `--config KEY=VALUE` spelling (each warned about on stderr).
fn config_args(values: &[String]) -> anyhow::Result<ConfigArgs> {
    let mut file: Option<PathBuf> = None;
    let mut settings = Vec::new();
    for value in values {
        match classify_config_arg(value, |v| Path::new(v).exists())? {
            ConfigArg::Setting(key, v) => {
                eprintln!(
                    "warning: `--config {value}` as a plugin setting is deprecated and will be \
                     removed: write `--set {value}` (--config names a sluice.toml, as in every \
                     other command)"
                );
                settings.push((key, v));
            }
            ConfigArg::File(path) => {
                if let Some(first) = &file {
                    bail!(
                        "--config given twice ({} and {}): name one sluice.toml; plugin \
                         settings are --set KEY=VALUE",
                        first.display(),
                        path.display()
                    );
                }
                file = Some(path);
            }
        }
    }
    Ok(ConfigArgs { file, settings })
}

/// Tenant `name` of the sluice.toml at `path`, loaded as `sluice run` loads it (environment
/// overrides, secrets, relative plugin paths); says on stderr what it runs (`replaced`: the
/// plugin given on the command line instead of the tenant's).
fn configured_tenant(
    path: &Path,
    name: &str,
    replaced: Option<&PluginSource>,
) -> anyhow::Result<testbench::ConfiguredTenant> {
    let config = Config::load_unchecked(path)?;
    let tenant = testbench::ConfiguredTenant::of(&config, name)
        .with_context(|| format!("{}: tenant {name:?}", path.display()))?;
    let plugin = match (replaced, tenant.spec.source()) {
        (Some(given), _) => format!("{} (given instead of the file's)", describe(given)),
        (None, Some(source)) => describe(&source),
        (None, None) => "none".to_owned(),
    };
    let topics = match &tenant.spec.limits.allowed_topics {
        Some(patterns) => patterns.join(", "),
        None => "any".to_owned(),
    };
    // Config keys only: values may be secrets.
    let keys: Vec<String> = tenant
        .spec
        .config_pairs()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let entry = if tenant.configured {
        format!("tenant {name:?}: [tenants.{name}] of {}", path.display())
    } else {
        format!(
            "tenant {name:?} has no [tenants.{name}] entry in {}, so it runs [plugins.default], \
             as in sluice run",
            path.display()
        )
    };
    let keys = match keys.is_empty() {
        true => "none".to_owned(),
        false => keys.join(", "),
    };
    eprintln!("{entry}; plugin {plugin}; config keys: {keys}; allowed_topics: {topics}");
    Ok(tenant)
}

fn describe(source: &PluginSource) -> String {
    match source {
        PluginSource::Wasm(path) => path.display().to_string(),
        PluginSource::Builtin(name) => format!("builtin {name}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_value_is_a_file_a_deprecated_setting_or_refused_when_both() {
        let files = ["sluice.toml", "mode=x", "./mode=x"];
        let classify = |v: &str| classify_config_arg(v, |p| files.contains(&p));
        assert_eq!(
            classify("sluice.toml").unwrap(),
            ConfigArg::File("sluice.toml".into())
        );
        assert_eq!(
            classify("topic_prefix=shop.").unwrap(),
            ConfigArg::Setting("topic_prefix".into(), "shop.".into())
        );
        assert_eq!(
            classify("url=http://x/y?a=b").unwrap(),
            ConfigArg::Setting("url".into(), "http://x/y?a=b".into()),
            "split at the first ="
        );
        // Not a setting: a missing file, reported when it is read.
        for path in ["missing.toml", "/etc/a=b/sluice.toml", "=x"] {
            assert_eq!(
                classify(path).unwrap(),
                ConfigArg::File(path.into()),
                "{path}"
            );
        }
        // An existing file named like a setting.
        let err = classify("mode=x").unwrap_err().to_string();
        assert!(
            err.contains("--set mode=x") && err.contains("--config ./mode=x"),
            "{err}"
        );
        assert_eq!(
            classify("./mode=x").unwrap(),
            ConfigArg::File("./mode=x".into())
        );
    }

    #[test]
    fn one_sluice_toml_and_any_number_of_old_style_settings() {
        let args =
            config_args(&["a=1".into(), "sluice-missing.toml".into(), "b=2".into()]).unwrap();
        assert_eq!(
            args,
            ConfigArgs {
                file: Some(PathBuf::from("sluice-missing.toml")),
                settings: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
            }
        );
        let err = config_args(&["x.toml".into(), "y.toml".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice") && err.contains("--set"), "{err}");
    }
}
