//! From a YAML tree to descriptors: the key allow-list, the field types and the reference's
//! rules (empty domain or key, duplicate descriptors, units, `unlimited`, `replaces`,
//! `share_threshold`).

use std::time::Duration;

use serde_json::Value;

use super::error::{ConfigError, ConfigErrorKind, Position};
use super::rule::{Algorithm, Charging, OnStoreFailure, RateLimitRule, Unit};
use super::yaml::{Kind, Node, same_key};
use super::{ConfigWarning, Descriptor, Level};

/// Every key the format knows, at any level (the reference checks one flat list).
pub(crate) const VALID_KEYS: [&str; 20] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Extensions (the reference's files do not use them).
    "algorithm",
    "period",
    "charging",
    "on_store_failure",
];

const ROOT_KEYS: &[&str] = &["domain", "descriptors", "charging"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "period",
    "on_store_failure",
];
const REPLACES_KEYS: &[&str] = &["name"];

type Entries = [(Node, Node)];

/// Reads one file's tree: its domain, its position, and the top-level descriptors list.
pub(crate) struct FileCtx<'a> {
    pub(crate) file: &'a str,
    pub(crate) warnings: &'a mut Vec<ConfigWarning>,
}

impl FileCtx<'_> {
    fn err(&self, pos: Position, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(self.file, Some(pos), kind)
    }

    fn warn_misplaced(&mut self, map: &Entries, allowed: &[&str], place: &str) {
        for (k, _) in map {
            if let Kind::Str(name) = &k.kind
                && !allowed.contains(&name.as_str())
            {
                self.warnings.push(ConfigWarning {
                    file: self.file.to_owned(),
                    position: Some(k.pos),
                    message: format!("'{name}' has no effect in {place} (ignored)"),
                });
            }
        }
    }
}

/// The checks the reference makes on the untyped tree: string keys from the allow-list,
/// lists of maps, scalar leaves that are strings, integers, bools or null (`metadata` is not
/// checked). Also refuses a key repeated in one map.
pub(crate) fn check_keys(ctx: &FileCtx<'_>, map: &Entries) -> Result<(), ConfigError> {
    for (i, (k, v)) in map.iter().enumerate() {
        let Kind::Str(name) = &k.kind else {
            return Err(ctx.err(
                k.pos,
                ConfigErrorKind::NonStringKey {
                    key: k.kind.describe(),
                },
            ));
        };
        if !VALID_KEYS.contains(&name.as_str()) {
            return Err(ctx.err(k.pos, ConfigErrorKind::UnknownKey { key: name.clone() }));
        }
        if map[..i].iter().any(|(other, _)| same_key(other, k)) {
            return Err(ctx.err(
                k.pos,
                ConfigErrorKind::DuplicateMapKey { key: name.clone() },
            ));
        }
        if name == "metadata" {
            continue;
        }
        check_value(ctx, v)?;
    }
    Ok(())
}

fn check_value(ctx: &FileCtx<'_>, v: &Node) -> Result<(), ConfigError> {
    match &v.kind {
        Kind::Seq(items) => {
            for e in items {
                let Kind::Map(m) = &e.kind else {
                    return Err(ctx.err(
                        e.pos,
                        ConfigErrorKind::NonMapListElement {
                            element: e.kind.describe(),
                        },
                    ));
                };
                check_keys(ctx, m)?;
            }
            Ok(())
        }
        Kind::Map(m) => check_keys(ctx, m),
        Kind::Float(_, raw) => Err(ctx.err(
            v.pos,
            ConfigErrorKind::InvalidLeaf {
                value: raw.clone(),
                found: "float",
            },
        )),
        Kind::Null | Kind::Bool(..) | Kind::Int(..) | Kind::Str(_) => Ok(()),
    }
}

fn get<'n>(map: &'n Entries, name: &str) -> Option<&'n Node> {
    map.iter()
        .find(|(k, _)| matches!(&k.kind, Kind::Str(s) if s == name))
        .map(|(_, v)| v)
}

