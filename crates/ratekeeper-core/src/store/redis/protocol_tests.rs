//! The protocol checked without Redis: the rendered header, the names the chunks use, and the
//! Rust encoder and decoder against the layout constants.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::store::Receipt;
use crate::store::redis::group::Group;
use crate::store::redis::guard::Guard;
use crate::store::redis::link::{Link, Timing};
use crate::store::redis::policy::RedisPolicy;
use crate::store::redis::reply::parse_rows;
use crate::store::redis::script::{Conn, Mode, ScriptRunner};
use crate::{Algorithm, Ban, Key, Outcome, Policy, Quota};

/// A chunk's code without its comments (`--` to the end of the line) and with its string
/// literals (single-quoted, as the chunks write them) emptied.
fn code(chunk: &str) -> String {
    let mut out = String::new();
    for line in chunk.lines() {
        let mut quoted = false;
        let mut prev = ' ';
        for c in line.chars() {
            if !quoted && c == '-' && prev == '-' {
                out.pop();
                break;
            }
            if c == '\'' {
                quoted = !quoted;
                out.push(c);
            } else if !quoted {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The words of `text` (identifiers and numbers).
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.match_indices(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .scan(0, |start, (at, sep)| {
            let word = (*start, &text[*start..at]);
            *start = at + sep.len();
            Some(word)
        })
        .filter(|(_, w)| !w.is_empty())
}

#[test]
fn the_header_defines_every_constant_once_with_its_value() {
    let header = header();
    let mut seen = HashMap::new();
    for line in header.lines().filter(|l| l.starts_with("local ")) {
        let (name, value) = line
            .strip_prefix("local ")
            .and_then(|l| l.split_once(" = "))
            .expect("`local NAME = value`");
        // A token is a string, every other constant a number.
        let value = match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            Some(token) => {
                assert!(is_token(name), "{name} is quoted");
                token
            }
            None => {
                assert!(!is_token(name), "{name} is not quoted");
                value
            }
        };
        assert!(
            seen.insert(name, value.parse::<i64>().expect("an integer"))
                .is_none(),
            "{name} defined twice"
        );
    }
    assert_eq!(seen.len(), CONSTANTS.len());
    for (name, value) in CONSTANTS {
        assert_eq!(seen.get(name), Some(value), "{name}");
    }
    // The library starts with it, and defines no constant again.
    let body = body();
    assert!(body.starts_with(&header));
    for (name, _) in CONSTANTS {
        assert_eq!(
            body.matches(&format!("local {name} ")).count(),
            1,
            "{name} is defined again in a chunk"
        );
    }
}

/// Every upper-case name a chunk uses is a protocol constant or one of the prelude's
/// per-call tables (a misspelt constant would be a nil global at run time), and the
/// protocol's sets of values are distinct (two ops or two codes never share a number).
#[test]
fn every_upper_case_name_in_the_chunks_is_defined() {
    let constants: HashSet<&str> = CONSTANTS.iter().map(|(n, _)| *n).collect();
    let tables = [
        "K",
        "ALG",
        "P1",
        "P2",
        "P3",
        "COST",
        "STAMP",
        "SUFFIX",
        "LEDGER",
        "ALGORITHMS",
        "KEYS",
        "ARGV",
    ];
    for (file, chunk) in CHUNKS {
        for (_, word) in words(&code(chunk)) {
            let upper = word.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && word
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if upper {
                assert!(
                    constants.contains(word) || tables.contains(&word),
                    "{file}: {word} is not defined"
                );
            }
        }
    }
    for prefix in [
        "ALGO_", "OP_", "CODE_", "STATUS_", "ROW_", "CHARGE_", "BAN_", "ARG_",
    ] {
        let mut values = HashSet::new();
        // The offsets of a set, not its sizes.
        let sizes = ["ROW_LEN", "CHARGE_ARGS", "BAN_ARGS"];
        let set = CONSTANTS
            .iter()
            .filter(|(n, _)| n.starts_with(prefix) && !sizes.contains(n));
        for (name, value) in set {
            assert!(values.insert(value), "{name} shares its value");
        }
    }
}

/// No chunk compares an algorithm, an op, a stamp, a code or a status with a number: each
/// such value is named (`ALG[i] == ALGO_GCRA`, not `== 1`), and no chunk holds the ops'
/// old names.
#[test]
fn no_chunk_compares_a_protocol_value_with_a_bare_number() {
    let subjects = [
        "ALG[", "STAMP[", "op ", "kind ", "code ", "status ", "c ", "algo(",
    ];
    for (file, chunk) in CHUNKS {
        let code = code(chunk);
        for line in code.lines() {
            for cmp in ["==", "~="] {
                for (at, _) in line.match_indices(cmp) {
                    let before = line[..at].trim_end();
                    let after = line[at + 2..].trim_start();
                    let number = after.starts_with(|c: char| c.is_ascii_digit() || c == '-');
                    let subject = subjects.iter().any(|s| {
                        let s = s.trim_end();
                        before.ends_with(s)
                            || (s.ends_with('[')
                                && before.rsplit(s).count() > 1
                                && before.ends_with(']'))
                    });
                    assert!(
                        !(number && subject),
                        "{file}: `{}` compares with a bare number",
                        line.trim()
                    );
                }
            }
        }
        for old in [
            "'check'",
            "'peek'",
            "'refund'",
            "'correct'",
            "'reset'",
            "'inspect'",
            "'reserve",
        ] {
            assert!(!code.contains(old), "{file} holds the op name {old}");
        }
        // The algorithm tables are reached through ALGORITHMS, never by a number.
        assert!(!code.contains("ALGORITHMS[1]") && !code.contains("ALGORITHMS[2]"));
    }
}

#[test]
fn the_library_and_the_scripts_call_their_entries() {
    let library = library();
    assert!(library.starts_with(&format!("#!lua name=ratekeeper_{}\n", version())));
    for name in [limiter_function(), lease_function()] {
        assert!(library.contains(&format!("redis.register_function('{name}', ")));
    }
    let [limiter, lease, concurrency, fleet] = scripts();
    assert!(limiter.starts_with(body()) && limiter.ends_with("return limiter(KEYS, ARGV)\n"));
    assert!(lease.starts_with(body()) && lease.ends_with("return lease(KEYS, ARGV)\n"));
    assert_eq!([concurrency, fleet], [CONCURRENCY_SCRIPT, FLEET_SCRIPT]);
    assert_eq!(
        limiter_script().get_hash(),
        redis::Script::new(limiter).get_hash()
    );
    // Every chunk is in the library, each once, in order.
    let mut at = 0;
    for (file, chunk) in CHUNKS {
        let found = library[at..]
            .find(chunk)
            .unwrap_or_else(|| panic!("{file} missing"));
        at += found + chunk.len();
    }
}

/// The arguments of `cmd` as text.
fn args(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect()
}

fn runner() -> ScriptRunner {
    let client = redis::Client::open("redis://127.0.0.1:1/").expect("a client");
    let timing = Timing {
        connect: Duration::from_millis(10),
        ready: Duration::from_millis(10),
        every: Duration::from_millis(10),
    };
    let clock = ManualClock::new();
    clock.set(42_000_000);
    ScriptRunner::new(
        Conn::Single(Link::single(client, timing)),
        5,
        Some(Arc::new(clock.clone())),
        Arc::new(clock),
        Guard::new(1_000),
    )
}

/// The encoder writes each value where the `ARG_*`, `CHARGE_*` and `BAN_*` offsets say the
/// script reads it, in every op.
#[test]
fn the_encoder_writes_where_the_offsets_say() {
    let gcra = Quota::per_second(NonZeroU32::MIN)
        .with_burst(2)
        .expect("quota");
    let ban = Ban::after(NonZeroU32::MIN, Duration::from_secs(3)).lasting(Duration::from_secs(4));
    let gcra = RedisPolicy::new(&Policy::new("p1", gcra).with_ban(ban)).expect("policy");
    let window = Quota::new(5, Duration::from_secs(10)).expect("quota");
    let window = Policy::new("p2", window).with_algorithm(Algorithm::SlidingLog);
    let window = RedisPolicy::new(&window).expect("policy");
    let key = Key::from("k");
    let mut group = Group::default();
    group.push("rl", &key, &gcra, 1, Receipt::new(9), 0);
    group.push("rl", &key, &window, 3, Receipt::NONE, 1);
    let runner = runner();
    for (mode, op, fences) in [
        (Mode::Check, OP_CHECK, false),
        (Mode::Peek, OP_PEEK, false),
        (Mode::Inspect, OP_INSPECT, false),
        (Mode::Reserve(77), OP_RESERVE, false),
        (Mode::Refund, OP_REFUND, true),
        (Mode::Correct, OP_CORRECT, true),
        (Mode::Reset, OP_RESET, true),
    ] {
        let all = args(&runner.command(&group, mode, 10, false));
        // FCALL/EVALSHA, name, number of keys, KEYS, then ARGV (from 1, as Lua counts).
        let nkeys: usize = all[2].parse().expect("a key count");
        let argv = &all[3 + nkeys..];
        let arg = |k: usize| argv[k - 1].as_str();
        assert_eq!(nkeys, 2 * if fences { 2 } else { 1 } + 1, "{mode:?}");
        assert_eq!(arg(ARG_NOW), "42000");
        assert_eq!(arg(ARG_OP), op.to_string());
        assert_eq!(arg(ARG_MIN_TTL), "5");
        let mut head = ARGS_HEAD;
        if mode == Mode::Reserve(77) {
            assert_eq!(arg(ARG_MAX_WAIT), "77");
            head += 1;
        }
        let charge = |i: usize, k: usize| arg(head + CHARGE_ARGS * (i - 1) + k);
        assert_eq!(charge(1, CHARGE_ALGO), ALGO_GCRA.to_string());
        assert_eq!(charge(1, CHARGE_P1), "1000000");
        assert_eq!(charge(1, CHARGE_P2), "2000000");
        assert_eq!(charge(1, CHARGE_P3), "2");
        assert_eq!(charge(1, CHARGE_COST), "1");
        assert_eq!(charge(1, CHARGE_STAMP), "9");
        assert_eq!(charge(2, CHARGE_ALGO), ALGO_SLIDING_LOG.to_string());
        assert_eq!(charge(2, CHARGE_P1), "10000000");
        assert_eq!(charge(2, CHARGE_P2), "5");
        assert_eq!(charge(2, CHARGE_COST), "3");
        assert_eq!(charge(2, CHARGE_STAMP), STAMP_NONE.to_string());
        // The bans' tail: one ban, on charge 1; its key is the last key.
        let tail = head + CHARGE_ARGS * 2;
        assert_eq!(argv.len(), tail + BAN_ARGS + 1);
        assert_eq!(arg(tail + BAN_CHARGE), "1");
        assert_eq!(arg(tail + BAN_REFUSALS), "1");
        assert_eq!(arg(tail + BAN_WITHIN), "3000000");
        assert_eq!(arg(tail + BAN_DURATION), "4000000");
        assert_eq!(arg(argv.len()), "1");
        assert!(all[2 + nkeys].ends_with(":ban:p1"));
    }
}

/// The decoder reads each field where the `ROW_*` offsets say the script writes it, and the
/// sentinels come back as "none".
#[test]
fn the_decoder_reads_where_the_offsets_say_and_sentinels_round_trip() {
    let mut offsets = [
        ROW_CODE,
        ROW_REMAINING,
        ROW_RESET,
        ROW_RETRY,
        ROW_LESS,
        ROW_STAMP,
        ROW_HOLD,
    ];
    offsets.sort_unstable();
    assert_eq!(offsets, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(ROW_LEN, offsets.len());

    let gcra = Quota::per_second(NonZeroU32::new(10).expect("10"));
    let gcra = RedisPolicy::new(&Policy::new("p", gcra)).expect("policy");
    let mut group = Group::default();
    group.push("rl", &Key::from("k"), &gcra, 1, Receipt::NONE, 0);
    group.push("rl", &Key::from("k"), &gcra, 1, Receipt::NONE, 1);
    let row = |code: i64, remaining, reset, retry, less, stamp, hold| {
        let mut values = vec![redis::Value::Nil; ROW_LEN];
        for (offset, v) in [
            (ROW_CODE, code),
            (ROW_REMAINING, remaining),
            (ROW_RESET, reset),
            (ROW_RETRY, retry),
            (ROW_LESS, less),
            (ROW_STAMP, stamp),
            (ROW_HOLD, hold),
        ] {
            values[offset - 1] = redis::Value::Int(v);
        }
        values
    };
    let mut values = row(CODE_ALLOWED, 7, 300, 0, 0, 12_345, 40);
    values.extend(row(
        CODE_DENIED,
        0,
        900,
        2_000,
        250,
        STAMP_NONE,
        HOLD_UNBOUNDED,
    ));
    let rows = parse_rows(&group, &values).expect("rows");
    let (allowed, receipt, hold) = &rows[0];
    assert!(allowed.is_allowed());
    assert_eq!(allowed.remaining(), 7);
    assert_eq!(allowed.reset_after(), Duration::from_micros(300));
    assert_eq!(*receipt, Receipt::new(12_345));
    assert_eq!(*hold, Some(Duration::from_micros(40)));
    let (denied, receipt, hold) = &rows[1];
    assert_eq!(
        denied.outcome(),
        Outcome::Denied {
            retry_after: Duration::from_micros(2_000) - Duration::from_nanos(250)
        }
    );
    assert_eq!(denied.reset_after(), Duration::from_micros(900));
    assert_eq!(*receipt, Receipt::NONE);
    assert_eq!(*hold, None);
    // A ban's codes read as bans; an unknown code is an error, never an allowed.
    let mut banned = row(CODE_BAN_STARTED, 0, 5, 5, 0, STAMP_NONE, HOLD_UNBOUNDED);
    banned.extend(row(CODE_BANNED, 0, 5, 5, 0, STAMP_NONE, HOLD_UNBOUNDED));
    let rows = parse_rows(&group, &banned).expect("rows");
    assert!(rows[0].0.starts_ban() && rows[1].0.is_banned() && !rows[1].0.starts_ban());
    let mut unknown = row(CODE_BAN_STARTED + 1, 0, 0, 0, 0, STAMP_NONE, HOLD_UNBOUNDED);
    unknown.extend(row(CODE_ALLOWED, 0, 0, 0, 0, STAMP_NONE, HOLD_UNBOUNDED));
    assert!(parse_rows(&group, &unknown).is_err());

    // The encoder's sentinels: no receipt, a correction's extra charge, no reservation.
    let mut debit = group.refund_of([Receipt::NONE, Receipt::new(3)]);
    assert_eq!(debit.charges[0].stamp, STAMP_NONE);
    assert_eq!(debit.charges[1].stamp, 3);
    debit.mark_debits(|slot| slot == 1);
    assert_eq!(debit.charges[1].stamp, STAMP_DEBIT);
    assert_eq!(RESERVE_NONE, STAMP_NONE);
    assert_eq!(gcra.reserve, RESERVE_GCRA);
    let shaper =
        Policy::new("s", Quota::per_second(NonZeroU32::MIN)).with_algorithm(Algorithm::LeakyBucket);
    assert_eq!(
        RedisPolicy::new(&shaper).expect("policy").reserve,
        RESERVE_SHAPER
    );
    let window =
        Policy::new("w", Quota::per_second(NonZeroU32::MIN)).with_algorithm(Algorithm::FixedWindow);
    assert_eq!(
        RedisPolicy::new(&window).expect("policy").reserve,
        RESERVE_NONE
    );
}

/// Every name the library defines at its top level (`local NAME`, `local function NAME`,
/// `local A, B = ...`) is used only after its definition: a function that names a local
/// defined further down reads a global instead, which Redis refuses at run time
/// ("Script attempted to access nonexistent global variable").
#[test]
fn no_chunk_uses_a_top_level_name_before_its_definition() {
    let body = code(body());
    let mut defined: HashMap<&str, usize> = HashMap::new();
    for (at, line) in body.lines().scan(0, |pos, line| {
        let at = *pos;
        *pos += line.len() + 1;
        Some((at, line))
    }) {
        let Some(rest) = line.strip_prefix("local ") else {
            continue;
        };
        let rest = rest.strip_prefix("function ").unwrap_or(rest);
        let names = rest.split(['=', '(']).next().unwrap_or_default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            defined.entry(name).or_insert(at);
        }
    }
    assert!(defined.contains_key("limiter") && defined.contains_key("gcra"));
    for (at, word) in words(&body) {
        // A field (`gcra.load`, `t.x`) is not the local of that name.
        if body[..at].ends_with('.') {
            continue;
        }
        if let Some(&def) = defined.get(word) {
            if at < def && declared_in_function(&body[..at], word) {
                continue;
            }
            assert!(
                at >= def,
                "`{word}` is used before its definition: {}",
                body[at.saturating_sub(60)..at + word.len()].replace('\n', " ")
            );
        }
    }
}

/// Whether `name` is a parameter or a local of the top-level function `before` ends in (the
/// text from the last line that starts a top-level function): then a use of it there is
/// that variable, not the top-level name.
fn declared_in_function(before: &str, name: &str) -> bool {
    let start = before
        .rmatch_indices('\n')
        .map(|(at, _)| at + 1)
        .find(|&at| {
            let line = &before[at..];
            line.starts_with("function ") || line.starts_with("local function ")
        })
        .unwrap_or(0);
    let scope = &before[start..];
    // The declaration itself: a parameter list, or a `local` or `for` list, still open.
    let line = scope.rsplit('\n').next().unwrap_or_default().trim_start();
    let open_params = line.contains("function")
        && line
            .rfind('(')
            .is_some_and(|o| line.rfind(')').is_none_or(|c| c < o));
    let open_list = (line.starts_with("local ") || line.starts_with("for "))
        && !line.contains('=')
        && !line.contains(" in ");
    if open_params || open_list {
        return true;
    }
    let is_name = |list: &str| list.split(',').any(|p| p.trim() == name);
    // Parameters of the functions defined in it.
    let params = scope.match_indices("function").any(|(at, _)| {
        let rest = &scope[at..];
        match (rest.find('('), rest.find(')')) {
            (Some(open), Some(close)) if open < close => is_name(&rest[open + 1..close]),
            _ => false,
        }
    });
    // Its locals (`local a, b = ...`, `for a, b in`, `for a = `).
    let locals = scope.lines().any(|line| {
        let line = line.trim_start();
        let list = line
            .strip_prefix("local ")
            .or_else(|| line.strip_prefix("for "))
            .map(|rest| rest.split(['=', '(']).next().unwrap_or_default())
            .map(|rest| rest.split(" in ").next().unwrap_or_default());
        list.is_some_and(is_name)
    });
    params || locals
}
