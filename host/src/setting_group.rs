//! Setting groups declared once. A group is a set of keys with their defaults: keys that
//! sections share and inherit key by key (a tenant's sandbox limits and message formats from
//! `[plugins.default]`), or a section read as it is (`[plugins]`, `[relay.retry]`).
//! [`setting_group!`] writes, from one line per key, the struct as written (every key
//! optional), the struct of values with Sluice's defaults filled in, the inheritance (`or`),
//! each key's own check, how a section reads the keys (so a section can hold several groups
//! and still refuse an unknown key at its line, naming every key it knows), and the key's row
//! of docs/configuration.md (each group's tests hold the docs to it). Adding a key is one
//! line plus its use.

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess};

/// One key's row in docs/configuration.md: `| key | default | purpose |` (the reference is
/// checked against it by each group's tests).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyDoc {
    /// The key, e.g. `memory_mb`.
    pub key: &'static str,
    /// The default as the docs write it (`` `128` ``, `any topic`).
    pub default: &'static str,
    /// What it is for: the key's doc comment, joined into one line.
    pub purpose: &'static str,
}

#[cfg(test)]
impl KeyDoc {
    /// The markdown table row.
    pub(crate) fn row(&self) -> String {
        format!(
            "| `{}` | {} | {} |",
            self.key,
            self.default,
            self.purpose.trim()
        )
    }
}

/// The docs rows of `docs` as one block, unless `reference` holds that block as it is
/// (for each group's test that docs/configuration.md is its declaration's).
#[cfg(test)]
pub(crate) fn undocumented(reference: &str, docs: &[KeyDoc]) -> Option<String> {
    let block = docs.iter().map(KeyDoc::row).collect::<Vec<_>>().join("\n");
    (!reference.contains(&format!("\n{block}\n"))).then_some(block)
}

/// What [`setting_group!`] implements for each group.
pub(crate) trait SettingGroup: Default {
    /// The group's keys, in declaration order.
    const KEYS: &'static [&'static str];

    /// Reads `key`'s value from `map` into this group when `key` is one of its keys;
    /// `Ok(false)`: not one of them (the value is left unread).
    fn read_key<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error>;

    /// Each key's row of docs/configuration.md, in declaration order.
    #[cfg(test)]
    fn docs() -> Vec<KeyDoc>;
}

/// Reads a section's key, refusing one that is not among `.0` while the key is being read, so
/// the parser places the error at the key (line and column) as serde's derived
/// `deny_unknown_fields` does.
pub(crate) struct KnownKey(pub(crate) &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KnownKey {
    type Value = &'static str;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl de::Visitor<'_> for KnownKey {
    type Value = &'static str;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        self.0
            .iter()
            .find(|known| **known == key)
            .copied()
            .ok_or_else(|| E::unknown_field(key, self.0))
    }
}

/// Deserializes a section made of `G` alone, refusing keys that are not `G`'s (serde's
/// "unknown field …, expected one of …" naming every key), as `#[serde(deny_unknown_fields)]`
/// would.
pub(crate) fn deserialize_group<'de, G, D>(
    deserializer: D,
    name: &'static str,
) -> Result<G, D::Error>
where
    G: SettingGroup,
    D: Deserializer<'de>,
{
    struct Visitor<G>(&'static str, std::marker::PhantomData<G>);
    impl<'de, G: SettingGroup> de::Visitor<'de> for Visitor<G> {
        type Value = G;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "struct {}", self.0)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<G, A::Error> {
            let mut group = G::default();
            while let Some(key) = map.next_key_seed(KnownKey(G::KEYS))? {
                group.read_key(key, &mut map)?;
            }
            Ok(group)
        }
    }
    deserializer.deserialize_struct(name, G::KEYS, Visitor(name, std::marker::PhantomData))
}

/// The keys of several groups (and a section's own) as one list, for the "expected one of"
/// of an unknown key: `N` must be their total.
pub(crate) const fn concat_keys<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut all = [""; N];
    let (mut part, mut at) = (0, 0);
    while part < parts.len() {
        let mut i = 0;
        while i < parts[part].len() {
            all[at] = parts[part][i];
            at += 1;
            i += 1;
        }
        part += 1;
    }
    assert!(at == N, "concat_keys: N is not the number of keys");
    all
}