/// A string field: the text of any non-null scalar, `""` for null or absent.
fn string_field(
    ctx: &FileCtx<'_>,
    map: &Entries,
    field: &'static str,
) -> Result<Option<(String, Position)>, ConfigError> {
    let Some(v) = get(map, field) else {
        return Ok(None);
    };
    match &v.kind {
        Kind::Null => Ok(Some((String::new(), v.pos))),
        Kind::Seq(_) | Kind::Map(_) => Err(ctx.err(
            v.pos,
            ConfigErrorKind::WrongType {
                field,
                expected: "a string",
                found: v.kind.type_name().to_owned(),
            },
        )),
        other => Ok(Some((
            other.as_text().unwrap_or_default().to_owned(),
            v.pos,
        ))),
    }
}

fn bool_field(
    ctx: &FileCtx<'_>,
    map: &Entries,
    field: &'static str,
) -> Result<Option<(bool, Position)>, ConfigError> {
    let Some(v) = get(map, field) else {
        return Ok(None);
    };
    match &v.kind {
        Kind::Bool(b, _) => Ok(Some((*b, v.pos))),
        Kind::Null => Ok(Some((false, v.pos))),
        other => Err(ctx.err(
            v.pos,
            ConfigErrorKind::WrongType {
                field,
                expected: "true or false",
                found: found(other),
            },
        )),
    }
}

fn found(kind: &Kind) -> String {
    match kind {
        Kind::Str(s) => format!("the string '{s}'"),
        Kind::Seq(_) | Kind::Map(_) | Kind::Null => kind.type_name().to_owned(),
        _ => format!("{} {}", kind.type_name(), kind.describe()),
    }
}

fn flag(ctx: &FileCtx<'_>, map: &Entries, field: &'static str) -> Result<bool, ConfigError> {
    Ok(bool_field(ctx, map, field)?.is_some_and(|(b, _)| b))
}

fn u32_field(ctx: &FileCtx<'_>, map: &Entries, field: &'static str) -> Result<u32, ConfigError> {
    let Some(v) = get(map, field) else {
        return Ok(0);
    };
    match &v.kind {
        Kind::Null => Ok(0),
        Kind::Int(i, _) if u32::try_from(*i).is_ok() => Ok(u32::try_from(*i).unwrap_or(0)),
        other => Err(ctx.err(
            v.pos,
            ConfigErrorKind::WrongType {
                field,
                expected: "an integer from 0 to 4294967295",
                found: found(other),
            },
        )),
    }
}

fn list_field<'n>(
    ctx: &FileCtx<'_>,
    map: &'n Entries,
    field: &'static str,
) -> Result<&'n [Node], ConfigError> {
    let Some(v) = get(map, field) else {
        return Ok(&[]);
    };
    match &v.kind {
        Kind::Seq(items) => Ok(items),
        Kind::Null => Ok(&[]),
        other => Err(ctx.err(
            v.pos,
            ConfigErrorKind::WrongType {
                field,
                expected: "a list",
                found: found(other),
            },
        )),
    }
}

fn map_field<'n>(
    ctx: &FileCtx<'_>,
    map: &'n Entries,
    field: &'static str,
) -> Result<Option<(&'n Entries, Position)>, ConfigError> {
    let Some(v) = get(map, field) else {
        return Ok(None);
    };
    match &v.kind {
        Kind::Map(m) => Ok(Some((m, v.pos))),
        Kind::Null => Ok(None),
        other => Err(ctx.err(
            v.pos,
            ConfigErrorKind::WrongType {
                field,
                expected: "a map",
                found: found(other),
            },
        )),
    }
}

/// A list element's map (lists hold maps only: [`check_keys`] ran first).
fn as_map(node: &Node) -> &Entries {
    match &node.kind {
        Kind::Map(m) => m,
        _ => &[],
    }
}

