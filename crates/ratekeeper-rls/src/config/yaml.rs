//! A YAML document as a tree of nodes with positions, with plain scalars resolved as YAML 1.1
//! (the reading of `gopkg.in/yaml.v2`, which envoyproxy/ratelimit uses).
//!
//! The event parser (saphyr-parser, YAML 1.2 syntax) gives each scalar its text, its style
//! (plain or quoted) and its position; this module builds the tree and types plain scalars
//! itself, so that `yes`, `on`, `0x1F` or `1_000` read as the reference reads them.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use super::error::{ConfigErrorKind, Position};

/// A node of the document and where it starts (1-based line and column).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) kind: Kind,
    pub(crate) pos: Position,
}

/// What a node holds. Scalars keep their source text (`raw`): a string field takes the text of
/// any non-null scalar, as yaml.v2 does (`value: 010` is the string `010`).
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Null,
    Bool(bool, String),
    Int(i128, String),
    Float(f64, String),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Kind {
    /// The type's name in error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool(..) => "bool",
            Kind::Int(..) => "int",
            Kind::Float(..) => "float",
            Kind::Str(_) => "string",
            Kind::Seq(_) => "list",
            Kind::Map(_) => "map",
        }
    }

    /// The scalar's text as a string field reads it; `None` for null, lists and maps.
    pub(crate) fn as_text(&self) -> Option<&str> {
        match self {
            Kind::Bool(_, raw) | Kind::Int(_, raw) | Kind::Float(_, raw) => Some(raw),
            Kind::Str(s) => Some(s),
            Kind::Null | Kind::Seq(_) | Kind::Map(_) => None,
        }
    }

    /// A short rendering of the node for messages (scalars as written; containers by type).
    pub(crate) fn describe(&self) -> String {
        match self.as_text() {
            Some(text) => text.to_owned(),
            None => self.type_name().to_owned(),
        }
    }
}

fn position(span: &Span) -> Position {
    Position {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        column: u32::try_from(span.start.col().saturating_add(1)).unwrap_or(u32::MAX),
    }
}

/// More nodes brought in by aliases than this are refused ("billion laughs").
const MAX_ALIAS_NODES: usize = 100_000;

/// Lists and maps nested deeper than this are refused (the readers recurse).
const MAX_DEPTH: usize = 128;

struct Builder {
    /// Open containers: the node being built and, for maps, a pending key.
    stack: Vec<(Node, Option<Node>)>,
    anchors: HashMap<usize, Node>,
    /// Anchor ids of the open containers (stored when the container ends).
    open_anchors: Vec<usize>,
    documents: usize,
    root: Option<Node>,
    expanded: usize,
}

fn count_nodes(node: &Node) -> usize {
    match &node.kind {
        Kind::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        Kind::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| count_nodes(k) + count_nodes(v))
                .sum::<usize>()
        }
        _ => 1,
    }
}

impl Builder {
    fn push_value(&mut self, node: Node) -> Result<(), (ConfigErrorKind, Position)> {
        match self.stack.last_mut() {
            None => {
                if self.root.is_some() {
                    return Err((ConfigErrorKind::SeveralDocuments, node.pos));
                }
                self.root = Some(node);
            }
            Some((parent, pending)) => {
                if let Kind::Seq(items) = &mut parent.kind {
                    items.push(node);
                } else if let Kind::Map(entries) = &mut parent.kind {
                    match pending.take() {
                        None => *pending = Some(node),
                        Some(key) => entries.push((key, node)),
                    }
                }
            }
        }
        Ok(())
    }
}

