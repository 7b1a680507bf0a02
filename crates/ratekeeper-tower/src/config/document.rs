//! Reading a [`LayerConfig`] from a TOML document (feature `toml`), and [`ConfigError`]: the
//! file, line, column and field path of the first mistake.

use std::fmt;

#[allow(clippy::wildcard_imports)]
// The document reader checks what `config` builds, with its names.
use super::*;
use crate::error::BuildError;
use ratekeeper_core::Policy;

#[cfg(feature = "toml")]
impl LayerConfig {
    /// Reads a TOML document; `file` names it in errors (a path, or any label).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] with the file, the line and column (1-based) and the field path
    /// (`policies[1].quota`) of the first mistake: TOML syntax, an unknown field, a value of
    /// the wrong type, a quota, algorithm, route template, method, header name or network
    /// that does not parse, or settings that do not fit together (a route or tier naming no
    /// policy, a policy name that is invalid or used twice, a cost of 0 or above a burst, a
    /// method and path listed twice, a `header` key without its header): the checks of
    /// [`build`](Self::build), located in the document.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        let de =
            toml::Deserializer::parse(text).map_err(|e| ConfigError::toml(file, text, "", &e))?;
        let config: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::toml(file, text, &field, e.inner())
        })?;
        match config.mismatch() {
            None => Ok(config),
            Some((path, message)) => Err(ConfigError::located(file, text, &path, message)),
        }
    }

    /// The first setting that does not fit the others (an unknown policy in a route, a cost
    /// above a burst, a duplicate name), with the path of the field that holds it: the
    /// checks [`build`](Self::build) makes too, found here so that the error names the line.
    fn mismatch(&self) -> Option<(Vec<Step>, String)> {
        use Step::{Field, Index};
        let policies = &self.policies;
        if policies.is_empty() {
            return Some((
                vec![Field("policies".into())],
                BuildError::NoPolicy.to_string(),
            ));
        }
        let policy_err = |i: usize, field: &str, err: BuildError| {
            let path = vec![Field("policies".into()), Index(i), Field(field.into())];
            Some((path, err.to_string()))
        };
        for (i, p) in policies.iter().enumerate() {
            if let Err(e) = p.validate() {
                let field = if e.is_ban() {
                    "ban"
                } else if e.is_burst() {
                    "quota"
                } else {
                    "name"
                };
                return Some((
                    vec![Field("policies".into()), Index(i), Field(field.into())],
                    e.to_string(),
                ));
            }
            if policies[..i].iter().any(|q| q.name() == p.name()) {
                return policy_err(i, "name", BuildError::DuplicatePolicy(p.name().to_owned()));
            }
            if p.algorithm() == ratekeeper_core::Algorithm::Concurrency {
                let err = BuildError::ConcurrencyPolicy(p.name().to_owned());
                return policy_err(i, "algorithm", err);
            }
        }
        if let Err(BuildError::Config { field, message }) = self.builder() {
            return Some((field.split('.').map(|f| Field(f.into())).collect(), message));
        }
        let exceeds = |cost: u64, p: &Policy| BuildError::CostExceedsBurst {
            policy: p.name().to_owned(),
            cost,
            burst: p.capacity(),
        };
        if self.cost == 0 {
            return Some((vec![Field("cost".into())], BuildError::ZeroCost.to_string()));
        }
        if let Some(p) = policies
            .iter()
            .find(|p| self.cost > u64::from(p.capacity()))
        {
            return Some((
                vec![Field("cost".into())],
                exceeds(self.cost, p).to_string(),
            ));
        }
        let unknown = |name: &str| !policies.iter().any(|p| p.name() == name);
        let scoped = |name: &str| {
            self.routes
                .iter()
                .any(|r| r.policies.iter().any(|n| n == name))
        };
        for (i, route) in self.routes.iter().enumerate() {
            let at = |field: Option<&str>| {
                let mut path = vec![Field("routes".into()), Index(i)];
                path.extend(field.map(|f| Field(f.into())));
                path
            };
            if let Some(k) = self.routes[..i]
                .iter()
                .position(|r| r.method == route.method && r.path == route.path)
            {
                let message = format!(
                    "{} {} is also routes[{k}]: give each method and path one entry",
                    route.method.0, route.path.0
                );
                return Some((at(None), message));
            }
            for (j, name) in route.policies.iter().enumerate() {
                if unknown(name) {
                    let mut path = at(Some("policies"));
                    path.push(Index(j));
                    return Some((path, BuildError::UnknownPolicy(name.clone()).to_string()));
                }
            }
            let Some(cost) = route.cost else { continue };
            if cost == 0 {
                return Some((at(Some("cost")), BuildError::ZeroCost.to_string()));
            }
            let applies = policies
                .iter()
                .filter(|p| !scoped(p.name()) || route.policies.iter().any(|n| n == p.name()));
            for p in applies {
                if cost > u64::from(p.capacity()) {
                    return Some((at(Some("cost")), exceeds(cost, p).to_string()));
                }
            }
        }
        if let Some(tiers) = &self.tiers {
            if unknown(&tiers.default) {
                let path = vec![Field("tiers".into()), Field("default".into())];
                return Some((
                    path,
                    BuildError::UnknownPolicy(tiers.default.clone()).to_string(),
                ));
            }
            for (value, name) in &tiers.values {
                if unknown(name) {
                    let path = vec![
                        Field("tiers".into()),
                        Field("values".into()),
                        Field(value.clone()),
                    ];
                    return Some((path, BuildError::UnknownPolicy(name.clone()).to_string()));
                }
            }
        }
        None
    }

    /// Reads the TOML file at `path` (see [`from_toml`](Self::from_toml)).
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: the file cannot be read, or [`from_toml`](Self::from_toml)'s errors.
    pub fn from_toml_file(path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            column: None,
            field: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        Self::from_toml(&file, &text)
    }
}