/// The root of a file: its domain (and where it is written), its descriptors and how its
/// requests are charged.
pub(crate) fn root<'n>(
    ctx: &mut FileCtx<'_>,
    node: &'n Node,
) -> Result<(String, Position, &'n [Node], Charging), ConfigError> {
    let map: &Entries = match &node.kind {
        Kind::Map(m) => m,
        Kind::Null => &[],
        other => {
            return Err(ctx.err(
                node.pos,
                ConfigErrorKind::WrongType {
                    field: "the file",
                    expected: "a map with domain and descriptors",
                    found: found(other),
                },
            ));
        }
    };
    check_keys(ctx, map)?;
    ctx.warn_misplaced(map, ROOT_KEYS, "a file's top level");
    let domain = string_field(ctx, map, "domain")?;
    let descriptors = list_field(ctx, map, "descriptors")?;
    let charging = match string_field(ctx, map, "charging")? {
        None => Charging::PerDescriptor,
        Some((text, pos)) => match text.to_ascii_lowercase().replace('-', "_").as_str() {
            "" | "per_descriptor" => Charging::PerDescriptor,
            "all_or_nothing" => Charging::AllOrNothing,
            _ => return Err(ctx.err(pos, ConfigErrorKind::InvalidCharging { charging: text })),
        },
    };
    match domain {
        Some((d, pos)) if !d.is_empty() => Ok((d, pos, descriptors, charging)),
        Some((_, pos)) => Err(ctx.err(pos, ConfigErrorKind::EmptyDomain)),
        None => Err(ctx.err(node.pos, ConfigErrorKind::EmptyDomain)),
    }
}

/// Adds a list of descriptors to `level`; `parent` is the stats path so far (`domain.` or
/// `domain.key_value.`), for duplicate errors.
pub(crate) fn descriptors(
    ctx: &mut FileCtx<'_>,
    list: &[Node],
    parent: &str,
    level: &mut Level,
) -> Result<(), ConfigError> {
    for item in list {
        let map = as_map(item);
        ctx.warn_misplaced(map, DESCRIPTOR_KEYS, "a descriptor");
        let (key, key_pos) = match string_field(ctx, map, "key")? {
            Some((k, pos)) if !k.is_empty() => (k, pos),
            Some((_, pos)) => return Err(ctx.err(pos, ConfigErrorKind::EmptyKey)),
            None => return Err(ctx.err(item.pos, ConfigErrorKind::EmptyKey)),
        };
        let value = string_field(ctx, map, "value")?
            .map(|(v, _)| v)
            .filter(|v| !v.is_empty());
        let path = match &value {
            Some(v) => format!("{parent}{key}_{v}"),
            None => format!("{parent}{key}"),
        };
        if level.contains(&key, value.as_deref()) {
            return Err(ctx.err(key_pos, ConfigErrorKind::DuplicateKey { path }));
        }
        let rule = match map_field(ctx, map, "rate_limit")? {
            Some((rl, rl_pos)) => Some(rule(ctx, map, rl, rl_pos)?),
            None => None,
        };
        let share_threshold = match bool_field(ctx, map, "share_threshold")? {
            Some((true, pos)) => {
                if !value.as_deref().is_some_and(|v| v.contains('*')) {
                    return Err(ctx.err(
                        pos,
                        ConfigErrorKind::ShareThresholdWithoutWildcard {
                            value: value.clone().unwrap_or_default(),
                        },
                    ));
                }
                true
            }
            _ => false,
        };
        let value_to_metric = flag(ctx, map, "value_to_metric")?;
        let pattern = value
            .as_deref()
            .filter(|v| v.contains('*'))
            .map(|v| v.split('*').map(str::to_owned).collect());
        let mut children = Level::default();
        descriptors(
            ctx,
            list_field(ctx, map, "descriptors")?,
            &format!("{path}."),
            &mut children,
        )?;
        level.insert(Descriptor {
            key,
            value,
            pattern,
            rule,
            value_to_metric,
            share_threshold,
            children,
        });
    }
    Ok(())
}

