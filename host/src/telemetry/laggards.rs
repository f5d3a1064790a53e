//! The tenants furthest behind: ranked by their oldest due row ([`worst`]), for the laggards
//! `/status` and `sluice status` list, and the bounded, sticky set of them the backlog gauges
//! give a `tenant` label value of their own ([`LaggardLabels`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::text::bounded;

/// Tenants `/status` and `sluice status` list as the slowest, and that the gauges give a
/// `tenant` label value of their own when they have none: enough to see who lags among
/// thousands, few enough series for any Prometheus.
pub(crate) const DEFAULT_LAGGARDS: usize = 10;
/// Most laggards one may ask for: each adds five series (and their churn) to every scrape.
pub(crate) const MAX_LAGGARDS: usize = 100;

/// Longest `tenant` label value a laggard gets, in bytes: its name is the rows' text, which
/// may be anything.
pub(crate) const MAX_LABEL_VALUE: usize = 128;

/// How far behind one tenant is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Lag<'a> {
    /// `None`: rows without a tenant.
    pub(crate) tenant: Option<&'a str>,
    /// Age of the oldest due row, in seconds.
    pub(crate) oldest_due_age_seconds: f64,
    /// Rows due now.
    pub(crate) due: i64,
}

/// The `n` tenants of `lags` furthest behind, worst first: the oldest due row first, then the
/// most due rows, then by name (so equal lags rank the same every time). A tenant without a
/// due row is not behind.
pub(crate) fn worst<'a>(lags: impl IntoIterator<Item = Lag<'a>>, n: usize) -> Vec<Lag<'a>> {
    let mut lags: Vec<Lag<'a>> = lags.into_iter().filter(|l| l.due > 0).collect();
    lags.sort_by(|a, b| {
        b.oldest_due_age_seconds
            .total_cmp(&a.oldest_due_age_seconds)
            .then(b.due.cmp(&a.due))
            .then(a.tenant.cmp(&b.tenant))
    });
    lags.truncate(n);
    lags
}

/// The `tenant` label values of the laggards among tenants without a `[tenants.<name>]` entry:
/// at most `n` at a time. The worst half of the worst `n` always have one; the rest of the
/// worst `n` get one when one is free. A tenant keeps its own while it stays among the worst
/// `2n`, unless one of the worst half needs its place: the worst tenants are always labelled,
/// and tenants around the cut-off do not flap from sample to sample.
#[derive(Debug, Default)]
pub(crate) struct LaggardLabels {
    /// Tenant name → its label value.
    held: BTreeMap<String, Arc<str>>,
}

impl LaggardLabels {
    /// Who has a label value after a sample: `ranked` are the tenants without one of their own
    /// furthest behind, worst first (the worst `2n` are enough); `taken` says whether another
    /// series has a label value already (a configured tenant's, `_default`). Returns the label
    /// values given up, whose series are to be removed.
    pub(crate) fn update(
        &mut self,
        ranked: &[&str],
        n: usize,
        taken: impl Fn(&str) -> bool,
    ) -> Vec<Arc<str>> {
        let rank: HashMap<&str, usize> = ranked
            .iter()
            .take(n.saturating_mul(2))
            .enumerate()
            .map(|(at, tenant)| (*tenant, at))
            .collect();
        let mut given_up = Vec::new();
        self.held.retain(|tenant, label| {
            let keep = rank.contains_key(tenant.as_str());
            if !keep {
                given_up.push(Arc::clone(label));
            }
            keep
        });
        for (at, tenant) in ranked.iter().take(n).enumerate() {
            if self.held.contains_key(*tenant) {
                continue;
            }
            let label: Arc<str> = Arc::from(bounded(tenant, MAX_LABEL_VALUE));
            // A name that reads like another series' label value stays in `_default`.
            if taken(&label) || self.held.values().any(|held| *held == label) {
                continue;
            }
            if self.held.len() >= n {
                if at >= n.div_ceil(2) {
                    continue;
                }
                // Fewer than `n` of the worst `n` have a label value, so the holder ranked
                // last is outside them.
                let last = self
                    .held
                    .keys()
                    .max_by_key(|t| rank.get(t.as_str()))
                    .cloned();
                given_up.extend(last.and_then(|t| self.held.remove(&t)));
            }
            self.held.insert((*tenant).to_owned(), label);
        }
        given_up
    }

    /// The label value of `tenant`, when it has one of its own as a laggard.
    pub(crate) fn of_name(&self, tenant: &str) -> Option<Arc<str>> {
        self.held.get(tenant).cloned()
    }

    /// Every laggard's label value.
    pub(crate) fn values(&self) -> Vec<Arc<str>> {
        self.held.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(tenant: &str, age: f64, due: i64) -> Lag<'_> {
        Lag {
            tenant: Some(tenant),
            oldest_due_age_seconds: age,
            due,
        }
    }