/// Check: not zero ("must be greater than 0").
pub(crate) fn above_zero<T: Default + PartialEq>(value: &T) -> Result<(), String> {
    match *value == T::default() {
        true => Err("must be greater than 0".into()),
        false => Ok(()),
    }
}

/// Check: not zero, said of a count ("must be at least 1").
pub(crate) fn at_least_one<T: Default + PartialEq>(value: &T) -> Result<(), String> {
    match *value == T::default() {
        true => Err("must be at least 1".into()),
        false => Ok(()),
    }
}

/// A duration written as humantime text (`"500ms"`, `"30s"`), for `key: Duration as
/// Humantime` in a group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Humantime(pub(crate) std::time::Duration);

impl<'de> Deserialize<'de> for Humantime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        humantime_serde::deserialize(d).map(Humantime)
    }
}

impl From<Humantime> for std::time::Duration {
    fn from(h: Humantime) -> Self {
        h.0
    }
}

/// Declares a setting group: the struct as written (`Option` per key), the struct of values
/// (defaults filled in; a key without a default stays an `Option`), [`SettingGroup`], `or`,
/// `values` and `problems` on both. The values struct deserialises too (keys left out take
/// their defaults), for a section that is read as it is rather than inherited. One line per
/// key:
///
/// ```text
/// /// What it is for (becomes the docs row's purpose).
/// key: Type [as ReadAs] [= default] => "docs default" [, check function];
/// ```
///
/// `ReadAs` is a type the value is read as and converted from (e.g. [`Humantime`]); `check`
/// is a `fn(&Type) -> Result<(), String>`, reported at `section.key`. Checks between keys
/// are the section's own code.
macro_rules! setting_group {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $values:ident {
            $(
                $(#[doc = $doc:literal])*
                $key:ident : $ty:ty $(as $read_as:ty)? $(= $default:expr)? => $doc_default:literal
                    $(, check $check:expr)?;
            )*
        }
    ) => {
        // Each optional part as one bracketed token, so the next step can tell them apart.
        $crate::setting_group::setting_group! { @declare
            [$(#[$meta])*] $vis $name $values
            $( [$(#[doc = $doc])*] $key [$ty] [$($read_as)?] [$($default)?] $doc_default [$($check)?] )*
        }
    };
    (@declare [$($meta:tt)*] $vis:vis $name:ident $values:ident
        $( [$(#[doc = $doc:literal])*] $key:ident [$ty:ty] $read_as:tt $default:tt
           $doc_default:literal $check:tt )*
    ) => {
        $($meta)*
        #[derive(Debug, Clone, Default, PartialEq)]
        $vis struct $name {
            $( $(#[doc = $doc])* $vis $key: Option<$ty>, )*
        }

        #[doc = concat!("[`", stringify!($name), "`] with Sluice's defaults filled in.")]
        #[derive(Debug, Clone, PartialEq)]
        $vis struct $values {
            $( $(#[doc = $doc])* $vis $key: $crate::setting_group::setting_group!(@value_type $ty, $default), )*
        }

        #[allow(dead_code, unused_variables, unused_mut)]
        impl $name {
            /// Fills the keys left unset from `fallback`.
            $vis fn or(self, fallback: &Self) -> Self {
                Self { $( $key: self.$key.or_else(|| fallback.$key.clone()), )* }
            }

            /// The values, defaults filled in.
            $vis fn values(&self) -> $values {
                $values {
                    $( $key: $crate::setting_group::setting_group!(@value self.$key.clone(), $default), )*
                }
            }

            /// What is wrong with each key on its own, at `section.key`.
            $vis fn key_problems(&self, section: &str) -> Vec<$crate::problem::Problem> {
                let mut problems = Vec::new();
                $( $crate::setting_group::setting_group!(
                    @check problems, section, $key, self.$key, [], $check); )*
                problems
            }
        }

        #[allow(dead_code, unused_variables, unused_mut)]
        impl $values {
            /// What is wrong with each key on its own, at `section.key`.
            $vis fn key_problems(&self, section: &str) -> Vec<$crate::problem::Problem> {
                let mut problems = Vec::new();
                $( $crate::setting_group::setting_group!(
                    @check problems, section, $key, self.$key, $default, $check); )*
                problems
            }
        }

        impl Default for $values {
            fn default() -> Self {
                $name::default().values()
            }
        }

        impl $crate::setting_group::SettingGroup for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];

            fn read_key<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                match key {
                    $(stringify!($key) => {
                        self.$key = Some($crate::setting_group::setting_group!(@read map, $ty, $read_as));
                        Ok(true)
                    })*
                    _ => Ok(false),
                }
            }

            #[cfg(test)]
            fn docs() -> Vec<$crate::setting_group::KeyDoc> {
                vec![$($crate::setting_group::KeyDoc {
                    key: stringify!($key),
                    default: $doc_default,
                    purpose: concat!($($doc),*),
                }),*]
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::setting_group::deserialize_group(d, stringify!($name))
            }
        }

        impl<'de> serde::Deserialize<'de> for $values {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::setting_group::deserialize_group::<$name, D>(d, stringify!($values))
                    .map(|written| written.values())
            }
        }
    };
    (@value_type $ty:ty, []) => { Option<$ty> };
    (@value_type $ty:ty, [$default:expr]) => { $ty };
    (@value $value:expr, []) => { $value };
    (@value $value:expr, [$default:expr]) => { $value.unwrap_or($default) };
    (@read $map:ident, $ty:ty, []) => { $map.next_value::<$ty>()? };
    (@read $map:ident, $ty:ty, [$read_as:ty]) => { <$ty>::from($map.next_value::<$read_as>()?) };
    // A key without a check; a key that is an `Option` (as written, or without a default);
    // a key with its value.
    (@check $problems:ident, $section:ident, $key:ident, $value:expr, $default:tt, []) => {};
    (@check $problems:ident, $section:ident, $key:ident, $value:expr, [], [$check:expr]) => {
        if let Some(value) = &$value
            && let Err(message) = ($check)(value)
        {
            $problems.push($crate::problem::Problem::new(
                format!("{}.{}", $section, stringify!($key)),
                message,
            ));
        }
    };
    (@check $problems:ident, $section:ident, $key:ident, $value:expr, [$default:expr], [$check:expr]) => {
        if let Err(message) = ($check)(&$value) {
            $problems.push($crate::problem::Problem::new(
                format!("{}.{}", $section, stringify!($key)),
                message,
            ));
        }
    };
}

pub(crate) use setting_group;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn positive(v: &u64) -> Result<(), String> {
        match v {
            0 => Err("must be greater than 0".into()),
            _ => Ok(()),
        }
    }

    setting_group! {
        /// A group for the tests.
        pub(crate) struct Sample => SampleValues {
            /// A size,
            /// in two lines.
            size: u64 = 7 => "`7`", check positive;
            /// A wait.
            wait: Duration as Humantime = Duration::from_secs(1) => "`\"1s\"`";
            /// Names, no default.
            names: Vec<String> => "none";
        }
    }

    #[test]
    fn a_group_reads_inherits_defaults_and_checks_each_key() {
        let own: Sample = toml::from_str("size = 3\nwait = \"250ms\"\n").unwrap();
        assert_eq!(own.size, Some(3));
        assert_eq!(own.wait, Some(Duration::from_millis(250)));
        let fallback = Sample {
            names: Some(vec!["a".into()]),
            size: Some(9),
            ..Sample::default()
        };
        let merged = own.or(&fallback).values();
        assert_eq!(
            merged,
            SampleValues {
                size: 3,
                wait: Duration::from_millis(250),
                names: Some(vec!["a".into()]),
            }
        );
        assert_eq!(SampleValues::default().size, 7);
        assert_eq!(SampleValues::default().names, None);
        let bad = Sample {
            size: Some(0),
            ..Sample::default()
        };
        let problems: Vec<String> = bad
            .key_problems("x")
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(problems, ["x.size: must be greater than 0"]);
    }

    #[test]
    fn unknown_keys_are_refused_naming_every_key() {
        let err = toml::from_str::<Sample>("sise = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `sise`, expected one of `size`, `wait`, `names`"),
            "{err}"
        );
        let err = toml::from_str::<Sample>("wait = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn docs_rows_come_from_the_declaration() {
        let rows: Vec<String> = Sample::docs().iter().map(KeyDoc::row).collect();
        assert_eq!(
            rows,
            [
                "| `size` | `7` | A size, in two lines. |",
                "| `wait` | `\"1s\"` | A wait. |",
                "| `names` | none | Names, no default. |",
            ]
        );
    }

    #[test]
    fn keys_of_several_groups_concatenate() {
        const ALL: [&str; 4] = concat_keys(&[&["own"], Sample::KEYS]);
        assert_eq!(ALL, ["own", "size", "wait", "names"]);
    }
}
