//! Trusted keys per tenant: which minisign keys may sign which tenant's plugin.
//!
//! `trusted_keys` in `[tenants.<name>]` (or `[plugins.default]`) *replaces* `[plugins]
//! trusted_keys` for that section's plugin: only its own keys may sign it. A platform that runs
//! tenant-authored code gives each tenant's build pipeline its own key; that key then signs
//! for that tenant alone, and a file signed by it is refused for every other tenant (named,
//! with the section that does trust the key), even when it is the same file. Scoping per
//! section rather than per key (`key → tenants it may sign for`) keeps a tenant's whole trust
//! decision in its own entry, next to its `path` and `sha256`: onboarding a tenant, or rotating
//! its key, touches that entry only, and reading one entry says who may ship code for it.
//!
//! The keys go with `path`, as a `sha256` pin does: a tenant that runs `[plugins.default]`'s
//! plugin takes the default's keys, a tenant with its own `path` its own (or, without any, the
//! global ones). Every signature is verified once per file, against every configured key
//! ([`crate::plugin::supply::PluginSupply`]); whether *that* signer may run the file for a
//! tenant is decided per tenant, where its instance is made ([`KeyScope::refuses`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::plugin::settings::{PluginSpec, PluginsSettings};
use crate::plugin::supply::{Signer, TrustedKeys};
use crate::problem::Problem;

/// Where `[plugins] trusted_keys` is named in messages.
const GLOBAL: &str = "[plugins] trusted_keys";

/// The keys that may sign one section's plugin, and where they are configured.
#[derive(Debug)]
pub(crate) struct KeyScope {
    /// `[plugins] trusted_keys`, `plugins.default.trusted_keys` or `tenants.<name>.trusted_keys`.
    origin: String,
    /// The key ids, as minisign prints them.
    ids: Vec<String>,
    /// Every key id configured anywhere → the sections that trust it, to name the owner of a
    /// key a plugin was refused for.
    owners: Arc<BTreeMap<String, Vec<String>>>,
}

impl KeyScope {
    /// Why a plugin signed by `signer` (`None`: not signed) may not run under this scope.
    pub(crate) fn refuses(&self, signer: Option<&Signer>) -> Option<String> {
        let ids = self.ids.join(", ");
        let Some(signer) = signer else {
            return Some(format!(
                "not signed, and {} requires a signature by one of its keys ({ids})",
                self.origin
            ));
        };
        if self.ids.contains(&signer.key_id) {
            return None;
        }
        let owner = match self.owners.get(&signer.key_id) {
            Some(sections) => format!(" (a key of {})", sections.join(", ")),
            None => String::new(),
        };
        Some(format!(
            "signed by key {}{owner}, which is not in {} ({ids})",
            signer.key_id, self.origin
        ))
    }

    /// Where the keys are configured.
    #[cfg(test)]
    fn origin(&self) -> &str {
        &self.origin
    }
}

/// Where a list of keys is configured.
enum Section<'a> {
    Global,
    Default,
    Tenant(&'a str),
}

/// The scopes of `[plugins]`, `[plugins.default]` and every `[tenants.<name>]`.
#[derive(Debug, Default)]
pub(crate) struct KeyScopes {
    global: Option<Arc<KeyScope>>,
    default: Option<Arc<KeyScope>>,
    tenants: HashMap<String, Arc<KeyScope>>,
    /// The sections' own key entries, as written (the supply verifies signatures by them).
    scoped: Vec<String>,
}

