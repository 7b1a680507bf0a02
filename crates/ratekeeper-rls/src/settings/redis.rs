//! Redis settings from `REDIS_URL`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS` or `--redis`.

use super::vars::Env;
use super::{RedisSettings, SettingsError, StoreKind};

/// Splits `scheme://user:pass@rest` into the URL without credentials and the credentials.
fn split_credentials(url: &str) -> (String, Option<String>, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None, None);
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None, None);
    };
    let userinfo = &rest[..at];
    let (user, pass) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p.to_owned())),
        None => (userinfo, None),
    };
    let user = (!user.is_empty()).then(|| user.to_owned());
    (format!("{scheme}://{}", &rest[at + 1..]), user, pass)
}

pub(super) fn redis_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    value: &str,
    from_flag: bool,
    cluster: bool,
) -> Result<RedisSettings, SettingsError> {
    let tls = env.bool("REDIS_TLS", false)?;
    let socket_type = env.var("REDIS_SOCKET_TYPE").map(|v| v.to_ascii_lowercase());
    if let Some(t) = &socket_type
        && t != "tcp"
        && t != "unix"
    {
        return Err(SettingsError::InvalidEnv {
            name: "REDIS_SOCKET_TYPE",
            value: t.clone(),
            expected: "tcp or unix",
        });
    }
    let mut urls = Vec::new();
    let mut username = None;
    let mut password = None;
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let url = if part.contains("://") {
            part.to_owned()
        } else {
            let unix = match (&socket_type, from_flag) {
                (Some(t), false) => t == "unix",
                _ => part.starts_with('/'),
            };
            match (unix, tls) {
                (true, _) => format!("redis+unix://{part}"),
                (false, true) => format!("rediss://{part}"),
                (false, false) => format!("redis://{part}"),
            }
        };
        let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s));
        if !scheme_ok {
            return Err(if from_flag {
                SettingsError::InvalidFlag {
                    flag: "redis",
                    value: "<redacted>".to_owned(),
                    expected: "redis://, rediss://, redis+unix:// or host:port",
                }
            } else {
                SettingsError::InvalidEnv {
                    name: "REDIS_URL",
                    value: "<redacted>".to_owned(),
                    expected: "host:port, a socket path, or a redis:// URL",
                }
            });
        }
        let (bare, user, pass) = split_credentials(&url);
        username = username.or(user);
        password = password.or(pass);
        urls.push(bare);
    }
    if urls.is_empty() {
        return Err(SettingsError::MissingRedisUrl {
            store: if cluster {
                StoreKind::RedisCluster
            } else {
                StoreKind::Redis
            },
        });
    }
    // REDIS_AUTH is `password` or `user:password` (the reference's form).
    if let Some(auth) = env.var("REDIS_AUTH") {
        match auth.split_once(':') {
            Some((u, p)) => {
                username = Some(u.to_owned());
                password = Some(p.to_owned());
            }
            None => password = Some(auth),
        }
    }
    Ok(RedisSettings {
        urls,
        cluster,
        username,
        password,
    })
}

/// Percent-encodes a URL user-info part (RFC 3986 unreserved characters kept).
fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL with `user:password@` inserted after the scheme (none when there is no password
/// and no user).
pub(super) fn with_credentials(url: &str, user: Option<&str>, password: Option<&str>) -> String {
    if user.is_none() && password.is_none() {
        return url.to_owned();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    if scheme == "redis+unix" || scheme == "unix" {
        // The redis crate reads Unix-socket credentials from the query.
        let mut query = Vec::new();
        if let Some(u) = user {
            query.push(format!("user={}", encode_userinfo(u)));
        }
        if let Some(p) = password {
            query.push(format!("pass={}", encode_userinfo(p)));
        }
        let sep = if rest.contains('?') { '&' } else { '?' };
        return format!("{scheme}://{rest}{sep}{}", query.join("&"));
    }
    let user = user.map(encode_userinfo).unwrap_or_default();
    match password {
        Some(p) => format!("{scheme}://{user}:{}@{rest}", encode_userinfo(p)),
        None => format!("{scheme}://{user}@{rest}"),
    }
}
