//! The outbox's backlog as the app's sampler reads it: due rows, the age of the oldest due
//! row and dead rows, per tenant label value.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::TenantLabel;
use crate::telemetry::TenantLabels;

/// One tenant's unsent rows, as the sampler read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantSample {
    /// Rows due now.
    pub due: i64,
    /// Age of the oldest due row, in seconds (0 when none is due).
    pub oldest_due_age_seconds: f64,
    pub dead: i64,
}

/// The sampled gauges: every tenant label value has a series from start-up.
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

    /// Replaces the sampled gauges: tenants missing from `samples` read 0.
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
        for tenant in self.tenants.all() {
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
