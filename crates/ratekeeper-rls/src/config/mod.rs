//! The rate limit configuration: envoyproxy/ratelimit's YAML files, read unchanged.
//!
//! A config is one or more YAML files, each with a `domain` and a tree of `descriptors`:
//!
//! ```yaml
//! domain: api
//! descriptors:
//!   - key: user            # any value of `user`: one counter per value
//!     rate_limit: { unit: minute, requests_per_unit: 60 }
//!     descriptors:
//!       - key: path
//!         value: /login    # (user, *), (path, /login): its own limit
//!         rate_limit: { unit: second, requests_per_unit: 1 }
//!   - key: path
//!     value: "/static/*"   # a wildcard; `share_threshold`: one counter for all matches
//!     share_threshold: true
//!     rate_limit: { unit: second, requests_per_unit: 100 }
//! ```
//!
//! [`RateLimitConfig::lookup`] finds the rule for one request descriptor (its `(key, value)`
//! entries, in order): at each level the exact `(key, value)` wins, then the wildcard values of
//! that key in config order (each `*` matches any run of characters, also an empty one), then
//! the descriptor of that key without a value. A rule applies only when it sits on the node
//! that the request's *last* entry matched. The request's entries are matched structurally,
//! as pairs: see the [`compat`](crate::compat) module for this and every other difference from
//! the reference.
//!
//! ```
//! use ratekeeper_rls::config::{LoadOptions, Lookup, RateLimitConfig, Unit};
//!
//! let yaml = r#"
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit: { unit: minute, requests_per_unit: 60 }
//!   - key: path
//!     value: "/static/*"
//!     share_threshold: true
//!     rate_limit: { unit: second, requests_per_unit: 100 }
//! "#;
//! let config = RateLimitConfig::from_sources([("api.yaml", yaml)], &LoadOptions::default())?;
//!
//! let Lookup::Limit(m) = config.lookup("api", &[("user", "alice")]) else { panic!() };
//! assert_eq!((m.rule.requests_per_unit, m.rule.unit), (60, Unit::Minute));
//! assert_eq!(m.stats_key(), "api.user");
//!
//! // Two files under one wildcard with `share_threshold` share one counter.
//! let Lookup::Limit(a) = config.lookup("api", &[("path", "/static/a.css")]) else { panic!() };
//! let Lookup::Limit(b) = config.lookup("api", &[("path", "/static/b.js")]) else { panic!() };
//! assert_eq!(a.counter_key(), b.counter_key());
//!
//! assert!(matches!(config.lookup("api", &[("path", "/login")]), Lookup::NoLimit));
//! assert!(matches!(config.lookup("web", &[("user", "alice")]), Lookup::DomainNotFound));
//! # Ok::<(), ratekeeper_rls::config::ConfigError>(())
//! ```
//!
//! # YAML reading
//!
//! Plain (unquoted) scalars are read as YAML 1.1, like the reference's parser (yaml.v2):
//! `yes`/`no`/`on`/`off`/`y`/`n` are booleans, `0x1F`, `010` (octal) and `1_000` are integers.
//! A string field (`key`, `value`, `name`, `unit`, `domain`) takes the text of any scalar as
//! written, so `value: 010` is the string `010` and `value: yes` the string `yes`. A float
//! leaf (`value: 1.5`) is an error outside `metadata`: quote it. Quoted scalars are always
//! strings, so `shadow_mode: "true"` is an error (a bool field needs a boolean).

mod error;
mod load;
mod lookup;
mod parse;
mod rule;
pub mod watch;
mod yaml;

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

pub use error::{ConfigError, ConfigErrorKind, Position};
pub use lookup::{Lookup, Match};
pub use rule::{Algorithm, Charging, OnStoreFailure, RateLimitRule, Unit, UnitParseError};

