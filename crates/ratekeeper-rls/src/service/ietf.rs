//! The IETF draft's fields (draft-ietf-httpapi-ratelimit-headers-11) and the RFC 9457
//! problem details of a refusal, for the limit that decided a request.
//!
//! `RateLimit-Policy: "<name>";q=<quota>;w=<window>` and `RateLimit: "<name>";r=<remaining>;t=<reset>`
//! are RFC 9651 lists of one item: a String (the policy's name) with Integer parameters.
//! `q` is the rule's `requests_per_unit` and `w` its period in seconds (`period:` or the
//! unit's length): for GCRA and the leaky bucket, whose burst is `requests_per_unit` here, the
//! period is the time an empty bucket takes to refill, so `q / w` is the sustained rate in
//! every case. `r` is `limit_remaining` and `t` the seconds of `duration_until_reset`.
//! No partition key (`pk`) is sent: descriptor values may be credentials.

/// The registered problem type of a refusal (the draft's IANA registration).
pub(super) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The policy name as an RFC 9651 String: the rule's `name`, else `default`; characters
/// outside printable ASCII become `?`, and `"` and `\` are escaped.
pub(super) fn sf_string(name: Option<&str>) -> String {
    let name = name.filter(|n| !n.is_empty()).unwrap_or("default");
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// `RateLimit-Policy`: `"<name>";q=<quota>;w=<window s>`.
pub(super) fn policy(name: Option<&str>, quota: u32, window_secs: u64) -> String {
    format!("{};q={quota};w={window_secs}", sf_string(name))
}

/// `RateLimit`: `"<name>";r=<remaining>;t=<reset s>`.
pub(super) fn state(name: Option<&str>, remaining: u32, reset_secs: u64) -> String {
    format!("{};r={remaining};t={reset_secs}", sf_string(name))
}

/// The RFC 9457 body of a refusal: `quota-exceeded`, status 429, the violated policy, and
/// when to retry in plain words.
pub(super) fn problem(name: Option<&str>, reset_secs: u64) -> Vec<u8> {
    let name = name.filter(|n| !n.is_empty()).unwrap_or("default");
    serde_json::json!({
        "type": QUOTA_EXCEEDED,
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!("quota '{name}' exceeded; retry in {reset_secs} s"),
        "violated-policies": [name],
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_rfc_9651_strings() {
        assert_eq!(sf_string(None), "\"default\"");
        assert_eq!(sf_string(Some("")), "\"default\"");
        assert_eq!(sf_string(Some("a\"b\\c")), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string(Some("é\t")), "\"??\"");
        assert_eq!(policy(Some("api"), 100, 10), "\"api\";q=100;w=10");
        assert_eq!(state(None, 0, 7), "\"default\";r=0;t=7");
    }

    #[test]
    fn the_problem_body_is_quota_exceeded() {
        let v: serde_json::Value = serde_json::from_slice(&problem(Some("api"), 5)).unwrap();
        assert_eq!(v["type"], QUOTA_EXCEEDED);
        assert_eq!(v["status"], 429);
        assert_eq!(v["violated-policies"][0], "api");
        assert_eq!(v["detail"], "quota 'api' exceeded; retry in 5 s");
    }
}