/// One step of a field's path in a document: a table's field or an array's index.
#[cfg(feature = "toml")]
#[derive(Debug)]
enum Step {
    Field(String),
    Index(usize),
}

/// A configuration document that could not be read: where, which field, and why.
///
/// `Display`: `file:line:column: field: message` (the parts that are known), always one line:
/// control characters from the document (a line break in a route template or a tier value)
/// are escaped (`\n`), as is `\`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    field: String,
    message: String,
}

impl ConfigError {
    /// The file, as named to the reader.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The line of the mistake (1-based), when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column of the mistake (1-based, in characters), when known.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The field's path (`routes[2].path`; empty for a syntax error outside any field).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    #[cfg(feature = "toml")]
    fn toml(file: &str, text: &str, field: &str, err: &toml::de::Error) -> Self {
        let (line, column) = match err.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        Self {
            file: file.to_owned(),
            line,
            column,
            field: field.trim_start_matches('.').to_owned(),
            message: err.message().trim_end().to_owned(),
        }
    }
}

#[cfg(feature = "toml")]
impl ConfigError {
    /// An error at the field `path` of the (well-formed) document `text`: its line and
    /// column are those of the field's value, or of the deepest table on the path that the
    /// document writes (a field left out is reported at its table).
    fn located(file: &str, text: &str, path: &[Step], message: String) -> Self {
        use toml::de::{DeTable, DeValue};
        let mut field = String::new();
        for step in path {
            match step {
                Step::Field(name) if field.is_empty() => field.push_str(name),
                Step::Field(name) => {
                    field.push('.');
                    field.push_str(name);
                }
                Step::Index(i) => field.push_str(&format!("[{i}]")),
            }
        }
        let mut span = None;
        if let Ok(doc) = DeTable::parse(text) {
            let mut table: Option<&DeTable<'_>> = Some(doc.get_ref());
            let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
            for step in path {
                let value = match (step, table, array) {
                    (Step::Field(name), Some(t), _) => t
                        .iter()
                        .find(|(k, _)| k.get_ref().as_ref() == name.as_str())
                        .map(|(_, v)| v),
                    (Step::Index(i), _, Some(a)) => a.get(*i),
                    _ => None,
                };
                let Some(value) = value else { break };
                let range = value.span();
                if range.start < range.end {
                    span = Some(range.start);
                }
                (table, array) = match value.get_ref() {
                    DeValue::Table(t) => (Some(t), None),
                    DeValue::Array(a) => (None, Some(&a[..])),
                    _ => (None, None),
                };
            }
        }
        let (line, column) = line_column(text, span.unwrap_or(0));
        Self {
            file: file.to_owned(),
            line: Some(line),
            column: Some(column),
            field,
            message,
        }
    }
}

/// The line and column (1-based, in characters) of the byte offset `start` of `text`.
#[cfg(feature = "toml")]
fn line_column(text: &str, start: usize) -> (usize, usize) {
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::error::OneLine;
        write!(f, "{}", OneLine(&self.file))?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.field.is_empty() && self.field != "." {
            write!(f, ": {}", OneLine(&self.field))?;
        }
        write!(f, ": {}", OneLine(&self.message))
    }
}

impl std::error::Error for ConfigError {}
