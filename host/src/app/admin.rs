//! The commands an operator runs against a table: `sluice migrate` and `sluice dead …`.

use std::path::Path;

use anyhow::{Context, bail};

use crate::config::{Config, DATABASE_URL_ENV};
use crate::store::{self, OutboxStore, Store, StoreOptions, TableName, TableSpec};

/// Which outbox table a command works on: from a config file (`database.url` or
/// `SLUICE_DATABASE_URL`, `database.table`, `[database.columns]`), or from a URL and a table
/// name with Sluice's own column names.
pub enum Target<'a> {
    /// The config file at this path.
    Config(&'a Path),
    /// `--database-url` and `--table`, with Sluice's own column names.
    Url {
        /// `--database-url`; `None`: `SLUICE_DATABASE_URL`, else an error.
        url: Option<String>,
        /// `--table`, optionally schema-qualified; `None`: `outbox`.
        table: Option<&'a str>,
    },
}

impl Target<'_> {
    /// The database URL and the table.
    pub fn resolve(&self) -> anyhow::Result<(String, TableSpec)> {
        let (url, spec, _) = self.resolve_with_options()?;
        Ok((url, spec))
    }

    /// The database URL, the table, and how `sluice run` claims from it (the file's
    /// `[relay]` settings; the defaults with `--database-url`).
    fn resolve_with_options(&self) -> anyhow::Result<(String, TableSpec, StoreOptions)> {
        match self {
            Self::Config(path) => {
                let config = Config::load(path)?;
                let spec = config.database.table_spec()?;
                let options = config.store_options();
                Ok((config.database_url().to_owned(), spec, options))
            }
            Self::Url { url, table } => {
                // SLUICE_DATABASE_URL is read here rather than by the argument parser, so that
                // it does not conflict with `--config` (whose URL it overrides, as for `run`).
                let Some(url) = url.clone().or_else(|| std::env::var(DATABASE_URL_ENV).ok()) else {
                    bail!("give --config FILE or --database-url URL (or set {DATABASE_URL_ENV})");
                };
                let table = TableName::parse(table.unwrap_or("outbox")).context("--table")?;
                Ok((url, TableSpec::new(table), StoreOptions::default()))
            }
        }
    }

    /// Opens the table for admin work (one connection; the table is checked first).
    pub async fn open(&self) -> anyhow::Result<Store> {
        let (url, spec) = self.resolve()?;
        Ok(store::open(&url, &spec, StoreOptions::default(), 1).await?)
    }
}

/// What `sluice migrate` does with the NOTIFY trigger.
pub enum TriggerChange {
    /// Leave it as it is (neither flag given).
    Keep,
    /// Install it, notifying on this channel (`--notify-trigger`, `--notify-channel`).
    Install(String),
    /// Remove it (`--drop-notify-trigger`).
    Drop,
}

/// What `sluice migrate` did.
pub struct Migrated {
    /// The table created or upgraded.
    pub table: TableName,
    /// One line about the table as Sluice will use it.
    pub summary: String,
}

/// Creates or upgrades the table and checks it (with `partitioned`: creates it partitioned by
/// `created_at`, PostgreSQL only), then installs or drops the NOTIFY trigger.
pub async fn migrate(
    target: &Target<'_>,
    trigger: &TriggerChange,
    partitioned: Option<store::PartitionInterval>,
) -> anyhow::Result<Migrated> {
    // With `--config`, the indexes its `[relay]` settings need too.
    let (url, spec, options) = target.resolve_with_options()?;
    // Refused before the table is touched, not after migrating it.
    let driver = store::Driver::of(&url)?;
    if !matches!(trigger, TriggerChange::Keep) && !driver.notifies() {
        bail!(
            "--notify-trigger and --drop-notify-trigger: {} has no LISTEN/NOTIFY (relays poll)",
            driver.name()
        );
    }
    if let TriggerChange::Install(channel) = trigger {
        store::validate_channel(channel)
            .map_err(anyhow::Error::msg)
            .context("--notify-channel")?;
    }
    let summary = store::migrate(&url, &spec, &options, partitioned).await?;
    if !matches!(trigger, TriggerChange::Keep) {
        let opened = store::open(&url, &spec, StoreOptions::default(), 1).await?;
        match trigger {
            TriggerChange::Install(channel) => opened.install_notify_trigger(channel).await?,
            TriggerChange::Drop => opened.drop_notify_trigger().await?,
            TriggerChange::Keep => {}
        }
    }
    Ok(Migrated {
        table: spec.name,
        summary,
    })
}
