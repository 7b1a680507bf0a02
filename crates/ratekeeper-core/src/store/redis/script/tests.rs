//! The script call's commands, without a Redis: arguments in order, the `FCALL` and
//! `EVAL` forms.

use super::super::policy::RedisPolicy;
use super::*;
use crate::clock::ManualClock;
use crate::store::Receipt;
use crate::{Algorithm, Key, Policy, Quota};
use std::num::NonZeroU32;

/// The arguments of `cmd` as text.
fn args(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect()
}

#[test]
fn an_eval_carries_the_script_text_and_the_same_keys_and_arguments() {
    let mut evalsha = Entry::Limiter.command(false, 1, 2, 0);
    evalsha.arg("rl:v2:{s:k}:p").arg(42).arg("x");
    let sent = args(&eval(Entry::Limiter.text(), &evalsha));
    assert_eq!(sent[0], "EVAL");
    assert_eq!(sent[1], protocol::limiter_text());
    assert_eq!(sent[2..], args(&evalsha)[2..]);
    assert_eq!(sent[2..], ["1", "rl:v2:{s:k}:p", "42", "x"]);
    // The lease's text for the lease; each text is the one its hash names.
    let lease = args(&eval(
        Entry::Lease.text(),
        &Entry::Lease.command(false, 0, 0, 0),
    ));
    assert_eq!(lease[..3], ["EVAL", protocol::lease_text(), "0"]);
    for entry in [Entry::Limiter, Entry::Lease] {
        let hash = redis::Script::new(entry.text()).get_hash().to_owned();
        assert_eq!(hash, entry.script().get_hash());
    }
}

#[test]
fn a_command_carries_the_script_arguments_in_order() {
    // GCRA 1 per second, burst 2 (T = 1 s, tau = 2 s); fixed window 5 per 10 s.
    let gcra = Quota::per_second(NonZeroU32::MIN).with_burst(2).unwrap();
    let gcra = RedisPolicy::new(&Policy::new("p1", gcra)).unwrap();
    let window = Quota::new(5, Duration::from_secs(10)).unwrap();
    let window = Policy::new("p2", window).with_algorithm(Algorithm::FixedWindow);
    let window = RedisPolicy::new(&window).unwrap();
    let key = Key::from("a b");
    let mut group = Group::default();
    group.push("rl", &key, &gcra, 1, Receipt::NONE, 0);
    group.push("rl", &key, &window, 3, Receipt::new(7), 1);
    assert_eq!(group.slots().collect::<Vec<_>>(), [0, 1]);

    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let timing = super::super::link::Timing {
        connect: Duration::from_millis(10),
        ready: Duration::from_millis(10),
        every: Duration::from_millis(10),
    };
    let clock = ManualClock::new();
    clock.set(42_000_000);
    let runner = ScriptRunner::new(
        Conn::Single(Link::single(client, timing)),
        5,
        Some(Arc::new(clock.clone())),
        Arc::new(clock),
        Guard::new(1_000),
    );
    let hash = protocol::limiter_script().get_hash().to_owned();
    let mut expected = vec![
        "EVALSHA",
        &hash,
        "2",
        "rl:v2:{s:a%20b}:p1",
        "rl:v2:{s:a%20b}:p2",
        // Injected now (µs), no stale guard before a first reply, op, min TTL.
        "42000",
        "",
        "1",
        "5",
        // Per key: algorithm, three parameters, cost, receipt stamp.
        "1",
        "1000000",
        "2000000",
        "2",
        "1",
        "-1",
        "2",
        "10000000",
        "5",
        "0",
        "3",
        "7",
    ];
    assert_eq!(
        args(&runner.command(&group, Mode::Check, 10, false)),
        expected
    );

    // With a learned offset the guard is sent + offset + allowance, Redis µs; a
    // reservation says how long it may wait; a peek or an inspection declares the
    // states alone, like a check.
    runner.guard.learn(10, 1_000_000);
    expected[6] = "1001000";
    assert_eq!(
        args(&runner.command(&group, Mode::Check, 10, false)),
        expected
    );
    for (mode, arg) in [(Mode::Peek, "2"), (Mode::Inspect, "6")] {
        expected[7] = arg;
        assert_eq!(args(&runner.command(&group, mode, 10, false)), expected);
    }
    // A reservation's op, and the most it may wait after the min TTL.
    let mut reserve = expected.clone();
    reserve[7] = "7";
    reserve.insert(9, "250");
    assert_eq!(
        args(&runner.command(&group, Mode::Reserve(250), 10, false)),
        reserve
    );
    expected[7] = "1";
    // With functions, the same arguments after `FCALL <function>`.
    let mut fcall = args(&runner.command(&group, Mode::Check, 10, true));
    assert_eq!(fcall[..2], ["FCALL", protocol::limiter_function()]);
    fcall[..2].clone_from_slice(&["EVALSHA".to_owned(), hash.clone()]);
    assert_eq!(fcall, expected);
    // A refund, a correction and a reset carry no guard and declare each state's reset
    // fence after the states (the script reads or writes it): four keys.
    let fenced = |expected: &[&str], mode: &str| {
        let mut out: Vec<String> = expected.iter().map(|a| (*a).to_owned()).collect();
        out[2] = "4".to_owned();
        out[6] = String::new();
        out[7] = mode.to_owned();
        out.insert(5, "rl:v2:{s:a%20b}:p1#reset".to_owned());
        out.insert(6, "rl:v2:{s:a%20b}:p2#reset".to_owned());
        out
    };
    for (mode, arg) in [
        (Mode::Refund, "3"),
        (Mode::Correct, "4"),
        (Mode::Reset, "5"),
    ] {
        assert_eq!(
            args(&runner.command(&group, mode, 10, false)),
            fenced(&expected, arg)
        );
    }
    // A refund group keeps the names and parameters, with the receipts given.
    let refund = group.refund_of([Receipt::new(11), Receipt::NONE]);
    expected[14] = "11";
    expected[20] = "-1";
    assert_eq!(
        args(&runner.command(&refund, Mode::Refund, 10, false)),
        fenced(&expected, "3")
    );
}