/// How files are read and combined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Files with the same `domain` are merged into one descriptor tree instead of being an
    /// error (`MERGE_DOMAIN_CONFIG=true`). A descriptor defined twice is still an error.
    pub merge_domains: bool,
    /// Files whose name starts with `.` are skipped when a directory is read
    /// (`RUNTIME_IGNOREDOTFILES=true`).
    pub ignore_dotfiles: bool,
}

impl LoadOptions {
    /// The options with `merge_domains` set.
    pub fn merge_domains(mut self, yes: bool) -> Self {
        self.merge_domains = yes;
        self
    }

    /// The options with `ignore_dotfiles` set.
    pub fn ignore_dotfiles(mut self, yes: bool) -> Self {
        self.ignore_dotfiles = yes;
        self
    }
}

/// Something in a config that loads but is probably not what its author meant: a key that has
/// no effect where it is written (`requests_per_unit` beside `rate_limit` instead of inside
/// it), a file in the config directory that is not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigWarning {
    /// The file.
    pub file: String,
    /// The place in the file, when there is one.
    pub position: Option<Position>,
    /// What is odd.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.column, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A loaded rate limit configuration: every domain and its descriptor tree.
///
/// Immutable; `Clone` is an `Arc` clone, so a server swaps whole snapshots on reload.
/// `Serialize` gives the config in force as JSON (domains in name order, descriptors in file
/// order), for a `/rlconfig`-style endpoint:
/// `{"domains":[{"domain":"api","descriptors":[{"key":"user","rate_limit":{..},..}]}]}`.
#[derive(Clone, Default)]
pub struct RateLimitConfig {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    domains: BTreeMap<String, Domain>,
    warnings: Vec<ConfigWarning>,
}

#[derive(Debug)]
struct Domain {
    /// The file that defined the domain first.
    file: String,
    level: Level,
    /// `charging:` of its file(s).
    charging: Charging,
}

/// One level of the descriptor tree: its descriptors in config order, and an index by key.
#[derive(Debug, Default)]
pub(crate) struct Level {
    pub(crate) nodes: Vec<Descriptor>,
    pub(crate) index: HashMap<String, KeyIndex>,
}

/// The descriptors of one key at one level.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    /// By exact value (wildcard values too, as written).
    pub(crate) exact: HashMap<String, usize>,
    /// Descriptors whose value has a `*`, in config order.
    pub(crate) wildcards: Vec<usize>,
    /// The descriptor without a value.
    pub(crate) default: Option<usize>,
}

/// One config descriptor.
#[derive(Debug, Serialize)]
pub(crate) struct Descriptor {
    pub(crate) key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<String>,
    /// The value split on `*` when it has one.
    #[serde(skip)]
    pub(crate) pattern: Option<Vec<String>>,
    #[serde(rename = "rate_limit", skip_serializing_if = "Option::is_none")]
    pub(crate) rule: Option<RateLimitRule>,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) value_to_metric: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) share_threshold: bool,
    #[serde(rename = "descriptors", skip_serializing_if = "Level::is_empty")]
    pub(crate) children: Level,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Level {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether a descriptor with this key and value (`None`: no value) is already here.
    pub(crate) fn contains(&self, key: &str, value: Option<&str>) -> bool {
        self.index.get(key).is_some_and(|idx| match value {
            None => idx.default.is_some(),
            Some(v) => idx.exact.contains_key(v),
        })
    }

    /// Adds a descriptor (the caller checked [`Level::contains`]).
    pub(crate) fn insert(&mut self, d: Descriptor) {
        let i = self.nodes.len();
        let idx = self.index.entry(d.key.clone()).or_default();
        match &d.value {
            None => idx.default = Some(i),
            Some(v) => {
                idx.exact.insert(v.clone(), i);
                if d.pattern.is_some() {
                    idx.wildcards.push(i);
                }
            }
        }
        self.nodes.push(d);
    }
}

impl Serialize for Level {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.nodes.serialize(s)
    }
}