impl KeyScopes {
    /// Reads every section's keys (config validation has checked them; a bad one is an error
    /// here too, at its key).
    pub(crate) fn new(
        plugins: &PluginsSettings,
        tenants: &BTreeMap<String, PluginSpec>,
    ) -> Result<Self, Problem> {
        // (which section, its name in messages, its entries)
        let mut sections: Vec<(Section, String, &[String])> = Vec::new();
        if !plugins.trusted_keys.is_empty() {
            sections.push((Section::Global, GLOBAL.to_owned(), &plugins.trusted_keys));
        }
        if let Some(keys) = plugins
            .default
            .as_ref()
            .and_then(|d| d.trusted_keys.as_ref())
        {
            let origin = "plugins.default.trusted_keys".to_owned();
            sections.push((Section::Default, origin, keys));
        }
        for (name, spec) in tenants {
            if let Some(keys) = &spec.trusted_keys {
                let origin = format!("tenants.{name}.trusted_keys");
                sections.push((Section::Tenant(name), origin, keys));
            }
        }
        let mut ids_of: Vec<Vec<String>> = Vec::with_capacity(sections.len());
        let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (section, origin, entries) in &sections {
            let ids: Vec<String> = TrustedKeys::parse(entries)
                .map_err(|(at, message)| {
                    let key = match section {
                        Section::Global => "plugins.trusted_keys",
                        Section::Default | Section::Tenant(_) => origin.as_str(),
                    };
                    Problem::new(format!("{key}[{at}]"), message)
                })?
                .ids()
                .map(str::to_owned)
                .collect();
            for id in &ids {
                owners.entry(id.clone()).or_default().push(origin.clone());
            }
            ids_of.push(ids);
        }
        let owners = Arc::new(owners);
        let mut scopes = Self::default();
        for ((section, origin, entries), ids) in sections.into_iter().zip(ids_of) {
            let scope = Arc::new(KeyScope {
                origin,
                ids,
                owners: Arc::clone(&owners),
            });
            match section {
                Section::Global => scopes.global = Some(scope),
                Section::Default => {
                    scopes.scoped.extend(entries.iter().cloned());
                    scopes.default = Some(scope);
                }
                Section::Tenant(name) => {
                    scopes.scoped.extend(entries.iter().cloned());
                    scopes.tenants.insert(name.to_owned(), scope);
                }
            }
        }
        Ok(scopes)
    }

    /// The key entries of sections with their own `trusted_keys`.
    pub(crate) fn scoped_entries(&self) -> &[String] {
        &self.scoped
    }

    /// The scope of `[plugins.default]`'s plugin: its own keys, else the global ones; `None`
    /// when neither is set (nothing is checked for it).
    pub(crate) fn for_default(&self) -> Option<Arc<KeyScope>> {
        self.default.clone().or_else(|| self.global.clone())
    }

