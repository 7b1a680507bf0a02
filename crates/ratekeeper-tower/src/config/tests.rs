//! `LayerConfig::from_toml`: settings that parse one by one but do not fit together are
//! reported with their line, column and field.

use super::*;
use crate::error::BuildError;

const API: &str = "[[policies]]\nname = \"api\"\nquota = \"10/m\"\n";

/// `(document, line, column, field, message)` of settings that parse one by one but do
/// not fit together: `from_toml` names where, as for a typo.
fn mismatches() -> Vec<(String, usize, usize, &'static str, &'static str)> {
    let route = "[[routes]]\nmethod = \"GET\"\npath = \"/x\"\n";
    vec![
        (
            "policies = []\n".to_owned(),
            1,
            12,
            "policies",
            "a rate limit needs at least one policy",
        ),
        (
            "[[policies]]\nname = \"\"\nquota = \"1/s\"\n".to_owned(),
            2,
            8,
            "policies[0].name",
            "invalid policy name \"\"",
        ),
        (
            format!("{API}{API}"),
            5,
            8,
            "policies[1].name",
            "policy name \"api\" is used twice",
        ),
        (
            format!("{API}algorithm = \"concurrency\"\n"),
            4,
            13,
            "policies[0].algorithm",
            "policy \"api\" uses the concurrency algorithm",
        ),
        (
            "[[policies]]\nname = \"search\"\nquota = \"10/m burst 3\"\n\
             algorithm = \"sliding_window\"\n"
                .to_owned(),
            3,
            9,
            "policies[0].quota",
            "policy \"search\" sets burst 3 but algorithm sliding-window takes no burst (it \
             holds the limit, 10): remove the burst, or use gcra or leaky-bucket, the \
             algorithms that take one",
        ),
        (
            format!("key = {{ kind = \"header\" }}\n{API}"),
            1,
            7,
            "key.header",
            "a `header` key needs the header's name",
        ),
        (
            format!("key = {{ trusted = [\"10.0.0.0/8\"] }}\n{API}"),
            1,
            19,
            "key.trusted",
            "`trusted` only applies with kind = \"forwarded\"",
        ),
        (
            format!("key = {{ kind = \"global\", header = \"x-api-key\" }}\n{API}"),
            1,
            35,
            "key.header",
            "`header` only applies with kind = \"header\"",
        ),
        (
            format!("{API}[exempt]\ntrusted = [\"127.0.0.1/32\"]\n"),
            5,
            11,
            "exempt.trusted",
            "`trusted` only applies with `networks` (the networks it exempts)",
        ),
        (
            format!(
                "key = {{ kind = \"forwarded\", trusted = [\"10.0.0.0/8\"] }}\n{API}\
                 [exempt]\nnetworks = [\"10.0.0.0/8\"]\ntrusted = [\"127.0.0.1/32\"]\n"
            ),
            7,
            11,
            "exempt.trusted",
            "a `forwarded` key's `trusted` networks already say which proxies forward",
        ),
        (
            format!("max_wait_ms = 5\n{API}"),
            1,
            15,
            "max_wait_ms",
            "`max_wait_ms` only applies with mode = \"delay\"",
        ),
        (
            format!("cost = 0\n{API}"),
            1,
            8,
            "cost",
            "a fixed request cost of 0 would never limit anything",
        ),
        (
            format!("cost = 11\n{API}"),
            1,
            8,
            "cost",
            "fixed request cost 11 is larger than the burst 10 of policy \"api\"",
        ),
        (
            format!("{API}{route}policies = [\"api\", \"nope\"]\n"),
            7,
            20,
            "routes[0].policies[1]",
            "there is no policy named \"nope\"",
        ),
        (
            format!("{API}{route}cost = 11\n"),
            7,
            8,
            "routes[0].cost",
            "fixed request cost 11 is larger than the burst 10 of policy \"api\"",
        ),
        (
            format!("{API}{route}cost = 0\n"),
            7,
            8,
            "routes[0].cost",
            "a fixed request cost of 0 would never limit anything",
        ),
        (
            format!("{API}{route}cost = 1\n{route}cost = 3\n"),
            8,
            1,
            "routes[1]",
            "GET /x is also routes[0]",
        ),
        (
            format!("{API}[tiers]\nheader = \"x-api-key\"\ndefault = \"nope\"\n"),
            6,
            11,
            "tiers.default",
            "there is no policy named \"nope\"",
        ),
        (
            format!(
                "{API}[tiers]\nheader = \"x-api-key\"\ndefault = \"api\"\n\
                 values = {{ \"k-1\" = \"paid\" }}\n"
            ),
            7,
            20,
            "tiers.values.k-1",
            "there is no policy named \"paid\"",
        ),
    ]
}