impl Serialize for RateLimitConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct DomainOut<'a> {
            domain: &'a str,
            #[serde(skip_serializing_if = "is_per_descriptor")]
            charging: Charging,
            descriptors: &'a Level,
        }
        fn is_per_descriptor(c: &Charging) -> bool {
            *c == Charging::PerDescriptor
        }
        #[derive(Serialize)]
        struct Out<'a> {
            domains: Vec<DomainOut<'a>>,
        }
        Out {
            domains: self
                .inner
                .domains
                .iter()
                .map(|(domain, d)| DomainOut {
                    domain,
                    charging: d.charging,
                    descriptors: &d.level,
                })
                .collect(),
        }
        .serialize(s)
    }
}

impl fmt::Debug for RateLimitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitConfig")
            .field("domains", &self.inner.domains)
            .field("warnings", &self.inner.warnings)
            .finish()
    }
}

impl RateLimitConfig {
    /// Loads a file, or every `*.yaml` / `*.yml` file of a directory (not its subdirectories),
    /// in file-name order. Symbolic links are followed, so a Kubernetes ConfigMap volume
    /// (`x.yaml -> ..data/x.yaml`) reads as plain files; its `..data` directories are not read.
    ///
    /// # Errors
    ///
    /// The first error, in file-name order: a file or directory that cannot be read, or any
    /// [`from_sources`](Self::from_sources) error. Error file names are the files' paths.
    pub fn load_path(path: &Path, opts: &LoadOptions) -> Result<Self, ConfigError> {
        Self::check_path(path, opts).map_err(|mut errors| errors.swap_remove(0))
    }

    /// As [`load_path`](Self::load_path), but reports every file's first error (and every
    /// error between files), for `--validate`.
    ///
    /// # Errors
    ///
    /// At least one error, in file-name order.
    pub fn check_path(path: &Path, opts: &LoadOptions) -> Result<Self, Vec<ConfigError>> {
        let (files, warnings) = load::read_path(path, opts).map_err(|e| vec![e])?;
        load::build(
            files
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str())),
            opts,
            warnings,
        )
    }

    /// Loads YAML texts, each named (the name appears in errors and warnings), in the order
    /// given.
    ///
    /// # Errors
    ///
    /// The first error (see [`ConfigErrorKind`]): YAML syntax, a key outside the format's
    /// allow-list, a value of the wrong type, an empty domain or key, a domain in two files
    /// (unless [`LoadOptions::merge_domains`]), a descriptor defined twice, a bad unit, ...
    pub fn from_sources<'a, I>(files: I, opts: &LoadOptions) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        load::build(files, opts, Vec::new()).map_err(|mut errors| errors.swap_remove(0))
    }

    /// The domains, in name order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.inner.domains.keys().map(String::as_str)
    }

    /// Whether no domain is loaded (an empty directory, or no config yet).
    pub fn is_empty(&self) -> bool {
        self.inner.domains.is_empty()
    }

    /// What loaded but looks unintended (see [`ConfigWarning`]).
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.inner.warnings
    }

    /// How `domain`'s requests are charged (`charging:` in its file; with merged files,
    /// [`Charging::AllOrNothing`] when any of them says so). Unknown domains:
    /// [`Charging::PerDescriptor`].
    pub fn charging(&self, domain: &str) -> Charging {
        self.inner
            .domains
            .get(domain)
            .map_or(Charging::PerDescriptor, |d| d.charging)
    }

    /// Finds the rule for one request descriptor of `domain`: its `(key, value)` entries, in
    /// order. See the [module docs](self) for the matching rules.
    ///
    /// The answer borrows the config and the entries (a [`Match`] computes its keys from
    /// both), so build the entries first: `let e: Vec<(&str, &str)> = ...; config.lookup(d, &e)`.
    /// No allocation for descriptors up to four entries deep.
    pub fn lookup<'a>(&'a self, domain: &str, entries: &'a [(&'a str, &'a str)]) -> Lookup<'a> {
        match self.inner.domains.get_key_value(domain) {
            None => Lookup::DomainNotFound,
            Some((name, d)) => lookup::lookup(name, &d.level, entries),
        }
    }
}
