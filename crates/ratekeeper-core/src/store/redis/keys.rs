//! Redis key names: `rl:v2:{<client key>}:<policy>`.

use std::fmt::Write as _;

use crate::Key;

/// Encoded client keys longer than this many bytes are replaced by their SHA-1.
pub(super) const MAX_TAG_BYTES: usize = 128;

/// The state-format version in every key name (a script that changes its state layout
/// bumps it, so old and new deploys never read each other's state).
pub(super) const VERSION: &str = "v2";

/// The hash-tag body for a client key: injective (different keys never share a name), free
/// of `{ } | %`, `( ) ,` inside strings, spaces and control bytes (escaped as `%XX`), and at
/// most [`MAX_TAG_BYTES`] long (longer encodings become `h:<sha1 hex>`).
pub(super) fn tag(key: &Key) -> String {
    let mut out = String::new();
    push_tag(&mut out, key);
    out
}

/// Appends the hash-tag body of `key` ([`tag`]) to `out`.
fn push_tag(out: &mut String, key: &Key) {
    let start = out.len();
    encode(key, out);
    if out.len() - start > MAX_TAG_BYTES {
        let digest = sha1_smol::Sha1::from(&out.as_bytes()[start..])
            .digest()
            .to_string();
        out.truncate(start);
        out.push_str("h:");
        out.push_str(&digest);
    }
}

/// Appends the full key of (`policy`, client `key`) to `out`, the same name as
/// [`full`]`(prefix, &tag(key), policy)` without building the tag on its own.
pub(super) fn push_full(out: &mut String, prefix: &str, key: &Key, policy: &str) {
    out.push_str(prefix);
    out.push(':');
    out.push_str(VERSION);
    out.push_str(":{");
    push_tag(out, key);
    out.push_str("}:");
    out.push_str(policy);
}

fn encode(key: &Key, out: &mut String) {
    match key {
        Key::Global => out.push('g'),
        Key::Ip(ip) => {
            let _ = write!(out, "ip:{ip}");
        }
        Key::Net(ip, len) => {
            let _ = write!(out, "net:{ip}/{len}");
        }
        Key::Int(n) => {
            let _ = write!(out, "i:{n}");
        }
        Key::Str(s) => {
            out.push_str("s:");
            escape(s, out);
        }
        Key::Tuple(parts) => {
            out.push('(');
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                encode(part, out);
            }
            out.push(')');
        }
    }
}

fn escape(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    // Runs of plain bytes are copied whole (a key is usually one run). A run is ASCII and
    // follows an escaped byte or the start, so both its ends are character boundaries.
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        if plain(b) {
            continue;
        }
        if let Some(plain_run) = s.get(run..i) {
            out.push_str(plain_run);
        }
        out.push('%');
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xF)]));
        run = i + 1;
    }
    if let Some(plain_run) = s.get(run..) {
        out.push_str(plain_run);
    }
}

/// Whether a byte of a string key is written as is (see [`tag`]).
const fn plain(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b'|' | b'%' | b'(' | b')' | b',')
}

/// The full key of one (policy, client key) pair.
pub(super) fn full(prefix: &str, tag: &str, policy: &str) -> String {
    // Pushed piece by piece: `format!` cost about 1 500 instructions per decision here
    // (callgrind of the Redis store's check under `scripts/redis_bench.sh`).
    let mut out =
        String::with_capacity(prefix.len() + VERSION.len() + tag.len() + policy.len() + 5);
    out.push_str(prefix);
    out.push(':');
    out.push_str(VERSION);
    out.push_str(":{");
    out.push_str(tag);
    out.push_str("}:");
    out.push_str(policy);
    out
}

/// What a state key's reset fence adds to its name: `<state key>#reset` (a policy name has
/// no `#`, so no state is ever named like a fence), same hash tag.
pub(super) const FENCE_SUFFIX: &str = "#reset";

/// Appends the reset fence of the state key `full` (made by [`full`] or [`push_full`]) to
/// `out`: `<full>#reset`.
pub(super) fn push_fence(out: &mut String, full: &str) {
    out.push_str(full);
    out.push_str(FENCE_SUFFIX);
}

/// The ban key of the limiter key `full` (made by [`full`]) of `policy`:
/// `<prefix>:v2:{<client key>}:ban:<policy>`, in the same Cluster slot (same hash tag). A
/// policy name has no `:`, so no policy's limiter key and no concurrency key
/// (`...:conc:<name>`) is ever named like a ban key.
pub(super) fn ban(full: &str, policy: &str) -> String {
    let stem = full.strip_suffix(policy).unwrap_or(full);
    let mut out = String::with_capacity(full.len() + 4);
    out.push_str(stem);
    out.push_str("ban:");
    out.push_str(policy);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv6Addr};

    #[test]
    fn kinds_never_collide_and_specials_are_escaped() {
        assert_eq!(tag(&Key::from("7")), "s:7");
        assert_eq!(tag(&Key::from(7u64)), "i:7");
        assert_eq!(tag(&Key::from("a{b}|c%d e\n")), "s:a%7Bb%7D%7Cc%25d%20e%0A");
        assert_eq!(
            tag(&Key::tuple([Key::from("a,b"), Key::from("c")])),
            "(s:a%2Cb,s:c)"
        );
        assert_ne!(
            tag(&Key::tuple([Key::from("a,b"), Key::from("c")])),
            tag(&Key::tuple([Key::from("a"), Key::from("b,c")]))
        );
        assert_eq!(tag(&Key::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST))), "ip:::1");
        assert_eq!(tag(&Key::from("é")), "s:%C3%A9");
    }

    #[test]
    fn long_keys_are_hashed_and_full_names_carry_one_hash_tag() {
        let long = tag(&Key::from("x".repeat(1_000)));
        assert!(long.starts_with("h:"));
        assert_eq!(long.len(), 42);
        assert_ne!(long, tag(&Key::from("x".repeat(1_001))));
        assert_eq!(full("rl", "s:user:42", "api"), "rl:v2:{s:user:42}:api");
    }

    #[test]
    fn a_name_pushed_in_place_is_the_full_name_of_the_tag() {
        let keys = [
            Key::from("user:42"),
            Key::from("a{b}|c%d e\n"),
            Key::from("é ü,"),
            Key::from("x".repeat(1_000)),
            Key::from(7u64),
            Key::Global,
            Key::tuple([Key::from("a,b"), Key::from(9u64)]),
        ];
        // One buffer for several names, as a group keeps them.
        let mut out = String::from("earlier");
        for key in &keys {
            let start = out.len();
            push_full(&mut out, "rl", key, "api");
            assert_eq!(&out[start..], full("rl", &tag(key), "api"), "{key:?}");
        }
    }
}
