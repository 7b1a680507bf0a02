//! Why a config file does not load, and where.

use std::fmt;

/// A place in a file: 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Position {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1, in characters.
    pub column: u32,
}

/// A config that does not load: the file, the place in it, and what is wrong.
///
/// `Display` is `file:line:column: what is wrong` (or `file: what is wrong` for the errors
/// that have no place in a file, such as a directory that cannot be read), the form editors
/// and CI logs link to.
///
/// ```
/// use ratekeeper_rls::config::{ConfigErrorKind, LoadOptions, RateLimitConfig};
///
/// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
/// let err = RateLimitConfig::from_sources([("api.yaml", yaml)], &LoadOptions::default()).unwrap_err();
/// assert_eq!(err.file(), "api.yaml");
/// assert_eq!((err.line(), err.column()), (Some(4), Some(24)));
/// assert!(matches!(err.kind(), ConfigErrorKind::InvalidUnit { unit } if unit == "fortnight"));
/// assert_eq!(err.to_string(), "api.yaml:4:24: invalid rate limit unit 'fortnight' (expected second, minute, hour, day, week, month or year)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    file: String,
    position: Option<Position>,
    kind: ConfigErrorKind,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.column, self.kind),
            None => write!(f, "{}: {}", self.file, self.kind),
        }
    }
}

impl ConfigError {
    pub(crate) fn new(file: &str, position: Option<Position>, kind: ConfigErrorKind) -> Self {
        ConfigError {
            file: file.to_owned(),
            position,
            kind,
        }
    }

    /// The file (as given to [`from_sources`](super::RateLimitConfig::from_sources), or its
    /// path when loaded from disk).
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The 1-based line, when the error has a place in the file.
    pub fn line(&self) -> Option<u32> {
        self.position.map(|p| p.line)
    }

    /// The 1-based column (in characters), when the error has a place in the file.
    pub fn column(&self) -> Option<u32> {
        self.position.map(|p| p.column)
    }

    /// Line and column together.
    pub fn position(&self) -> Option<Position> {
        self.position
    }

    /// What is wrong.
    pub fn kind(&self) -> &ConfigErrorKind {
        &self.kind
    }

    /// A YAML syntax error (the file is not YAML, or has several documents).
    pub fn is_syntax(&self) -> bool {
        matches!(
            self.kind,
            ConfigErrorKind::Syntax { .. } | ConfigErrorKind::SeveralDocuments
        )
    }

    /// The file or directory could not be read.
    pub fn is_io(&self) -> bool {
        matches!(self.kind, ConfigErrorKind::Io { .. })
    }
}