    fn names(lags: &[Lag<'_>]) -> Vec<String> {
        lags.iter()
            .map(|l| l.tenant.unwrap_or("(none)").to_owned())
            .collect()
    }

    #[test]
    fn the_oldest_due_row_ranks_first_then_more_due_rows_then_the_name() {
        let lags = [
            lag("young", 5.0, 900),
            lag("b-old", 60.0, 3),
            lag("a-old", 60.0, 3),
            lag("old-busy", 60.0, 40),
            lag("oldest", 3600.0, 1),
            lag("idle", 0.0, 0),
            Lag {
                tenant: None,
                oldest_due_age_seconds: 120.0,
                due: 2,
            },
        ];
        assert_eq!(
            names(&worst(lags, 10)),
            ["oldest", "(none)", "old-busy", "a-old", "b-old", "young"],
            "idle has no due row"
        );
        assert_eq!(names(&worst(lags, 2)), ["oldest", "(none)"]);
        assert!(worst(lags, 0).is_empty());
    }

    fn held(labels: &LaggardLabels) -> Vec<String> {
        labels.values().iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn the_worst_get_a_label_and_keep_it_within_the_worst_2n() {
        let mut labels = LaggardLabels::default();
        let none = |_: &str| false;
        let given_up = labels.update(&["a", "b", "c", "d", "e"], 2, none);
        assert!(given_up.is_empty());
        assert_eq!(held(&labels), ["a", "b"]);
        // `c` passes `a` into second place: `a` is still among the worst 4 and `c` is not the
        // worst, so nothing changes (no flapping around the cut-off).
        let given_up = labels.update(&["b", "c", "a", "d"], 2, none);
        assert!(given_up.is_empty(), "{given_up:?}");
        assert_eq!(held(&labels), ["a", "b"]);
        // `c` becomes the worst: it takes the place of the holder ranked last.
        let given_up = labels.update(&["c", "b", "a", "d"], 2, none);
        assert_eq!(given_up, [Arc::from("a")]);
        assert_eq!(held(&labels), ["b", "c"]);
        // `b` falls out of the worst 4: its place is free for `d`.
        let given_up = labels.update(&["c", "d", "e", "f", "b"], 2, none);
        assert_eq!(given_up, [Arc::from("b")]);
        assert_eq!(held(&labels), ["c", "d"]);
        // Caught up (no longer ranked): given up.
        let given_up = labels.update(&["e"], 3, none);
        assert_eq!(given_up.len(), 2);
        assert_eq!(held(&labels), ["e"]);
        assert_eq!(labels.of_name("e").as_deref(), Some("e"));
        assert_eq!(labels.of_name("d"), None);
        let given_up = labels.update(&["e"], 0, none);
        assert_eq!(given_up.len(), 1, "0 turns them off");
        assert!(held(&labels).is_empty());
    }

    #[test]
    fn never_more_than_n_labels_however_the_ranking_moves() {
        let mut labels = LaggardLabels::default();
        let tenants: Vec<String> = (0..50).map(|i| format!("t{i}")).collect();
        for round in 0..200usize {
            // A different order each round (a fixed permutation's powers).
            let mut ranked: Vec<&str> = tenants.iter().map(String::as_str).collect();
            ranked.rotate_left(round * 7 % 50);
            if round % 3 == 0 {
                ranked.reverse();
            }
            labels.update(&ranked, 5, |_| false);
            let held = labels.values();
            assert!(held.len() <= 5, "round {round}: {held:?}");
            for worst in &ranked[..3] {
                assert!(labels.of_name(worst).is_some(), "round {round}: {worst}");
            }
        }
    }

    #[test]
    fn a_label_stays_bounded_whatever_the_name_and_never_doubles_another_series() {
        let mut labels = LaggardLabels::default();
        let long = format!("evil\u{1b}[31m\n\"}}{}", "x".repeat(10_000));
        let ranked = [long.as_str(), "_default", "acme"];
        labels.update(&ranked, 3, |l| l == "_default" || l == "acme");
        let values = labels.values();
        assert_eq!(values.len(), 1, "{values:?}");
        let value = &values[0];
        assert!(value.len() < MAX_LABEL_VALUE + 32, "{value}");
        assert!(!value.chars().any(char::is_control), "{value:?}");
        assert!(value.starts_with("evil\\u{1b}[31m \"}x"), "{value}");
        // Two names cut to the same value: one label value, not two series of one name.
        let a = format!("{}a", "y".repeat(500));
        let b = format!("{}b", "y".repeat(500));
        let mut labels = LaggardLabels::default();
        labels.update(&[&a, &b], 2, |_| false);
        assert_eq!(labels.values().len(), 1);
        assert!(labels.of_name(&a).is_some() && labels.of_name(&b).is_none());
    }
}