#[test]
fn settings_that_do_not_fit_name_their_line_column_and_field() {
    for (doc, line, column, field, message) in mismatches() {
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        assert_eq!(
            (err.line(), err.column(), err.field()),
            (Some(line), Some(column), field),
            "{err}\n{doc}"
        );
        assert!(err.message().starts_with(message), "{err}");
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("x.toml:{line}:{column}: {field}: {message}")),
            "{shown}"
        );
        assert!(!shown.contains('\n'), "{shown}");
    }
}

/// A route template or a tier value holding a line break is refused (it can never match),
/// and the error naming it stays on one line.
#[test]
fn templates_and_tier_values_with_line_breaks_are_refused_on_one_line() {
    let policy = "[[policies]]\nname = \"a\"\nquota = \"1/s\"\n";
    let route = format!("{policy}[[routes]]\nmethod = \"GET\"\npath = \"/a\\n/b\"\ncost = 1\n");
    let tier = format!(
        "{policy}[tiers]\nheader = \"x-plan\"\ndefault = \"a\"\nvalues = {{ \"gold\\nx\" = \"a\" }}\n"
    );
    for (doc, field, says) in [
        (route, "routes[0].path", "it holds a line break"),
        (tier, "tiers.values.gold\\nx", "can never match"),
    ] {
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        let shown = err.to_string();
        assert!(!shown.contains(['\n', '\r']), "{shown}");
        assert!(shown.contains(says), "{shown}");
        assert!(shown.contains(&format!(": {field}: ")), "{shown}");
    }
}

#[test]
fn a_policy_name_with_a_line_break_is_shown_on_one_line() {
    let doc = "[[policies]]\nname = \"a\\nb\"\nquota = \"1/s\"\n";
    let err = LayerConfig::from_toml("x.toml", doc).unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.toml:2:8: policies[0].name: invalid policy name \"a\\nb\": use 1 to 64 \
         characters from A-Z a-z 0-9 _ . -"
    );
    let err = BuildError::UnknownPolicy("a\nb".to_owned());
    assert_eq!(err.to_string(), "there is no policy named \"a\\nb\"");
}

#[test]
fn settings_that_fit_still_build() {
    let doc = format!(
        "{API}[[policies]]\nname = \"login\"\nquota = \"5/m\"\n\
         [[routes]]\nmethod = \"POST\"\npath = \"/login\"\npolicies = [\"login\"]\ncost = 5\n\
         [[routes]]\nmethod = \"GET\"\npath = \"/search\"\ncost = 10\n"
    );
    let config = LayerConfig::from_toml("x.toml", &doc).unwrap();
    assert_eq!(config.build().unwrap().policy_ids().len(), 2);
}