/// A group with a ban declares the ban key last, after the states and (when the mode
/// touches them) their fences.
#[test]
fn ban_keys_come_after_the_states_and_their_fences() {
    let quota = Quota::per_second(NonZeroU32::MIN);
    let ban =
        crate::Ban::after(NonZeroU32::MIN, Duration::from_secs(1)).lasting(Duration::from_secs(1));
    let banned = RedisPolicy::new(&Policy::new("p", quota).with_ban(ban)).unwrap();
    let mut group = Group::default();
    group.push("rl", &Key::from("k"), &banned, 1, Receipt::NONE, 0);
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let timing = super::super::link::Timing {
        connect: Duration::from_millis(10),
        ready: Duration::from_millis(10),
        every: Duration::from_millis(10),
    };
    let clock = ManualClock::new();
    let runner = ScriptRunner::new(
        Conn::Single(Link::single(client, timing)),
        0,
        None,
        Arc::new(clock),
        Guard::new(1_000),
    );
    let check = args(&runner.command(&group, Mode::Check, 0, false));
    assert_eq!(check[2..5], ["2", "rl:v2:{s:k}:p", "rl:v2:{s:k}:ban:p"]);
    let reset = args(&runner.command(&group, Mode::Reset, 0, false));
    assert_eq!(
        reset[2..6],
        [
            "3",
            "rl:v2:{s:k}:p",
            "rl:v2:{s:k}:p#reset",
            "rl:v2:{s:k}:ban:p"
        ]
    );
    // The bans' tail: the charge's position, refusals, within and duration (µs), count.
    assert_eq!(
        reset[reset.len() - 5..],
        ["1", "1", "1000000", "1000000", "1"]
    );
}