/// What is wrong with a config file. The messages are lower-case and name the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The file or directory could not be read.
    #[error("cannot read: {message}")]
    Io {
        /// The operating system's reason.
        message: String,
    },
    /// Not YAML: the parser's message.
    #[error("YAML syntax error: {message}")]
    Syntax {
        /// The parser's message.
        message: String,
    },
    /// A second YAML document (`---`) in one file; envoyproxy/ratelimit would silently read only
    /// the first.
    #[error("a config file holds one YAML document; a second one starts here")]
    SeveralDocuments,
    /// The same key twice in one map; envoyproxy/ratelimit would silently keep the last.
    #[error("duplicate key '{key}' in this map")]
    DuplicateMapKey {
        /// The key as written.
        key: String,
    },
    /// A map key that YAML reads as a number, bool or null.
    #[error("config key '{key}' is not a string")]
    NonStringKey {
        /// The key as written.
        key: String,
    },
    /// A key outside the format's allow-list.
    #[error("unknown config key '{key}'")]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A list element that is not a map (outside `metadata`).
    #[error("list element '{element}' is not a map")]
    NonMapListElement {
        /// The element as written (or its type, for a list).
        element: String,
    },
    /// A leaf that is not a string, integer, bool or null (outside `metadata`): a float such
    /// as `value: 1.5`. Quote it to make it a string.
    #[error(
        "'{value}' is a {found}: a config value is a string, integer, bool or null (quote it to make it a string)"
    )]
    InvalidLeaf {
        /// The value as written.
        value: String,
        /// What YAML read it as.
        found: &'static str,
    },
    /// A field of the wrong type (a map where a string is expected, a quoted number for
    /// `requests_per_unit`, a negative or too large `requests_per_unit`, ...).
    #[error("'{field}' must be {expected}, found {found}")]
    WrongType {
        /// The field's name.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it is (type, or the value as written).
        found: String,
    },
    /// `domain` missing or empty.
    #[error("the config file has no domain (or an empty one)")]
    EmptyDomain,
    /// A domain already loaded from another file (and `merge_domains` is off).
    #[error(
        "duplicate domain '{domain}' (already in {first_file}; set MERGE_DOMAIN_CONFIG=true to merge)"
    )]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file that defined it first.
        first_file: String,
    },
    /// A descriptor without `key` or with an empty one.
    #[error("descriptor has no key (or an empty one)")]
    EmptyKey,
    /// Two descriptors with the same key and value (or both without value) at one level.
    #[error("duplicate descriptor '{path}'")]
    DuplicateKey {
        /// The descriptor's path, `domain.key_value.key`, as the reference's stats key.
        path: String,
    },
    /// A `unit` that is not one of second, minute, hour, day, week, month, year (any case).
    #[error(
        "invalid rate limit unit '{unit}' (expected second, minute, hour, day, week, month or year)"
    )]
    InvalidUnit {
        /// The unit as written (empty when missing).
        unit: String,
    },
    /// `unlimited: true` together with a valid `unit`.
    #[error("an unlimited rate limit must not have a unit")]
    UnlimitedWithUnit,
    /// A `replaces` entry with no or an empty `name`.
    #[error("a replaces entry needs a non-empty name")]
    EmptyReplaces,
    /// A `replaces` entry naming the rate limit itself.
    #[error("rate limit '{name}' replaces itself")]
    ReplacesSelf {
        /// The name.
        name: String,
    },
    /// `share_threshold: true` on a descriptor whose value has no `*`.
    #[error("share_threshold needs a wildcard value (with '*'), found '{value}'")]
    ShareThresholdWithoutWildcard {
        /// The descriptor's value (empty when it has none).
        value: String,
    },
    /// `algorithm:` (an extension) that is not `fixed_window`, `gcra`, `sliding_window`,
    /// `sliding_log` or `leaky_bucket`.
    #[error(
        "invalid rate limit algorithm '{algorithm}' (expected fixed_window, gcra, sliding_window, sliding_log or leaky_bucket)"
    )]
    InvalidAlgorithm {
        /// The algorithm as written.
        algorithm: String,
    },
    /// `period:` (an extension) that is not a whole number of seconds from 1 s to 365 days
    /// (`10s`, `5m`, `2h`, `1d`, or a plain integer of seconds).
    #[error(
        "invalid rate limit period '{period}' (expected whole seconds from 1s to 365d: 10s, 5m, 2h, 1d or an integer of seconds)"
    )]
    InvalidPeriod {
        /// The period as written.
        period: String,
    },
    /// Both `unit` and `period` (an extension), of different lengths.
    #[error(
        "period {period_secs}s and unit '{unit}' ({unit_secs}s) disagree: give one of them (the period alone reports the shortest unit that covers it)"
    )]
    PeriodUnitMismatch {
        /// The period in seconds.
        period_secs: u64,
        /// The unit.
        unit: String,
        /// The unit's length in seconds.
        unit_secs: u64,
    },
    /// `charging:` (an extension, at a file's root) that is not `per_descriptor` or
    /// `all_or_nothing`.
    #[error("invalid charging '{charging}' (expected per_descriptor or all_or_nothing)")]
    InvalidCharging {
        /// The value as written.
        charging: String,
    },
    /// `on_store_failure:` (an extension) that is not `unavailable`, `allow`, `deny` or
    /// `fail_soft`.
    #[error("invalid on_store_failure '{value}' (expected unavailable, allow, deny or fail_soft)")]
    InvalidStoreFailure {
        /// The value as written.
        value: String,
    },
    /// `metadata` that cannot become JSON (a NaN or infinite number).
    #[error("invalid metadata: {message}")]
    InvalidMetadata {
        /// What is wrong.
        message: String,
    },
}