    /// The scope of tenant `name`'s plugin, `spec` being its entry as written: its own keys;
    /// running the default plugin, the default's scope; else the global keys.
    pub(crate) fn for_tenant(&self, name: &str, spec: &PluginSpec) -> Option<Arc<KeyScope>> {
        if let Some(own) = self.tenants.get(name) {
            return Some(Arc::clone(own));
        }
        match spec.names_plugin() {
            true => self.global.clone(),
            false => self.for_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two keys Debian's minisign 0.11 generated (supply/signature.rs uses the first), and
    // minisign README's example key.
    const ACME: &str = "RWSXbzj3Sn2MjGwbwAN4UYQ5yBfHQ1Ceev5EklGh0X4eYQFklU+3mWZk";
    const ACME_ID: &str = "8C8C7D4AF7386F97";
    const PLATFORM: &str = "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3";

    fn id_of(key: &str) -> String {
        TrustedKeys::parse(&[key.to_owned()])
            .unwrap()
            .ids()
            .next()
            .unwrap()
            .to_owned()
    }

    fn signer(id: &str) -> Signer {
        Signer {
            key_id: id.to_owned(),
            trusted_comment: String::new(),
        }
    }

    fn scopes_of(plugins: &str, tenants: &str) -> (KeyScopes, BTreeMap<String, PluginSpec>) {
        let plugins: PluginsSettings = toml::from_str(plugins).unwrap();
        let tenants: BTreeMap<String, PluginSpec> = toml::from_str(tenants).unwrap();
        (KeyScopes::new(&plugins, &tenants).unwrap(), tenants)
    }

    #[test]
    fn a_tenants_own_keys_replace_the_global_ones_and_name_the_owner_of_a_foreign_key() {
        let (scopes, tenants) = scopes_of(
            &format!("trusted_keys = [\"{PLATFORM}\"]\n"),
            &format!(
                "[acme]\npath = \"shared.wasm\"\ntrusted_keys = [\"{ACME}\"]\n\
                 [beta]\npath = \"shared.wasm\"\n"
            ),
        );
        assert_eq!(scopes.scoped_entries(), [ACME.to_owned()]);
        let acme = scopes.for_tenant("acme", &tenants["acme"]).unwrap();
        let beta = scopes.for_tenant("beta", &tenants["beta"]).unwrap();
        assert_eq!(acme.origin(), "tenants.acme.trusted_keys");
        assert_eq!(beta.origin(), GLOBAL);
        // acme's key signs for acme only; the platform key does not sign for acme.
        assert_eq!(acme.refuses(Some(&signer(ACME_ID))), None);
        let refused = beta.refuses(Some(&signer(ACME_ID))).unwrap();
        assert_eq!(
            refused,
            format!(
                "signed by key {ACME_ID} (a key of tenants.acme.trusted_keys), which is not in \
                 [plugins] trusted_keys ({})",
                id_of(PLATFORM)
            )
        );
        let refused = acme.refuses(Some(&signer(&id_of(PLATFORM)))).unwrap();
        assert!(
            refused.contains("(a key of [plugins] trusted_keys), which is not in tenants.acme"),
            "{refused}"
        );
        assert_eq!(beta.refuses(Some(&signer(&id_of(PLATFORM)))), None);
        // Unsigned, or by a key nobody configured.
        let refused = acme.refuses(None).unwrap();
        assert!(
            refused.starts_with("not signed, and tenants.acme.trusted_keys requires"),
            "{refused}"
        );
        let refused = acme.refuses(Some(&signer("1234"))).unwrap();
        assert!(
            refused.starts_with("signed by key 1234, which"),
            "{refused}"
        );
    }

    #[test]
    fn the_keys_go_with_the_plugin_the_tenant_runs() {
        let (scopes, tenants) = scopes_of(
            &format!(
                "trusted_keys = [\"{PLATFORM}\"]\n[default]\npath = \"d.wasm\"\n\
                 trusted_keys = [\"{ACME}\"]\n"
            ),
            "[follows]\nmemory_mb = 16\n[own]\npath = \"own.wasm\"\n",
        );
        let default = scopes.for_default().unwrap();
        assert_eq!(default.origin(), "plugins.default.trusted_keys");
        let follows = scopes.for_tenant("follows", &tenants["follows"]).unwrap();
        assert_eq!(follows.origin(), "plugins.default.trusted_keys");
        let own = scopes.for_tenant("own", &tenants["own"]).unwrap();
        assert_eq!(own.origin(), GLOBAL);
    }

    #[test]
    fn without_any_keys_nothing_is_checked() {
        let (scopes, tenants) = scopes_of("", "[acme]\npath = \"a.wasm\"\n");
        assert!(scopes.for_default().is_none());
        assert!(scopes.for_tenant("acme", &tenants["acme"]).is_none());
        // Only one tenant with keys: the others (no global keys) are not checked either.
        let (scopes, tenants) = scopes_of(
            "",
            &format!(
                "[acme]\npath = \"a.wasm\"\ntrusted_keys = [\"{ACME}\"]\n[beta]\npath = \"b.wasm\"\n"
            ),
        );
        assert!(scopes.for_tenant("acme", &tenants["acme"]).is_some());
        assert!(scopes.for_tenant("beta", &tenants["beta"]).is_none());
    }

    #[test]
    fn a_bad_key_is_named_at_its_section() {
        let plugins = PluginsSettings::default();
        let tenants: BTreeMap<String, PluginSpec> = toml::from_str(&format!(
            "[acme]\npath = \"a.wasm\"\ntrusted_keys = [\"{ACME}\", \"nope\"]\n"
        ))
        .unwrap();
        let problem = KeyScopes::new(&plugins, &tenants).unwrap_err();
        assert!(
            problem
                .to_string()
                .starts_with("tenants.acme.trusted_keys[1]: not a minisign public key"),
            "{problem}"
        );
    }
}
