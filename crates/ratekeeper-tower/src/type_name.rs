//! Type names for the startup log, shared by the key extractors and the rate-limit layer.

/// A type's name without module paths (`Or<HeaderKey<Raw>, PeerIp>`), for the built event.
pub(crate) fn short_type_name<T: ?Sized>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut word = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(&word));
            word.clear();
            out.push(c);
        }
    }
    out.push_str(word.rsplit("::").next().unwrap_or(&word));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_short() {
        assert_eq!(
            short_type_name::<crate::key::Or<crate::key::PeerIp, crate::key::GlobalKey>>(),
            "Or<PeerIp, GlobalKey>"
        );
    }
}
