//! Label values whose number is bounded whatever the rows say and however many tenants are
//! configured. Rows carry free-form tenant names and a platform may configure thousands of
//! tenants, so at most `[telemetry] tenant_series` tenants have a `tenant` label value of their
//! own ([`LabelBudget`]); every other tenant (and rows without one) share [`OTHER_TENANTS`].
//!
//! Who has one: the `watched_tenants` always; the tenants configured under `[tenants.*]` while
//! they fit (watched + configured + `laggards` ≤ `tenant_series`); and, on the gauges only (the
//! backlog, paused, quarantined), the few laggards of [`super::laggards`]. [`TenantLabels`] is
//! a shared handle: the configured tenants can change at run time
//! (`Metrics::set_configured_tenants`), and every clone sees the change.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::laggards::{DEFAULT_LAGGARDS, LaggardLabels};
use crate::model::TenantId;

/// The `tenant` label value of every tenant without one of its own.
pub(crate) const OTHER_TENANTS: &str = "_default";
/// The `plugin` label value of configured tenants that share [`OTHER_TENANTS`]: each may run
/// its own plugin file, so their paths would be as many label values as tenants.
pub(crate) const OTHER_PLUGINS: &str = "_other";

/// Default `[telemetry] tenant_series`: a relay with up to 90 configured tenants labels each
/// (as before the budget existed), and its `/metrics` stays around 10,000 series.
pub(crate) const DEFAULT_TENANT_SERIES: usize = 100;
/// Most `tenant_series` one may ask for: ~100 series each (see docs/operations.md), so 1,000
/// tenants are ~100,000 series, already more than one Prometheus target should carry.
pub(crate) const MAX_TENANT_SERIES: usize = 1_000;

/// How many tenants may have a `tenant` label value of their own, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelBudget {
    /// At most this many tenants have their own label value at a time (`tenant_series`).
    pub tenant_series: usize,
    /// Always labelled by name (`watched_tenants`), configured or not.
    pub watched: BTreeSet<String>,
    /// Places kept for laggards on the gauges (`laggards`).
    pub laggards: usize,
}

impl Default for LabelBudget {
    fn default() -> Self {
        Self {
            tenant_series: DEFAULT_TENANT_SERIES,
            watched: BTreeSet::new(),
            laggards: DEFAULT_LAGGARDS,
        }
    }
}

impl LabelBudget {
    /// Places for laggards: `laggards`, but never past the budget the watched tenants leave.
    fn laggard_places(&self) -> usize {
        self.laggards
            .min(self.tenant_series.saturating_sub(self.watched.len()))
    }
}

/// Label values gained and lost by a change of the configured tenants.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelChange {
    pub(crate) gained: Vec<Arc<str>>,
    pub(crate) lost: Vec<Arc<str>>,
}

/// Maps a row's tenant to its `tenant` label value. Cloning shares the mapping.
#[derive(Debug, Clone)]
pub struct TenantLabels {
    shared: Arc<RwLock<Labelled>>,
    other: Arc<str>,
}

#[derive(Debug)]
struct Labelled {
    budget: LabelBudget,
    configured: BTreeSet<String>,
    /// Tenants with their own label value on every family: name → label value.
    own: HashMap<Arc<str>, Arc<str>>,
    /// The laggards' label values, on the gauges only.
    laggards: LaggardLabels,
}

impl Labelled {
    /// Who has their own label value under the budget with these configured tenants.
    fn own(&self) -> HashMap<Arc<str>, Arc<str>> {
        let fixed = self.budget.tenant_series - self.budget.laggard_places();
        let with_configured = self.budget.watched.union(&self.configured).count();
        let names: Box<dyn Iterator<Item = &String>> = if with_configured <= fixed {
            Box::new(self.budget.watched.union(&self.configured))
        } else {
            Box::new(self.budget.watched.iter())
        };
        names
            .map(|name| {
                let name: Arc<str> = Arc::from(name.as_str());
                (Arc::clone(&name), name)
            })
            .collect()
    }
}

