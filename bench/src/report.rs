//! Figures with units and targets: printed as each scenario finishes, collected into the final
//! Markdown table.

use std::fmt::Write as _;

use crate::cli::Settings;
use crate::machine::Machine;

/// What a figure should reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Self::AtLeast(t) => value >= t,
            Self::AtMost(t) => value <= t,
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Self::AtLeast(t) => format!("≥ {t} {unit}"),
            Self::AtMost(t) => format!("≤ {t} {unit}"),
        }
    }
}

/// One measured number.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub scenario: String,
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    pub target: Option<Target>,
}

impl Figure {
    pub(crate) fn new(scenario: &str, name: &str, value: f64, unit: &'static str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            name: name.to_owned(),
            value,
            unit,
            target: None,
        }
    }

    pub(crate) fn at_least(mut self, target: f64) -> Self {
        self.target = Some(Target::AtLeast(target));
        self
    }

    pub(crate) fn at_most(mut self, target: f64) -> Self {
        self.target = Some(Target::AtMost(target));
        self
    }

    fn target_cell(&self) -> String {
        match self.target {
            Some(t) if t.met(self.value) => format!("{} — met", t.describe(self.unit)),
            Some(t) => format!("{} — **missed**", t.describe(self.unit)),
            None => String::new(),
        }
    }
}

/// A scenario that could not be measured.
#[derive(Debug, Clone)]
struct Failure {
    scenario: String,
    error: String,
}

/// Everything measured in this run.
#[derive(Debug, Default)]
pub(crate) struct Report {
    figures: Vec<Figure>,
    failures: Vec<Failure>,
}

impl Report {
    /// Records a scenario's figures and prints them.
    pub(crate) fn add(&mut self, figures: Vec<Figure>) {
        for f in &figures {
            let target = f.target_cell();
            let target = if target.is_empty() {
                target
            } else {
                format!("   (target {target})")
            };
            println!(
                "{:<16} {:<36} {:>12} {}{target}",
                f.scenario,
                f.name,
                format_value(f.value),
                f.unit
            );
        }
        self.figures.extend(figures);
    }

    /// Records and prints a scenario's failure.
    pub(crate) fn fail(&mut self, scenario: &str, error: &anyhow::Error) {
        println!("{scenario:<16} FAILED: {error:#}");
        self.failures.push(Failure {
            scenario: scenario.to_owned(),
            error: format!("{error:#}"),
        });
    }

    /// The value of figure `name` of `scenario`, if it was measured.
    pub(crate) fn value(&self, scenario: &str, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.scenario == scenario && f.name == name)
            .map(|f| f.value)
    }

    /// Whether every scenario ran to the end (targets missed do not count as failures).
    pub(crate) fn all_ran(&self) -> bool {
        self.failures.is_empty()
    }

    /// The results as Markdown: machine, sizes, then one table row per figure and failure.
    pub(crate) fn markdown(&self, machine: &Machine, settings: &Settings) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; the results are ignored.
        let _ = writeln!(out, "## Sluice benchmark results\n");
        let _ = writeln!(out, "Machine: {}  ", machine.describe());
        let _ = writeln!(
            out,
            "Sizes: backlog {} rows (sql-ceiling, drains, noisy), languages {} rows, tenants {} \
             rows, naive {} rows, latency/idle window {} s, notify-cost {} s per variant, \
             sql-ceiling workers {}{}\n",
            format_value(settings.rows as f64),
            format_value(settings.language_rows as f64),
            format_value(settings.tenant_rows as f64),
            format_value(settings.naive_rows as f64),
            format_value(settings.duration.as_secs_f64()),
            format_value(settings.notify_cost_duration.as_secs_f64()),
            settings.workers,
            if settings.quick { " (--quick)" } else { "" }
        );
        let _ = writeln!(out, "| scenario | figure | value | target |");
        let _ = writeln!(out, "|---|---|---:|---|");
        for f in &self.figures {
            let _ = writeln!(
                out,
                "| {} | {} | {} {} | {} |",
                cell(&f.scenario),
                cell(&f.name),
                format_value(f.value),
                cell(f.unit),
                cell(&f.target_cell())
            );
        }
        for failure in &self.failures {
            let _ = writeln!(
                out,
                "| {} | **failed** | | {} |",
                cell(&failure.scenario),
                cell(&shorten(&failure.error, 300))
            );
        }
        out
    }
}

/// A number for people: thousands separated above 1,000, 0–2 decimals depending on size.
pub(crate) fn format_value(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let magnitude = v.abs();
    if magnitude >= 1000.0 {
        let rounded = v.round();
        let digits = format!("{:.0}", rounded.abs());
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if rounded < 0.0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else if magnitude >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if magnitude >= 10.0 {
        format!("{v:.1}")
    } else if magnitude >= 1.0 {
        format!("{v:.2}")
    } else {
        // Three significant digits, so 0.0123 CPU s does not print as 0.01.
        let decimals = ((-magnitude.log10()).ceil() as usize + 2).min(6);
        format!("{v:.decimals$}")
    }
}

/// Text safe inside a Markdown table cell: one line, no unescaped `|`.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " / ")
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max_chars).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_formatted_for_reading() {
        assert_eq!(format_value(58_123.4), "58,123");
        assert_eq!(format_value(1_000_000.0), "1,000,000");
        assert_eq!(format_value(-1234.0), "-1,234");
        assert_eq!(format_value(250.4), "250");
        assert_eq!(format_value(42.0), "42");
        assert_eq!(format_value(12.34), "12.3");
        assert_eq!(format_value(1.234), "1.23");
        assert_eq!(format_value(0.754), "0.754");
        assert_eq!(format_value(0.01234), "0.0123");
    }

    #[test]
    fn targets_are_judged() {
        let f = Figure::new("ratios", "x", 0.8, "×").at_least(0.75);
        assert_eq!(f.target_cell(), "≥ 0.75 × — met");
        let f = Figure::new("latency", "p99", 60.0, "ms").at_most(50.0);
        assert_eq!(f.target_cell(), "≤ 50 ms — **missed**");
    }

    #[test]
    fn cells_stay_in_their_column() {
        assert_eq!(cell("a|b\nc"), "a\\|b / c");
        assert_eq!(shorten("abcdef", 3), "abc…");
    }
}
