//! Matching a request descriptor against a domain's tree, and the keys a match names.

use std::fmt::{self, Write as _};

use smallvec::SmallVec;

use super::rule::RateLimitRule;
use super::{Descriptor, Level};

/// The outcome of [`RateLimitConfig::lookup`](super::RateLimitConfig::lookup).
#[derive(Debug, Clone)]
pub enum Lookup<'a> {
    /// The domain is not in the config. The reference answers `OK` and counts
    /// `<domain>.domain_not_found`.
    DomainNotFound,
    /// No rule applies: nothing matched, the request is deeper or shallower than the rule, the
    /// matched node has no `rate_limit` (allow-listed), or the descriptor is empty.
    NoLimit,
    /// A rule applies.
    Limit(Match<'a>),
}

impl<'a> Lookup<'a> {
    /// The match, if a rule applies.
    pub fn into_match(self) -> Option<Match<'a>> {
        match self {
            Lookup::Limit(m) => Some(m),
            Lookup::DomainNotFound | Lookup::NoLimit => None,
        }
    }
}

/// How one request entry matched a config node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The node's value equals the entry's value.
    Exact,
    /// The node's value is a wildcard pattern matching the entry's value.
    Wildcard,
    /// The node has no value (any value of its key).
    Default,
}

#[derive(Debug, Clone, Copy)]
struct Step<'a> {
    node: &'a Descriptor,
    via: Via,
}

impl Step<'_> {
    /// The pattern that replaces the value in counter and stats keys: a `share_threshold`
    /// wildcard matched as a wildcard.
    fn shared_pattern(&self) -> Option<&str> {
        (self.via == Via::Wildcard && self.node.share_threshold)
            .then_some(self.node.value.as_deref())
            .flatten()
    }
}

/// A rule that applies to a request descriptor, with what the server needs to count it and
/// report it.
///
/// `Debug` shows the request's keys but not its values (they may be credentials).
#[derive(Clone)]
pub struct Match<'a> {
    /// The rule.
    pub rule: &'a RateLimitRule,
    domain: &'a str,
    entries: &'a [(&'a str, &'a str)],
    steps: SmallVec<[Step<'a>; 4]>,
}

pub(crate) fn lookup<'a>(
    domain: &'a str,
    root: &'a Level,
    entries: &'a [(&'a str, &'a str)],
) -> Lookup<'a> {
    let mut level = root;
    let mut steps = SmallVec::new();
    for (i, (key, value)) in entries.iter().enumerate() {
        let Some(step) = find(level, key, value) else {
            return Lookup::NoLimit;
        };
        steps.push(step);
        if i + 1 == entries.len() {
            return match &step.node.rule {
                Some(rule) => Lookup::Limit(Match {
                    rule,
                    domain,
                    entries,
                    steps,
                }),
                None => Lookup::NoLimit,
            };
        }
        level = &step.node.children;
        if level.nodes.is_empty() {
            return Lookup::NoLimit;
        }
    }
    Lookup::NoLimit
}

/// Exact value, then wildcards in config order, then the node without a value.
fn find<'a>(level: &'a Level, key: &str, value: &str) -> Option<Step<'a>> {
    let idx = level.index.get(key)?;
    if let Some(&i) = idx.exact.get(value) {
        return Some(Step {
            node: &level.nodes[i],
            via: Via::Exact,
        });
    }
    for &i in &idx.wildcards {
        let node = &level.nodes[i];
        if node
            .pattern
            .as_deref()
            .is_some_and(|p| wildcard_match(p, value))
        {
            return Some(Step {
                node,
                via: Via::Wildcard,
            });
        }
    }
    idx.default.map(|i| Step {
        node: &level.nodes[i],
        via: Via::Default,
    })
}

/// Whether `value` matches a pattern split on `*` (`["a", "b"]` is `a*b`): each `*` matches
/// any run of characters, also an empty one.
pub(crate) fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if value.len() < first.len() + last.len() {
        return false;
    }
    let Some(rest) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl fmt::Debug for Match<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self.entries.iter().map(|(k, _)| *k).collect();
        f.debug_struct("Match")
            .field("rule", self.rule)
            .field("domain", &self.domain)
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}

fn push_len_prefixed(out: &mut String, s: &str) {
    let _ = write!(out, "{}:", s.len());
    out.push_str(s);
}

