//! What the commands print: tables and confirmations for people, on standard output.

use std::io::Write;

use sluice::app::admin::{Migrated, TriggerChange};
use sluice::store::DeadRow;
use sluice::text::{MAX_LOGGED, bounded};

pub(crate) fn migrated(migrated: &Migrated, trigger: &TriggerChange) {
    let table = &migrated.table;
    println!("outbox table {table} is ready ({})", migrated.summary);
    match trigger {
        TriggerChange::Keep => {}
        TriggerChange::Install(channel) => println!(
            "NOTIFY trigger installed: every insert into {table} notifies channel {channel:?} \
             (set relay.notify_channel = \"{channel}\")"
        ),
        TriggerChange::Drop => println!("NOTIFY trigger of {table} removed"),
    }
}

/// `sluice dead list`: one tab-separated line per row. The columns are the application's
/// text: printed escaped and bounded.
pub(crate) fn dead_rows(rows: &[DeadRow]) -> std::io::Result<()> {
    // A row's last error quotes what a plugin or the broker said: scrubbed like every output.
    let safe = |text: &str| sluice::secret::scrub(&bounded(text, MAX_LOGGED)).into_owned();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "id\ttenant\taggregate\tevent_type\tattempts\tdead_at\tlast_error"
    )?;
    for r in rows {
        writeln!(
            out,
            "{}\t{}\t{}/{}\t{}\t{}\t{}\t{}",
            safe(&r.id.to_string()),
            safe(r.tenant.as_deref().unwrap_or("default")),
            safe(&r.aggregate_type),
            safe(&r.aggregate_id),
            safe(&r.event_type),
            r.attempts,
            r.dead_at.to_rfc3339(),
            safe(r.last_error.as_deref().unwrap_or_default()),
        )?;
    }
    Ok(())
}