/// A descriptor's `rate_limit` map, with its descriptor's flags and metadata.
fn rule(
    ctx: &mut FileCtx<'_>,
    descriptor: &Entries,
    rl: &Entries,
    rl_pos: Position,
) -> Result<RateLimitRule, ConfigError> {
    ctx.warn_misplaced(rl, RATE_LIMIT_KEYS, "rate_limit");
    let unlimited = flag(ctx, rl, "unlimited")?;
    let unit_field = string_field(ctx, rl, "unit")?;
    let period = period_field(ctx, rl)?;
    let (unit_text, unit_pos) = unit_field.clone().unwrap_or((String::new(), rl_pos));
    let unit = unit_text.parse::<Unit>().ok();
    let unit = match (unlimited, unit, period) {
        (true, Some(_), _) => return Err(ctx.err(unit_pos, ConfigErrorKind::UnlimitedWithUnit)),
        (true, None, _) => Unit::Second,
        (false, Some(u), Some((p, p_pos))) if u.seconds() != p.as_secs() => {
            return Err(ctx.err(
                p_pos,
                ConfigErrorKind::PeriodUnitMismatch {
                    period_secs: p.as_secs(),
                    unit: u.as_str().to_owned(),
                    unit_secs: u.seconds(),
                },
            ));
        }
        (false, Some(u), _) => u,
        // `period` alone: the shortest unit covering it (checked to exist by period_field).
        (false, None, Some((p, _))) if unit_field.is_none() => {
            Unit::covering(p.as_secs()).unwrap_or(Unit::Year)
        }
        (false, None, _) => {
            return Err(ctx.err(unit_pos, ConfigErrorKind::InvalidUnit { unit: unit_text }));
        }
    };
    let algorithm = algorithm_field(ctx, rl)?;
    let on_store_failure =
        match string_field(ctx, rl, "on_store_failure")? {
            None => None,
            Some((text, _)) if text.is_empty() => None,
            Some((text, pos)) => Some(OnStoreFailure::parse(&text).ok_or_else(|| {
                ctx.err(pos, ConfigErrorKind::InvalidStoreFailure { value: text })
            })?),
        };
    let requests_per_unit = u32_field(ctx, rl, "requests_per_unit")?;
    let name = string_field(ctx, rl, "name")?
        .map(|(n, _)| n)
        .filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    for entry in list_field(ctx, rl, "replaces")? {
        let m = as_map(entry);
        ctx.warn_misplaced(m, REPLACES_KEYS, "a replaces entry");
        match string_field(ctx, m, "name")? {
            Some((n, pos)) if n.is_empty() => {
                return Err(ctx.err(pos, ConfigErrorKind::EmptyReplaces));
            }
            None => return Err(ctx.err(entry.pos, ConfigErrorKind::EmptyReplaces)),
            Some((n, pos)) => {
                if name.as_deref() == Some(n.as_str()) {
                    return Err(ctx.err(pos, ConfigErrorKind::ReplacesSelf { name: n }));
                }
                replaces.push(n);
            }
        }
    }
    let metadata = match map_field(ctx, descriptor, "metadata")? {
        Some((m, _)) => Some(metadata_map(ctx, m)?),
        None => None,
    };
    Ok(RateLimitRule {
        requests_per_unit,
        unit,
        period: period.map(|(p, _)| p),
        algorithm,
        on_store_failure,
        unlimited,
        name,
        replaces,
        shadow_mode: flag(ctx, descriptor, "shadow_mode")?,
        quota_mode: flag(ctx, descriptor, "quota_mode")?,
        detailed_metric: flag(ctx, descriptor, "detailed_metric")?,
        metadata,
    })
}

