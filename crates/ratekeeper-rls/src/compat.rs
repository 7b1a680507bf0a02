//! Where this service differs from envoyproxy/ratelimit, and why.
//!
//! A config file, a manifest's environment or a request that works with the reference means
//! the same here, except for the rows below. Each row is checked by the test named in it
//! (in `crates/ratekeeper-rls/tests/`).
//!
//! # Config files
//!
//! | # | reference | here | why | test |
//! |---|---|---|---|---|
//! | C1 | A request entry `(a, b)` is looked up as the string `a_b`, so it also hits a config descriptor `key: a_b` without value. | Entries match structurally: `(a, b)` hits only `key: a, value: b`, a wildcard value of key `a`, or `key: a` without value. | The `_` join lets one key's value impersonate another key (a user-controlled value could select another rule). | `compat::c1_entries_match_structurally` |
//! | C2 | `key: a_b` and `key: a, value: b` at one level are a "duplicate composite key". | They are two descriptors. | Same join; rejecting a valid file for it helps nobody. | `compat::c2_no_duplicate_through_the_join` |
//! | C3 | A `*` in a descriptor's *key* is a wildcard too (the pattern is matched against `key_value`), and `share_threshold` is accepted when the key has a `*`. | A `*` is a wildcard only in `value`; in a key it is a literal character, and `share_threshold` needs a `*` in the value. | Keys are names chosen by the Envoy route config, not patterns; the reference's behaviour is a side effect of the join. | `compat::c3_star_in_a_key_is_literal` |
//! | C4 | Errors name the file only; the first of several errors found (in random map order). | Every error has `file:line:column`, and the checks run in document order, so the first error in the file is the one reported. Messages are worded here. | Pointing at the line saves the search. | `config_errors::*` (each asserts line and column) |
//! | C5 | A key repeated in one map: the last one silently wins. | An error at the second one. | Two `rate_limit:` in one descriptor is always a mistake, and the silent choice hides it. | `compat::c5_repeated_map_key_is_an_error` |
//! | C6 | A file with several YAML documents (`---`): only the first is read. | An error at the second document. | The other documents were silently dropped. | `compat::c6_second_document_is_an_error` |
//! | C7 | Every file under the directory is read, recursively, whatever its name. | Only `*.yaml` / `*.yml` files of the directory itself; other regular files give a warning. | A ConfigMap mount has `..data` directories that the recursive read loads twice (hence the reference's need for `RUNTIME_IGNOREDOTFILES`); editor backups (`x.yaml~`) must not load. | `compat::c7_only_yaml_files_of_the_directory` |
//! | C8 | Files load in the order of a Go map; with two files for one domain, either may be named in the error. | Files load in name order; the error names both files. | Deterministic reloads and errors. | `compat::c8_files_load_in_name_order` |
//! | C9 | A `float` in `metadata` that is NaN or infinite loads (it cannot be sent as JSON). | An error. | Metadata is returned as JSON (dynamic metadata, `/rlconfig`). | `compat::c9_non_finite_metadata_is_an_error` |
//! | C10 | The stats key `domain.k1_v1.k2_v2` is split on `.` into Prometheus labels, so a value with a `.` shifts the labels. | [`Match::metric_keys`](crate::config::Match::metric_keys) builds `key1`/`key2` from the match, so a value with a `.` stays in its label. | Labels must not depend on the values' characters. | `compat::c10_dots_stay_in_their_label` |
//! | C11 | The counter (Redis key) is `prefix + domain_k1_v1_k2_v2_…_window`, ambiguous for values with `_`: `(a_b, c)` and `(a, b_c)` share a counter. | [`Match::counter_key`](crate::config::Match::counter_key) is length-prefixed: they are two counters. | Two callers must never share a counter by accident. | `compat::c11_counter_keys_are_unambiguous` |
//!
//! Not differences (same as the reference): YAML 1.1 reading of plain scalars (`yes`, `on`,
//! `0x1F`, `010`), string fields taking any scalar's text, a float leaf outside `metadata`
//! refused, keys checked against one flat allow-list at every level (a misplaced key loads,
//! with a [`ConfigWarning`](crate::config::ConfigWarning) here), `requests_per_unit` missing
//! = 0, `shadow_mode` not inherited.
//!
//! # Settings
//!
//! | # | reference | here | why | test |
//! |---|---|---|---|---|
//! | S1 | The store is always Redis (`REDIS_URL` defaults to `/var/run/nutcracker/ratelimit.sock`). | Redis when `REDIS_URL`, `--redis`, `BACKEND_TYPE=redis` or `--store` asks for it; otherwise the memory store. | A single binary that starts with nothing but a config file. | `settings::memory_store_without_redis_url` |
//! | S2 | `REDIS_SOCKET_TYPE` unset means `unix`. | Unset means `unix` for a path starting with `/`, else `tcp`. | `REDIS_URL=redis:6379` without a socket type is meant as TCP. | `settings::socket_type_is_inferred_when_unset` |
//! | S3 | `CONFIG_TYPE=GRPC_XDS_SOTW` (xDS), `BACKEND_TYPE=memcache`, `REDIS_TYPE=sentinel`, `GRPC_UDS`, `GRPC_SERVER_USE_TLS=true` work. | Errors at start-up. | Not implemented; starting without them would silently change what the service does. | `settings::unsupported_modes_are_errors` |
//! | S4 | statsd, pools, pipelines, per-second Redis, local cache, jitter, tracing settings work. | Ignored with a warning. | They tune the Go server; the decisions stay the same. | `settings::go_only_variables_warn` |
//! | S5 | An empty variable is an error for a boolean (`strconv.ParseBool("")`) and otherwise empty. | An empty variable counts as unset (its default). | Manifests set `VAR: ""` to mean "default". | `settings::empty_variables_are_unset` |
