//! Progress of `sluice drain` (and `sluice replay`): a bar with rows done, rate and ETA when
//! standard error is a terminal, plain log lines otherwise (log files and CI have no use for a
//! redrawn bar).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use sluice::relay::Counters;
use sluice::shutdown::Shutdown;

/// How often a log line is written when there is no terminal.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(5);
/// How often the bar is updated.
const DRAW_EVERY: Duration = Duration::from_millis(200);

/// Reports the rows handled (sent or failed) out of `total` until `done` fires.
pub(crate) async fn report(counters: Arc<Counters>, total: u64, mut done: Shutdown) {
    let handled = || {
        let s = counters.snapshot();
        s.rows_sent + s.rows_failed + s.rows_unsettled
    };
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{bar:40} {human_pos}/{human_len} rows  {msg}  ETA {eta}  elapsed {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        let start = Instant::now();
        loop {
            let n = handled();
            // Rows inserted while draining are drained too: grow the total with them.
            if n > bar.length().unwrap_or(0) {
                bar.set_length(n);
            }
            bar.set_position(n);
            bar.set_message(format!("{} rows/s", rate(n, start.elapsed()).round()));
            tokio::select! {
                _ = tokio::time::sleep(DRAW_EVERY) => {}
                _ = done.recv() => break,
            }
        }
        bar.set_position(handled());
        bar.finish();
    } else {
        let start = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(LOG_EVERY) => {}
                _ = done.recv() => return,
            }
            log_line(handled(), total, start.elapsed());
        }
    }
}

/// A bar over `total` rows of `what`, with rate and ETA, on standard error; `None` when it is
/// not a terminal (log a line every [`LOG_EVERY`] instead).
pub(crate) fn bar(total: u64, what: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template =
        format!("{{bar:40}} {{human_pos}}/{{human_len}} {what}  {{per_sec}}  ETA {{eta}}");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// Rows per second over `elapsed`.
fn rate(done: u64, elapsed: Duration) -> f64 {
    done as f64 / elapsed.as_secs_f64().max(1e-3)
}

fn log_line(done: u64, total: u64, elapsed: Duration) {
    let rate = rate(done, elapsed);
    let left = total.saturating_sub(done);
    let eta = if rate > 0.0 {
        humantime::format_duration(Duration::from_secs((left as f64 / rate).ceil() as u64))
            .to_string()
    } else {
        "unknown".to_owned()
    };
    tracing::info!(
        rows_done = done,
        rows_total = total.max(done),
        rows_per_sec = rate.round() as u64,
        eta = %eta,
        "drain progress"
    );
}