/// Parses one YAML document (an empty text is a null document).
///
/// Errors: the parser's syntax error at its position, a second document in the same text, an
/// unknown alias, or too many alias expansions.
pub(crate) fn parse(text: &str) -> Result<Node, (ConfigErrorKind, Position)> {
    let mut parser = Parser::new_from_str(text);
    let mut b = Builder {
        stack: Vec::new(),
        anchors: HashMap::new(),
        open_anchors: Vec::new(),
        documents: 0,
        root: None,
        expanded: 0,
    };
    while let Some(event) = parser.next_event() {
        let (event, span) = event.map_err(|e| {
            let pos = Position {
                line: u32::try_from(e.marker().line()).unwrap_or(u32::MAX),
                column: u32::try_from(e.marker().col().saturating_add(1)).unwrap_or(u32::MAX),
            };
            (
                ConfigErrorKind::Syntax {
                    message: e.info().to_owned(),
                },
                pos,
            )
        })?;
        let pos = position(&span);
        match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                b.documents += 1;
                if b.documents > 1 {
                    return Err((ConfigErrorKind::SeveralDocuments, pos));
                }
            }
            Event::Alias(id) => {
                let Some(node) = b.anchors.get(&id).cloned() else {
                    return Err((
                        ConfigErrorKind::Syntax {
                            message: "alias to an unknown anchor".to_owned(),
                        },
                        pos,
                    ));
                };
                b.expanded += count_nodes(&node);
                if b.expanded > MAX_ALIAS_NODES {
                    return Err((
                        ConfigErrorKind::Syntax {
                            message: "too many alias expansions".to_owned(),
                        },
                        pos,
                    ));
                }
                b.push_value(node)?;
            }
            Event::Scalar(value, style, anchor, tag) => {
                let forced_str = tag
                    .as_ref()
                    .is_some_and(|t| t.is_yaml_core_schema() && t.suffix == "str");
                let kind = if style == ScalarStyle::Plain && !forced_str {
                    resolve_plain(&value)
                } else {
                    Kind::Str(value.into_owned())
                };
                let node = Node { kind, pos };
                if anchor > 0 {
                    b.anchors.insert(anchor, node.clone());
                }
                b.push_value(node)?;
            }
            Event::SequenceStart(..) | Event::MappingStart(..) if b.stack.len() >= MAX_DEPTH => {
                return Err((
                    ConfigErrorKind::Syntax {
                        message: format!("lists and maps nested deeper than {MAX_DEPTH} levels"),
                    },
                    pos,
                ));
            }
            Event::SequenceStart(anchor, _) => {
                b.open_anchors.push(anchor);
                b.stack.push((
                    Node {
                        kind: Kind::Seq(Vec::new()),
                        pos,
                    },
                    None,
                ));
            }
            Event::MappingStart(anchor, _) => {
                b.open_anchors.push(anchor);
                b.stack.push((
                    Node {
                        kind: Kind::Map(Vec::new()),
                        pos,
                    },
                    None,
                ));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _)) = b.stack.pop() {
                    let node = merge_keys(node)?;
                    if let Some(anchor) = b.open_anchors.pop()
                        && anchor > 0
                    {
                        b.anchors.insert(anchor, node.clone());
                    }
                    b.push_value(node)?;
                }
            }
        }
    }
    Ok(b.root.unwrap_or(Node {
        kind: Kind::Null,
        pos: Position { line: 1, column: 1 },
    }))
}

/// Applies YAML 1.1 merge keys (`<<: *base` or `<<: [*a, *b]`): the merged maps' entries are
/// added where the map does not set the key itself, as yaml.v2 does.
fn merge_keys(node: Node) -> Result<Node, (ConfigErrorKind, Position)> {
    let Node {
        kind: Kind::Map(entries),
        pos,
    } = node
    else {
        return Ok(node);
    };
    if !entries.iter().any(|(k, _)| is_merge_key(k)) {
        return Ok(Node {
            kind: Kind::Map(entries),
            pos,
        });
    }
    let mut own = Vec::new();
    let mut merged = Vec::new();
    for (k, v) in entries {
        if !is_merge_key(&k) {
            own.push((k, v));
            continue;
        }
        let sources = match v.kind {
            Kind::Map(m) => vec![m],
            Kind::Seq(items) => {
                let mut maps = Vec::new();
                for item in items {
                    match item.kind {
                        Kind::Map(m) => maps.push(m),
                        other => {
                            return Err((
                                ConfigErrorKind::Syntax {
                                    message: format!(
                                        "a merge key (<<) takes maps, found {}",
                                        other.type_name()
                                    ),
                                },
                                item.pos,
                            ));
                        }
                    }
                }
                maps
            }
            other => {
                return Err((
                    ConfigErrorKind::Syntax {
                        message: format!(
                            "a merge key (<<) takes maps, found {}",
                            other.type_name()
                        ),
                    },
                    v.pos,
                ));
            }
        };
        for source in sources {
            merged.extend(source);
        }
    }
    for (k, v) in merged {
        let exists = own.iter().any(|(o, _)| same_key(o, &k));
        if !exists {
            own.push((k, v));
        }
    }
    Ok(Node {
        kind: Kind::Map(own),
        pos,
    })
}

fn is_merge_key(node: &Node) -> bool {
    matches!(&node.kind, Kind::Str(s) if s == MERGE)
}

/// The plain scalar `<<` resolves to this marker so that a quoted `"<<"` stays a plain key.
const MERGE: &str = "\u{0}<<";

/// Whether two map keys are the same scalar (used for merges and duplicate detection).
pub(crate) fn same_key(a: &Node, b: &Node) -> bool {
    match (&a.kind, &b.kind) {
        (Kind::Null, Kind::Null) => true,
        (Kind::Bool(x, _), Kind::Bool(y, _)) => x == y,
        (Kind::Int(x, _), Kind::Int(y, _)) => x == y,
        (Kind::Float(x, _), Kind::Float(y, _)) => x == y,
        (Kind::Str(x), Kind::Str(y)) => x == y,
        _ => false,
    }
}