impl TenantLabels {
    /// Labels for the tenants configured as `configured`, within the default budget.
    pub fn new<'a>(configured: impl IntoIterator<Item = &'a str>) -> Self {
        Self::with_budget(LabelBudget::default(), configured)
    }

    /// Labels for the tenants configured as `configured`, within `budget`.
    pub fn with_budget<'a>(
        budget: LabelBudget,
        configured: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut labelled = Labelled {
            budget,
            configured: configured.into_iter().map(str::to_owned).collect(),
            own: HashMap::new(),
            laggards: LaggardLabels::default(),
        };
        labelled.own = labelled.own();
        Self {
            shared: Arc::new(RwLock::new(labelled)),
            other: Arc::from(OTHER_TENANTS),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Labelled> {
        self.shared.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Labelled> {
        self.shared.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The label value for rows of `tenant` on every family.
    pub fn of(&self, tenant: &TenantId) -> Arc<str> {
        match tenant.name() {
            Some(name) => self.of_name(name),
            None => Arc::clone(&self.other),
        }
    }

    /// The label value for a tenant by name on every family.
    pub fn of_name(&self, name: &str) -> Arc<str> {
        self.read()
            .own
            .get(name)
            .map_or_else(|| Arc::clone(&self.other), Arc::clone)
    }

    /// The label value for a tenant by name on the gauges (`None`: rows without a tenant):
    /// its own, its laggard's, or [`OTHER_TENANTS`].
    pub fn gauge_label(&self, name: Option<&str>) -> Arc<str> {
        let Some(name) = name else {
            return Arc::clone(&self.other);
        };
        let labelled = self.read();
        labelled
            .own
            .get(name)
            .cloned()
            .or_else(|| labelled.laggards.of_name(name))
            .unwrap_or_else(|| Arc::clone(&self.other))
    }

    /// Whether `name` has its own label value on every family.
    pub fn has_own(&self, name: &str) -> bool {
        self.read().own.contains_key(name)
    }

    /// Whether `name` has a `[tenants.<name>]` entry.
    pub fn is_configured(&self, name: &str) -> bool {
        self.read().configured.contains(name)
    }

    /// Whether `value` is one of [`Self::all`].
    pub fn is_taken(&self, value: &str) -> bool {
        value == OTHER_TENANTS || self.read().own.contains_key(value)
    }

    /// The `plugin` label value of `plugin` run for `tenant`: the path itself, except for a
    /// configured tenant without its own label value ([`OTHER_PLUGINS`]). Tenants without an
    /// entry run `[plugins.default]`: one path.
    pub fn plugin_label<'a>(&self, tenant: &TenantId, plugin: &'a str) -> &'a str {
        match tenant.name() {
            Some(name) => {
                let labelled = self.read();
                if labelled.configured.contains(name) && !labelled.own.contains_key(name) {
                    OTHER_PLUGINS
                } else {
                    plugin
                }
            }
            None => plugin,
        }
    }

    /// Every label value of every family: each tenant with its own, then [`OTHER_TENANTS`].
    pub fn all(&self) -> Vec<Arc<str>> {
        let labelled = self.read();
        let mut all: Vec<Arc<str>> = labelled.own.values().cloned().collect();
        all.sort();
        if !labelled.own.contains_key(OTHER_TENANTS) {
            all.push(Arc::clone(&self.other));
        }
        all
    }

    /// Every label value of the gauges: [`Self::all`], then the laggards'.
    pub fn gauge_values(&self) -> Vec<Arc<str>> {
        let mut all = self.all();
        let laggards = self.read().laggards.values();
        for laggard in laggards {
            if !all.contains(&laggard) {
                all.push(laggard);
            }
        }
        all
    }

    /// Places for laggards on the gauges.
    pub fn laggard_places(&self) -> usize {
        self.read().budget.laggard_places()
    }

    /// Gives the laggards' label values to the worst of `ranked` (tenants without their own,
    /// worst first; see [`LaggardLabels::update`]). Returns the laggard label values given up
    /// that no tenant has now: their gauge series are to be removed.
    pub(crate) fn update_laggards(&self, ranked: &[&str]) -> Vec<Arc<str>> {
        let mut labelled = self.write();
        let labelled = &mut *labelled;
        let places = labelled.budget.laggard_places();
        let own = &labelled.own;
        let taken = |v: &str| v == OTHER_TENANTS || own.contains_key(v);
        let given_up = labelled.laggards.update(ranked, places, taken);
        given_up
            .into_iter()
            .filter(|v| !labelled.own.contains_key(&**v))
            .collect()
    }

    /// Replaces the configured tenants (at start from `[tenants.*]`; after a reload, the new
    /// set) and says which label values that gave and took away.
    pub(crate) fn set_configured<'a>(
        &self,
        configured: impl IntoIterator<Item = &'a str>,
    ) -> LabelChange {
        let mut labelled = self.write();
        labelled.configured = configured.into_iter().map(str::to_owned).collect();
        let own = labelled.own();
        let mut change = LabelChange {
            gained: own
                .values()
                .filter(|v| !labelled.own.contains_key(&***v))
                .cloned()
                .collect(),
            lost: labelled
                .own
                .values()
                .filter(|v| !own.contains_key(&***v))
                .cloned()
                .collect(),
        };
        change.gained.sort();
        change.lost.sort();
        labelled.own = own;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tenant_series: usize, watched: &[&str], laggards: usize) -> LabelBudget {
        LabelBudget {
            tenant_series,
            watched: watched.iter().map(|w| (*w).to_owned()).collect(),
            laggards,
        }
    }

    fn strings(values: &[Arc<str>]) -> Vec<String> {
        values.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn only_configured_tenants_get_their_own_label_value() {
        let labels = TenantLabels::new(["acme", "globex"]);
        assert_eq!(&*labels.of(&TenantId::named("acme")), "acme");
        assert_eq!(
            &*labels.of(&TenantId::named("row-chosen-123")),
            OTHER_TENANTS
        );
        assert_eq!(&*labels.of(&TenantId::none()), OTHER_TENANTS);
        assert_eq!(strings(&labels.all()), ["acme", "globex", OTHER_TENANTS]);
    }

    #[test]
    fn past_the_budget_only_watched_tenants_keep_their_own_label_value() {
        let names: Vec<String> = (0..5_000).map(|i| format!("t{i:04}")).collect();
        let labels = TenantLabels::with_budget(
            budget(100, &["t0042", "free-form"], 10),
            names.iter().map(String::as_str),
        );
        assert_eq!(
            strings(&labels.all()),
            ["free-form", "t0042", OTHER_TENANTS]
        );
        assert_eq!(&*labels.of(&TenantId::named("t0007")), OTHER_TENANTS);
        assert_eq!(&*labels.of(&TenantId::named("free-form")), "free-form");
        assert!(labels.is_configured("t0007") && !labels.has_own("t0007"));
        // A configured tenant sharing `_default` shares its plugin label value too; rows of
        // tenants without an entry run the default plugin, one path.
        let plugin = |t: &str| labels.plugin_label(&TenantId::named(t), "/p/x.wasm");
        assert_eq!(plugin("t0007"), OTHER_PLUGINS);
        assert_eq!(plugin("t0042"), "/p/x.wasm");
        assert_eq!(plugin("not-configured"), "/p/x.wasm");
        assert_eq!(labels.laggard_places(), 10);
    }

    #[test]
    fn configured_tenants_gain_and_lose_their_label_values_as_they_fit_the_budget() {
        let labels = TenantLabels::with_budget(budget(5, &["w"], 2), ["a", "b"]);
        assert_eq!(strings(&labels.all()), ["a", "b", "w", OTHER_TENANTS]);
        let shared = labels.clone();
        // w + a, b, c: 4 > 5 - 2 places for laggards. Only the watched one keeps its own.
        let change = labels.set_configured(["a", "b", "c"]);
        assert_eq!(strings(&change.lost), ["a", "b"]);
        assert!(change.gained.is_empty());
        assert_eq!(
            strings(&shared.all()),
            ["w", OTHER_TENANTS],
            "clones share it"
        );
        let change = labels.set_configured(["c", "w"]);
        assert_eq!(strings(&change.gained), ["c"]);
        assert!(change.lost.is_empty());
        assert_eq!(strings(&shared.all()), ["c", "w", OTHER_TENANTS]);
    }

    #[test]
    fn laggards_are_labelled_on_the_gauges_only_and_within_the_budget() {
        let labels = TenantLabels::with_budget(budget(4, &["w"], 2), ["c1", "c2", "c3"]);
        // 4 - 2 places for laggards leave 2: the watched and three configured do not fit.
        assert_eq!(labels.laggard_places(), 2);
        let given_up = labels.update_laggards(&["c2", "x", "y"]);
        assert!(given_up.is_empty());
        assert_eq!(&*labels.gauge_label(Some("c2")), "c2");
        assert_eq!(&*labels.of_name("c2"), OTHER_TENANTS, "counters stay");
        assert_eq!(&*labels.gauge_label(Some("y")), OTHER_TENANTS);
        assert_eq!(
            strings(&labels.gauge_values()),
            ["w", OTHER_TENANTS, "c2", "x"]
        );
        // c2 alone is configured now and fits: its laggard label value becomes its own, and
        // is not given up as a series.
        labels.set_configured(["c2"]);
        let given_up = labels.update_laggards(&["x"]);
        assert!(given_up.is_empty(), "{given_up:?}");
        assert_eq!(
            strings(&labels.gauge_values()),
            ["c2", "w", OTHER_TENANTS, "x"]
        );
    }
}
