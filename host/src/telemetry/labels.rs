//! Label values whose number is bounded whatever the rows say. Rows carry free-form tenant
//! names, so only tenants configured under `[tenants.*]` get their own `tenant` label value;
//! every other tenant (and rows without one) share [`OTHER_TENANTS`] — but for the backlog
//! gauges' few laggards (see [`super::laggards`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::TenantId;

/// The `tenant` label value of every tenant without its own `[tenants.<name>]` entry.
pub(crate) const OTHER_TENANTS: &str = "_default";

/// Maps a row's tenant to its `tenant` label value.
#[derive(Debug, Clone)]
pub struct TenantLabels {
    configured: HashMap<Arc<str>, Arc<str>>,
    other: Arc<str>,
}

impl TenantLabels {
    pub fn new<'a>(configured: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            configured: configured
                .into_iter()
                .map(|name| (Arc::from(name), Arc::from(name)))
                .collect(),
            other: Arc::from(OTHER_TENANTS),
        }
    }

    /// The label value for rows of `tenant`.
    pub fn of(&self, tenant: &TenantId) -> Arc<str> {
        match tenant.name() {
            Some(name) => self.of_name(name),
            None => Arc::clone(&self.other),
        }
    }

    /// The label value for a tenant by name (`None`: rows without a tenant).
    pub fn of_name(&self, name: &str) -> Arc<str> {
        self.configured
            .get(name)
            .map_or_else(|| Arc::clone(&self.other), Arc::clone)
    }

    /// Whether `name` has a `[tenants.<name>]` entry, and so its own label value.
    pub fn is_configured(&self, name: &str) -> bool {
        self.configured.contains_key(name)
    }

    /// Whether `value` is one of [`Self::all`].
    pub fn is_taken(&self, value: &str) -> bool {
        self.configured.contains_key(value) || value == OTHER_TENANTS
    }

    /// Every label value there can be: each configured tenant, then [`OTHER_TENANTS`].
    pub fn all(&self) -> Vec<Arc<str>> {
        let mut all: Vec<Arc<str>> = self.configured.values().cloned().collect();
        all.sort();
        if !self.configured.contains_key(OTHER_TENANTS) {
            all.push(Arc::clone(&self.other));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_tenants_get_their_own_label_value() {
        let labels = TenantLabels::new(["acme", "globex"]);
        assert_eq!(&*labels.of(&TenantId::named("acme")), "acme");
        assert_eq!(
            &*labels.of(&TenantId::named("row-chosen-123")),
            OTHER_TENANTS
        );
        assert_eq!(&*labels.of(&TenantId::none()), OTHER_TENANTS);
        let all: Vec<String> = labels.all().iter().map(|l| l.to_string()).collect();
        assert_eq!(all, ["acme", "globex", OTHER_TENANTS]);
    }
}
