//! The few JSON documents the layers write (RFC 9457 problem details), written directly:
//! strings escaped as RFC 8259 §7 requires, byte for byte as `serde_json` writes them
//! (`"`, `\` and the control characters escaped, `\n`-style where JSON has a short form,
//! `\u00xx` with lower-case hex otherwise), so the crate needs no JSON library.

/// Appends `s` to `out` as a JSON string (quotes included).
pub(crate) fn push_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0x00..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.push(b'\\');
        out.push(short);
        if short == b'u' {
            out.extend_from_slice(b"00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// An RFC 9457 problem details document: `type`, `title`, `status`, `detail` and, when
/// given, `violated-policies` (draft-ietf-httpapi-ratelimit-headers), in that order.
pub(crate) fn problem(
    kind: &str,
    title: &str,
    status: u16,
    detail: &str,
    violated_policies: Option<&[&str]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + detail.len());
    out.extend_from_slice(b"{\"type\":");
    push_string(&mut out, kind);
    out.extend_from_slice(b",\"title\":");
    push_string(&mut out, title);
    out.extend_from_slice(b",\"status\":");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.extend_from_slice(b",\"detail\":");
    push_string(&mut out, detail);
    if let Some(names) = violated_policies {
        out.extend_from_slice(b",\"violated-policies\":[");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_string(&mut out, name);
        }
        out.push(b']');
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let nasty: String = (0u8..0x80)
            .map(char::from)
            .chain("é\u{2028}😀".chars())
            .collect();
        for s in ["", "plain", "q\"uo\\te", "\u{0}", &nasty] {
            let mut ours = Vec::new();
            push_string(&mut ours, s);
            assert_eq!(ours, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn problems_parse_back() {
        let body = problem("about:blank", "T", 429, "d\n", Some(&["a\"b", "c"]));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 429);
        assert_eq!(v["detail"], "d\n");
        assert_eq!(v["violated-policies"], serde_json::json!(["a\"b", "c"]));
    }
}