#[test]
fn a_bad_network_is_named_with_what_is_expected() {
    for (doc, line, column, field, value) in [
        (
            format!("{API}[exempt]\nnetworks = [\"192.0.2.0/24\", \"192.0.2.1\"]\n"),
            5,
            29,
            "exempt.networks[1]",
            "\"192.0.2.1\"",
        ),
        (
            format!("key = {{ kind = \"forwarded\", trusted = [\"10.0.0.0/33\"] }}\n{API}"),
            1,
            40,
            "key.trusted[0]",
            "\"10.0.0.0/33\"",
        ),
    ] {
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        assert_eq!(
            (err.line(), err.column(), err.field()),
            (Some(line), Some(column), field),
            "{err}"
        );
        assert!(
            err.message().starts_with(&format!(
                "invalid network {value}: expected an address and a prefix length"
            )),
            "{err}"
        );
    }
    let doc = format!("{API}[exempt]\nnetworks = [\"192.0.2.0/24\", \"2001:db8::/32\"]\n");
    let config = LayerConfig::from_toml("x.toml", &doc).unwrap();
    assert_eq!(config.exempt.networks.len(), 2);
}

/// A configured NAT64 prefix keys its addresses as IPv4 and applies to the exempt networks;
/// a prefix RFC 6052 does not define is an error naming the field.
#[tokio::test]
async fn a_nat64_prefix_applies_to_keys_and_exemptions() {
    use crate::key::PeerAddr;
    use tower::{Layer, ServiceExt};
    let doc = "key = { kind = \"peer_ip\", nat64 = [\"2001:db8:64::/96\"] }\n\
               [exempt]\nnetworks = [\"192.0.2.0/24\"]\n\
               [[policies]]\nname = \"a\"\nquota = \"1/min\"\n";
    let layer = LayerConfig::from_toml("x.toml", doc)
        .unwrap()
        .build()
        .unwrap();
    let svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    let call = |peer: &str| {
        let mut req = http::Request::new(());
        req.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        svc.clone().oneshot(req)
    };
    // The translator's spelling and the IPv4 address are one client with one budget.
    assert_eq!(
        call("[2001:db8:64::198.51.100.7]:1")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(call("198.51.100.7:1").await.unwrap().status(), 429);
    // An exempt IPv4 network holds its clients in the translator's spelling.
    for _ in 0..3 {
        let res = call("[2001:db8:64::192.0.2.7]:1").await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
    }
    for (bad, says) in [
        ("[\"2001:db8:64::/80\"]", "is not a NAT64 prefix"),
        ("[\"10.0.0.0/8\"]", "is not a NAT64 prefix"),
        ("[\"2001:db8:64::/96\", \"64:ff9b:1::/96\"]", "not several"),
    ] {
        let doc =
            format!("key = {{ nat64 = {bad} }}\n[[policies]]\nname = \"a\"\nquota = \"1/min\"\n");
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        assert_eq!(err.field(), "key.nat64", "{err}");
        assert!(err.message().contains(says), "{err}");
    }
}

/// A policy's `ban` reads from TOML, builds a layer that bans, and a bad ban is an error
/// naming its field.
#[tokio::test]
async fn a_ban_reads_from_toml_and_bad_bans_name_their_field() {
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    let doc = "key = { kind = \"global\" }\n[[policies]]\nname = \"login\"\nquota = \"1/m\"\n\
               ban = { after = 2, within = \"1m\", duration = \"15m\" }\n";
    let config = LayerConfig::from_toml("x.toml", doc).unwrap();
    let ban = config.policies[0].ban().copied().unwrap();
    assert_eq!(ban.refusals().get(), 2);
    assert_eq!(ban.within(), Duration::from_secs(60));
    assert_eq!(ban.duration(), Duration::from_secs(900));
    let svc = config
        .build()
        .unwrap()
        .layer(tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
    let retry_after = |res: &http::Response<_>| {
        res.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let mut seen = Vec::new();
    for _ in 0..4 {
        let res = svc.clone().oneshot(http::Request::new(())).await.unwrap();
        seen.push((res.status().as_u16(), retry_after(&res)));
    }
    // One allowed; the first refusal waits for the quota (60 s), the second bans for 15 min.
    assert_eq!(seen[0], (200, None));
    assert_eq!(seen[1], (429, Some("60".to_owned())));
    assert_eq!(seen[2], (429, Some("900".to_owned())));
    assert_eq!(seen[3], (429, Some("900".to_owned())));

    let policy = "[[policies]]\nname = \"login\"\nquota = \"1/h\"\n";
    for (ban, field, says) in [
        (
            "{ after = 2, within = \"0s\", duration = \"15m\" }",
            "policies[0].ban",
            "`within` is zero",
        ),
        (
            "{ after = 2, within = \"1m\", duration = \"400d\" }",
            "policies[0].ban",
            "`duration` is longer than 365 days",
        ),
        (
            "{ after = 2, within = \"1 fortnight\", duration = \"15m\" }",
            "policies[0].ban.within",
            "invalid duration \"1 fortnight\"",
        ),
        (
            "{ after = 0, within = \"1m\", duration = \"15m\" }",
            "policies[0].ban.after",
            "",
        ),
        (
            "{ after = 2, within = \"1m\" }",
            "policies[0].ban",
            "missing field `duration`",
        ),
        (
            "{ after = 2, within = \"1m\", duration = \"1m\", for = \"1m\" }",
            "policies[0].ban.for",
            "unknown field `for`",
        ),
    ] {
        let doc = format!("{policy}ban = {ban}\n");
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert_eq!(err.line(), Some(4), "{err}");
        assert!(err.message().contains(says), "{err}");
    }
}

/// A table or value of the wrong type (`ban = true`) names what is expected, with an example,
/// never a Rust type; a ban too long, however long, says so.
#[test]
fn values_of_the_wrong_type_say_what_is_expected() {
    let policy = "[[policies]]\nname = \"login\"\nquota = \"1/h\"\n";
    for (doc, field, says) in [
        (
            format!("{policy}ban = true\n"),
            "policies[0].ban",
            "invalid type: boolean `true`, expected a ban such as \
             { after = 10, within = \"15m\", duration = \"15m\" }",
        ),
        (
            format!(
                "{policy}ban = {{ after = 2, within = \"1m\", duration = \"99999999999999999999d\" }}\n"
            ),
            "policies[0].ban",
            "`duration` is longer than 365 days",
        ),
        (
            format!(
                "{policy}ban = {{ after = 1, within = \"1m\", duration = \"999999999999d\" }}\n"
            ),
            "policies[0].ban",
            "`duration` is longer than 365 days",
        ),
        (
            "policies = [true]\n".to_owned(),
            "policies[0]",
            "expected a policy such as { name = \"api\", quota = \"100/min\" }",
        ),
        (
            format!("key = true\n{policy}"),
            "key",
            "expected a key such as { kind = \"peer_ip\" }",
        ),
        (
            format!("key = {{ kind = 7 }}\n{policy}"),
            "key.kind",
            // The TOML reader's own words for a value that is not a name.
            "",
        ),
        (
            format!("routes = [true]\n{policy}"),
            "routes[0]",
            "expected a route such as { method = \"GET\", path = \"/search\", cost = 5 }",
        ),
        (
            format!("tiers = true\n{policy}"),
            "tiers",
            "expected tiers such as { header = \"x-api-key\"",
        ),
        (
            format!("exempt = true\n{policy}"),
            "exempt",
            "expected exemptions such as { networks = [\"192.0.2.0/24\"], preflight = false }",
        ),
        (
            format!("headers = true\n{policy}"),
            "headers",
            // The TOML reader's own words for a value that is not a name.
            "",
        ),
        (
            format!("mode = 1\n{policy}"),
            "mode",
            // The TOML reader's own words for a value that is not a name.
            "",
        ),
    ] {
        let err = LayerConfig::from_toml("x.toml", &doc).unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(err.message().contains(says), "{doc}: {err}");
        for internal in ["struct ", "enum ", "Form", "Config"] {
            assert!(!err.message().contains(internal), "{doc}: {err}");
        }
    }
}