/// Resolves a plain scalar as YAML 1.1 / yaml.v2 does: null, bool, int, float, else a string.
pub(crate) fn resolve_plain(text: &str) -> Kind {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Kind::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            return Kind::Bool(true, text.to_owned());
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            return Kind::Bool(false, text.to_owned());
        }
        ".nan" | ".NaN" | ".NAN" => return Kind::Float(f64::NAN, text.to_owned()),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Kind::Float(f64::INFINITY, text.to_owned());
        }
        "-.inf" | "-.Inf" | "-.INF" => return Kind::Float(f64::NEG_INFINITY, text.to_owned()),
        "<<" => return Kind::Str(MERGE.to_owned()),
        _ => {}
    }
    let first = text.as_bytes()[0];
    if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.') {
        let plain: String = text.chars().filter(|&c| c != '_').collect();
        if let Some(i) = parse_int(&plain) {
            return Kind::Int(i, text.to_owned());
        }
        if is_float(&plain)
            && let Ok(f) = plain.parse::<f64>()
        {
            return Kind::Float(f, text.to_owned());
        }
    }
    Kind::Str(text.to_owned())
}

/// Go's `strconv.ParseInt(s, 0, 64)` / `ParseUint(s, 0, 64)`: an optional sign, then `0x`, `0o`,
/// `0b` or a leading `0` (octal) prefix, or decimal digits.
fn parse_int(s: &str) -> Option<i128> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest.to_owned())
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_owned())
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_owned())
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned())
    } else {
        (10, lower)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(&body, radix).ok()?;
    let value = i128::from(magnitude);
    let value = if negative { -value } else { value };
    // ParseInt takes [-2^63, 2^63); ParseUint takes [0, 2^64).
    if value < i128::from(i64::MIN) {
        return None;
    }
    Some(value)
}

/// yaml.v2's float syntax: `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`.
fn is_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && matches!(b[i], b'+' | b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let frac_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if int_digits == 0 && i == frac_start {
            return false;
        }
    } else if int_digits == 0 {
        return false;
    }
    if i < b.len() && matches!(b[i], b'e' | b'E') {
        i += 1;
        if i < b.len() && matches!(b[i], b'+' | b'-') {
            i += 1;
        }
        let exp_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp_start {
            return false;
        }
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_scalars_resolve_as_yaml_1_1() {
        assert!(matches!(resolve_plain("yes"), Kind::Bool(true, _)));
        assert!(matches!(resolve_plain("Off"), Kind::Bool(false, _)));
        assert!(matches!(resolve_plain("~"), Kind::Null));
        assert!(matches!(resolve_plain("0x1F"), Kind::Int(31, _)));
        assert!(matches!(resolve_plain("010"), Kind::Int(8, _)));
        assert!(matches!(resolve_plain("1_000"), Kind::Int(1000, _)));
        assert!(matches!(resolve_plain("-5"), Kind::Int(-5, _)));
        assert!(matches!(resolve_plain("1.5"), Kind::Float(..)));
        assert!(matches!(resolve_plain("1e3"), Kind::Float(..)));
        assert!(matches!(resolve_plain("08"), Kind::Float(..)));
        assert!(matches!(resolve_plain(".inf"), Kind::Float(..)));
        assert!(matches!(resolve_plain("1.2.3"), Kind::Str(_)));
        assert!(matches!(resolve_plain("foo*"), Kind::Str(_)));
        assert!(matches!(resolve_plain("2001-12-14"), Kind::Str(_)));
    }

    #[test]
    fn quoted_scalars_stay_strings_and_positions_are_one_based() {
        let node = parse("a: 'yes'\nb: yes\n").unwrap();
        let Kind::Map(entries) = node.kind else {
            panic!("not a map")
        };
        assert!(matches!(&entries[0].1.kind, Kind::Str(s) if s == "yes"));
        assert!(matches!(&entries[1].1.kind, Kind::Bool(true, _)));
        assert_eq!(entries[1].0.pos, Position { line: 2, column: 1 });
        assert_eq!(entries[1].1.pos, Position { line: 2, column: 4 });
    }

    #[test]
    fn aliases_and_merge_keys_expand() {
        let node = parse("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n").unwrap();
        let Kind::Map(entries) = node.kind else {
            panic!("not a map")
        };
        let Kind::Map(other) = &entries[1].1.kind else {
            panic!("not a map")
        };
        assert_eq!(other.len(), 2);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // Flow style: the scanner's own limit (255 levels).
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = parse(&deep).unwrap_err();
        assert!(matches!(err.0, ConfigErrorKind::Syntax { .. }));
        // Block style: ours, at the 129th list.
        let deep = format!("{}a\n", "- ".repeat(10_000));
        let err = parse(&deep).unwrap_err();
        assert!(matches!(err.0, ConfigErrorKind::Syntax { .. }));
        assert_eq!(err.1.column, 2 * 128 + 1);
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn a_second_document_is_an_error() {
        let err = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert!(matches!(err.0, ConfigErrorKind::SeveralDocuments));
        assert_eq!(err.1.line, 2);
    }
}