impl<'a> Match<'a> {
    /// The domain.
    pub fn domain(&self) -> &'a str {
        self.domain
    }

    /// The request descriptor's entries.
    pub fn entries(&self) -> &'a [(&'a str, &'a str)] {
        self.entries
    }

    /// The config node's metadata (the rule's `metadata`), for dynamic metadata.
    pub fn metadata(&self) -> Option<&'a serde_json::Map<String, serde_json::Value>> {
        self.rule.metadata.as_ref()
    }

    /// One stats path segment per entry, as the reference names them: `key` or `key_value`.
    fn segments(&self) -> impl Iterator<Item = String> + '_ {
        let detailed = self.rule.detailed_metric;
        let any_shared = self.steps.iter().any(|s| s.shared_pattern().is_some());
        self.steps
            .iter()
            .zip(self.entries)
            .map(move |(step, (key, value))| {
                let shown: &str = if detailed {
                    match step.shared_pattern() {
                        Some(p) => p,
                        // Without any share_threshold the reference always writes `key_value`,
                        // even for an empty value (`key_`).
                        None if !any_shared => return format!("{key}_{value}"),
                        None => value,
                    }
                } else {
                    let node = step.node;
                    match step.via {
                        Via::Wildcard if node.share_threshold => {
                            node.value.as_deref().unwrap_or_default()
                        }
                        Via::Wildcard if !node.value_to_metric => {
                            node.value.as_deref().unwrap_or_default()
                        }
                        Via::Wildcard | Via::Exact => value,
                        Via::Default if node.value_to_metric => value,
                        Via::Default => "",
                    }
                };
                if shown.is_empty() {
                    (*key).to_owned()
                } else {
                    format!("{key}_{shown}")
                }
            })
    }

    /// The reference's stats key: `domain.seg1.seg2…`, where a segment is the config's
    /// `key` (a descriptor without value), `key_value`, or `key_pattern` (a wildcard, pattern
    /// kept: `test-domain.wild_foo*`). `value_to_metric` on a node puts the request's value in
    /// its segment; `detailed_metric` on the rule puts every request value in (except where a
    /// `share_threshold` wildcard keeps its pattern).
    ///
    /// It may hold request values (the two flags), which may be credentials: a metric
    /// label from it needs the operator's consent (those flags) and a series cap.
    pub fn stats_key(&self) -> String {
        let mut out = self.domain.to_owned();
        for seg in self.segments() {
            out.push('.');
            out.push_str(&seg);
        }
        out
    }

    /// The first two segments of [`stats_key`](Self::stats_key) after the domain, the
    /// reference's Prometheus labels `key1` and `key2` (deeper segments are dropped). Built
    /// from the match, not by splitting on `.`, so a value with a `.` stays in one label.
    pub fn metric_keys(&self) -> (String, Option<String>) {
        let mut segs = self.segments();
        let key1 = segs.next().unwrap_or_default();
        (key1, segs.next())
    }

    /// What identifies the counter: the domain and every `(key, value)` of the request, except
    /// that an entry matched by a `share_threshold` wildcard contributes the pattern, so that
    /// all matching values share one counter.
    ///
    /// The form is `len:text` for the domain, then for each entry its key and its value (or
    /// pattern): unambiguous whatever the texts hold. It holds request values, which may be
    /// credentials: hash it before it names anything in a store or a log.
    pub fn counter_key(&self) -> String {
        let mut out = String::with_capacity(
            8 + self.domain.len()
                + self
                    .entries
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 8)
                    .sum::<usize>(),
        );
        push_len_prefixed(&mut out, self.domain);
        for (step, (key, value)) in self.steps.iter().zip(self.entries) {
            push_len_prefixed(&mut out, key);
            push_len_prefixed(&mut out, step.shared_pattern().unwrap_or(value));
        }
        out
    }

    /// Whether the entry at `index` was matched by a `share_threshold` wildcard (its counter
    /// is shared by every value the pattern matches), and the pattern.
    pub fn shared_pattern(&self, index: usize) -> Option<&'a str> {
        self.steps.get(index).and_then(|s| {
            (s.via == Via::Wildcard && s.node.share_threshold)
                .then_some(s.node.value.as_deref())
                .flatten()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    fn parts(p: &str) -> Vec<String> {
        p.split('*').map(str::to_owned).collect()
    }

    /// A plain recursive glob: the oracle.
    fn glob(p: &[u8], v: &[u8]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some((b'*', rest)) => (0..=v.len()).any(|i| glob(rest, &v[i..])),
            Some((c, rest)) => v.first() == Some(c) && glob(rest, &v[1..]),
        }
    }

    fn all_strings(alphabet: &[u8], max: usize) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..max {
            last = last
                .iter()
                .flat_map(|s| {
                    alphabet
                        .iter()
                        .map(move |&c| format!("{s}{}", char::from(c)))
                })
                .collect();
            out.extend(last.iter().cloned());
        }
        out
    }

    #[test]
    fn wildcards_agree_with_a_glob_on_every_small_case() {
        let values = all_strings(b"ab", 5);
        for pattern in all_strings(b"ab*", 4) {
            let p = parts(&pattern);
            for v in &values {
                assert_eq!(
                    wildcard_match(&p, v),
                    glob(pattern.as_bytes(), v.as_bytes()),
                    "pattern {pattern:?} value {v:?}"
                );
            }
        }
    }

    #[test]
    fn wildcards_match_any_run_including_empty() {
        assert!(wildcard_match(&parts("foo*"), "foo"));
        assert!(wildcard_match(&parts("foo*"), "foo1"));
        assert!(!wildcard_match(&parts("foo*"), "fo"));
        assert!(wildcard_match(&parts("bar*b"), "barb"));
        assert!(wildcard_match(&parts("bar*b"), "bar123b"));
        assert!(!wildcard_match(&parts("bar*b"), "bara"));
        assert!(!wildcard_match(&parts("bar*b"), "xbarb"));
        assert!(wildcard_match(&parts("foo*bar*baz"), "foobarbaz"));
        assert!(wildcard_match(&parts("foo*bar*baz"), "foo1bar2baz"));
        assert!(!wildcard_match(&parts("foo*bar*baz"), "foo123baz"));
        // The prefix and suffix must not overlap: "ab*ba" does not match "aba".
        assert!(!wildcard_match(&parts("ab*ba"), "aba"));
        assert!(wildcard_match(&parts("*"), ""));
        assert!(wildcard_match(&parts("a**b"), "ab"));
        assert!(wildcard_match(&parts("exact"), "exact"));
    }
}