/// `algorithm:` (an extension): one of the five window and bucket algorithms, any case, `_`
/// or `-`; absent or null is the fixed window.
fn algorithm_field(ctx: &FileCtx<'_>, rl: &Entries) -> Result<Algorithm, ConfigError> {
    let Some((text, pos)) = string_field(ctx, rl, "algorithm")? else {
        return Ok(Algorithm::FixedWindow);
    };
    if text.is_empty() {
        return Ok(Algorithm::FixedWindow);
    }
    let name = text.to_ascii_lowercase().replace('-', "_");
    let algorithm = match name.as_str() {
        "fixed_window" => Algorithm::FixedWindow,
        "gcra" => Algorithm::Gcra,
        "sliding_window" => Algorithm::SlidingWindow,
        "sliding_log" => Algorithm::SlidingLog,
        "leaky_bucket" => Algorithm::LeakyBucket,
        _ => {
            return Err(ctx.err(pos, ConfigErrorKind::InvalidAlgorithm { algorithm: text }));
        }
    };
    Ok(algorithm)
}

/// The longest `period`: a [`Unit::Year`] (365 days), the longest unit `current_limit` can
/// report without overstating.
const MAX_PERIOD_SECS: u64 = 31_536_000;

/// `period:` (an extension): `<n>s`, `<n>m`, `<n>h`, `<n>d` or an integer of seconds, from
/// 1 s to 365 days.
fn period_field(
    ctx: &FileCtx<'_>,
    rl: &Entries,
) -> Result<Option<(Duration, Position)>, ConfigError> {
    let Some(v) = get(rl, "period") else {
        return Ok(None);
    };
    let text = match &v.kind {
        Kind::Null => return Ok(None),
        // A plain integer of seconds, as YAML reads it (`010` is octal in YAML 1.1).
        Kind::Int(i, _) => i.to_string(),
        Kind::Str(raw) => raw.trim().to_owned(),
        other => other.as_text().unwrap_or_default().to_owned(),
    };
    let bad = || {
        ctx.err(
            v.pos,
            ConfigErrorKind::InvalidPeriod {
                period: text.clone(),
            },
        )
    };
    let (digits, scale) = match text.char_indices().last() {
        Some((i, 's')) => (&text[..i], 1),
        Some((i, 'm')) => (&text[..i], 60),
        Some((i, 'h')) => (&text[..i], 3_600),
        Some((i, 'd')) => (&text[..i], 86_400),
        _ => (text.as_str(), 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let secs = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|s| (1..=MAX_PERIOD_SECS).contains(s))
        .ok_or_else(bad)?;
    Ok(Some((Duration::from_secs(secs), v.pos)))
}

fn metadata_map(
    ctx: &FileCtx<'_>,
    map: &Entries,
) -> Result<serde_json::Map<String, Value>, ConfigError> {
    let mut out = serde_json::Map::new();
    for (k, v) in map {
        out.insert(k.kind.describe(), metadata_value(ctx, v)?);
    }
    Ok(out)
}

fn metadata_value(ctx: &FileCtx<'_>, node: &Node) -> Result<Value, ConfigError> {
    Ok(match &node.kind {
        Kind::Null => Value::Null,
        Kind::Bool(b, _) => Value::Bool(*b),
        Kind::Int(i, raw) => match i64::try_from(*i) {
            Ok(i) => Value::from(i),
            Err(_) => match u64::try_from(*i) {
                Ok(u) => Value::from(u),
                Err(_) => Value::String(raw.clone()),
            },
        },
        Kind::Float(f, raw) => match serde_json::Number::from_f64(*f) {
            Some(n) => Value::Number(n),
            None => {
                return Err(ctx.err(
                    node.pos,
                    ConfigErrorKind::InvalidMetadata {
                        message: format!("'{raw}' is not a finite number"),
                    },
                ));
            }
        },
        Kind::Str(s) => Value::String(s.clone()),
        Kind::Seq(items) => Value::Array(
            items
                .iter()
                .map(|i| metadata_value(ctx, i))
                .collect::<Result<_, _>>()?,
        ),
        Kind::Map(m) => Value::Object(metadata_map(ctx, m)?),
    })
}
