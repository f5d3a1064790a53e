//! The outbox's backlog as the app's sampler reads it: due rows, the age of the oldest due
//! row and dead rows, per gauge label value — the tenants' with their own, a few laggards'
//! (see [`crate::telemetry::laggards`]) and `_default`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::TenantLabel;
use crate::telemetry::TenantLabels;
use crate::telemetry::laggards::{Lag, worst};

/// One tenant's unsent rows, as the sampler read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantSample {
    /// Rows due now.
    pub due: i64,
    /// Age of the oldest due row, in seconds (0 when none is due).
    pub oldest_due_age_seconds: f64,
    pub dead: i64,
}

/// The sampled gauges: every label value of every family has a series from start-up (or from
/// when it is given); a laggard's while it has its label value.
#[derive(Debug)]
pub struct BacklogMetrics {
    tenants: TenantLabels,
    due_rows: Family<TenantLabel, Gauge>,
    oldest_due_age: Family<TenantLabel, Gauge<f64, AtomicU64>>,
    dead_rows: Family<TenantLabel, Gauge>,
}

impl BacklogMetrics {
    /// The gauges of `tenants`, at 0.
    pub(super) fn new(tenants: TenantLabels) -> Self {
        let m = Self {
            tenants,
            due_rows: Family::default(),
            oldest_due_age: Family::default(),
            dead_rows: Family::default(),
        };
        m.set_samples(&[]);
        m
    }

    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "outbox_due_rows",
            "Rows due now, by tenant (sampled; saturates at the sample limit)",
            self.due_rows.clone(),
        );
        r.register_with_unit(
            "outbox_oldest_due_age",
            "Age of the oldest due row, by tenant (sampled; 0 when none is due)",
            Unit::Seconds,
            self.oldest_due_age.clone(),
        );
        r.register(
            "outbox_dead_rows",
            "Dead rows, by tenant (sampled; saturates at the sample limit)",
            self.dead_rows.clone(),
        );
    }

    /// Removes the series of the label value `tenant`.
    pub(super) fn forget_tenant(&self, tenant: &Arc<str>) {
        let labels = TenantLabel {
            tenant: Arc::clone(tenant),
        };
        self.due_rows.remove(&labels);
        self.dead_rows.remove(&labels);
        self.oldest_due_age.remove(&labels);
    }

    /// Replaces the sampled gauges with one sample by tenant name (`None`: rows without a
    /// tenant): tenants with their own label value under it, the worst of the others under
    /// a laggard's (as many as [`TenantLabels::laggard_places`]), the rest summed into
    /// `_default`. A laggard that loses its label value has its series removed; its rows
    /// count into `_default` again.
    pub fn set_tenant_samples(&self, samples: &[(Option<&str>, TenantSample)]) {
        let places = self.tenants.laggard_places();
        let others = samples.iter().filter_map(|(tenant, sample)| {
            let tenant = tenant.filter(|t| !self.tenants.has_own(t))?;
            Some(Lag {
                tenant: Some(tenant),
                oldest_due_age_seconds: sample.oldest_due_age_seconds,
                due: sample.due,
            })
        });
        let ranked: Vec<&str> = worst(others, places.saturating_mul(2))
            .iter()
            .filter_map(|lag| lag.tenant)
            .collect();
        for tenant in self.tenants.update_laggards(&ranked) {
            self.forget_tenant(&tenant);
        }
        let labelled: Vec<(Arc<str>, TenantSample)> = samples
            .iter()
            .map(|(tenant, sample)| (self.tenants.gauge_label(*tenant), sample.clone()))
            .collect();
        self.set_samples(&labelled);
    }

    /// Replaces the sampled gauges by label value: label values missing from `samples` read 0.
    pub fn set_samples(&self, samples: &[(Arc<str>, TenantSample)]) {
        let mut by_label: HashMap<Arc<str>, TenantSample> = HashMap::new();
        for (label, sample) in samples {
            let sum = by_label.entry(Arc::clone(label)).or_default();
            sum.due += sample.due;
            sum.dead += sample.dead;
            sum.oldest_due_age_seconds = sum
                .oldest_due_age_seconds
                .max(sample.oldest_due_age_seconds);
        }
        for tenant in self.tenants.gauge_values() {
            let sample = by_label.remove(&tenant).unwrap_or_default();
            let labels = TenantLabel { tenant };
            self.due_rows.get_or_create(&labels).set(sample.due);
            self.dead_rows.get_or_create(&labels).set(sample.dead);
            self.oldest_due_age
                .get_or_create(&labels)
                .set(sample.oldest_due_age_seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::super::tests::sample_value;
    use super::*;
    use crate::model::TenantId;
    use crate::telemetry::labels::{LabelBudget, OTHER_TENANTS as OTHER};

    fn series(text: &str, name: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_owned())
            .collect()
    }

    #[test]
    fn the_worst_unconfigured_tenants_get_series_of_their_own_and_lose_them_when_they_catch_up() {
        let budget = |laggards| LabelBudget {
            laggards,
            ..LabelBudget::default()
        };
        let m = Metrics::new(TenantLabels::with_budget(budget(2), ["acme"]), "2.12.1");
        let names: Vec<String> = (0..50).map(|i| format!("t-{i:02}")).collect();
        let sample = |due, age| TenantSample {
            due,
            oldest_due_age_seconds: age,
            dead: 1,
        };
        let mut samples: Vec<(Option<&str>, TenantSample)> = names
            .iter()
            .map(|n| (Some(n.as_str()), sample(2, 5.0)))
            .collect();
        samples[17].1 = sample(3, 3_600.0);
        samples.push((Some("acme"), sample(4, 7_200.0)));
        samples.push((None, sample(1, 9_000.0)));
        m.backlog.set_tenant_samples(&samples);
        let text = m.encode().unwrap();
        let due = |text: &str, tenant: &str| {
            sample_value(
                text,
                &format!("sluice_outbox_due_rows{{tenant=\"{tenant}\"}}"),
            )
        };
        // acme, the two worst others (t-17, then t-00 by name among equals), `_default`.
        let due_series = series(&text, "sluice_outbox_due_rows");
        assert_eq!(due_series.len(), 4, "{due_series:?}");
        assert_eq!(due(&text, "t-17"), Some(3.0), "{text}");
        assert_eq!(due(&text, "t-00"), Some(2.0), "{text}");
        assert_eq!(due(&text, "acme"), Some(4.0));
        assert_eq!(due(&text, OTHER), Some(48.0 * 2.0 + 1.0));
        assert_eq!(
            sample_value(
                &text,
                "sluice_outbox_oldest_due_age_seconds{tenant=\"t-17\"}"
            ),
            Some(3_600.0)
        );
        assert_eq!(
            sample_value(&text, "sluice_outbox_dead_rows{tenant=\"_default\"}"),
            Some(49.0)
        );

        // t-17 caught up: its series go, its rows (dead ones) count into `_default` again.
        samples[17].1 = TenantSample {
            dead: 10,
            ..sample(0, 0.0)
        };
        m.backlog.set_tenant_samples(&samples);
        let text = m.encode().unwrap();
        for name in [
            "sluice_outbox_due_rows",
            "sluice_outbox_dead_rows",
            "sluice_outbox_oldest_due_age_seconds",
        ] {
            let all = series(&text, name);
            assert_eq!(all.len(), 4, "{all:?}");
            assert!(!all.iter().any(|s| s.contains("t-17")), "{all:?}");
        }
        assert_eq!(due(&text, "t-00"), Some(2.0), "kept: {text}");
        assert_eq!(due(&text, "t-01"), Some(2.0), "the free place: {text}");
        assert_eq!(
            sample_value(&text, "sluice_outbox_dead_rows{tenant=\"_default\"}"),
            Some(47.0 + 10.0 + 1.0)
        );

        // 0 laggards: configured tenants and `_default` only.
        let m = Metrics::new(TenantLabels::with_budget(budget(0), ["acme"]), "2.12.1");
        m.backlog.set_tenant_samples(&samples);
        let text = m.encode().unwrap();
        assert_eq!(series(&text, "sluice_outbox_due_rows").len(), 2, "{text}");
        assert_eq!(due(&text, OTHER), Some(49.0 * 2.0 + 1.0));
    }

    #[test]
    fn a_sample_resets_tenants_it_no_longer_mentions() {
        let m = Metrics::new(TenantLabels::new(["acme"]), "2.12.1");
        let acme = m.tenant(&TenantId::named("acme"));
        let due = |due| TenantSample {
            due,
            oldest_due_age_seconds: 1.5,
            dead: 0,
        };
        m.backlog.set_samples(&[(Arc::clone(&acme), due(7))]);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(&text, "sluice_outbox_due_rows{tenant=\"acme\"}"),
            Some(7.0)
        );
        m.backlog.set_samples(&[]);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(&text, "sluice_outbox_due_rows{tenant=\"acme\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_outbox_oldest_due_age_seconds{tenant=\"acme\"}"
            ),
            Some(0.0)
        );
    }
}
