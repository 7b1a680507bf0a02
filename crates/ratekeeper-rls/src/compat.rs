//! Where this service differs from envoyproxy/ratelimit, and why.
//!
//! A config file, a manifest's environment or a request that works with the reference means
//! the same here, except for the rows below. Each row is checked by the test named in it
//! (in `crates/ratekeeper-rls/tests/`: `compat::*`, `config::*` and `settings::*` name the test
//! binary, then the test).
//!
//! # Config files
//!
//! | # | reference | here | why | test |
//! |---|---|---|---|---|
//! | C1 | A request entry `(a, b)` is looked up as the string `a_b`, so it also hits a config descriptor `key: a_b` without value. | Entries match structurally: `(a, b)` hits only `key: a, value: b`, a wildcard value of key `a`, or `key: a` without value. | The `_` join lets one key's value impersonate another key (a user-controlled value could select another rule). | `compat::c1_entries_match_structurally` |
//! | C2 | `key: a_b` and `key: a, value: b` at one level are a "duplicate composite key". | They are two descriptors. | Same join; rejecting a valid file for it helps nobody. | `compat::c2_no_duplicate_through_the_join` |
//! | C3 | A `*` in a descriptor's *key* is a wildcard too (the pattern is matched against `key_value`), and `share_threshold` is accepted when the key has a `*`. | A `*` is a wildcard only in `value`; in a key it is a literal character, and `share_threshold` needs a `*` in the value. | Keys are names chosen by the Envoy route config, not patterns; the reference's behaviour is a side effect of the join. | `compat::c3_star_in_a_key_is_literal` |
//! | C4 | Errors name the file only; the first of several errors found (in random map order). | Every error has `file:line:column`, and the checks run in document order, so the first error in the file is the one reported. Messages are worded here. | Pointing at the line saves the search. | `config::errors::*` (each asserts line and column) |
//! | C5 | A key repeated in one map: the last one silently wins. | An error at the second one. | Two `rate_limit:` in one descriptor is always a mistake, and the silent choice hides it. | `compat::c5_repeated_map_key_is_an_error` |
//! | C6 | A file with several YAML documents (`---`): only the first is read. | An error at the second document. | The other documents were silently dropped. | `compat::c6_second_document_is_an_error` |
//! | C7 | Every file under the directory is read, recursively, whatever its name. | Only `*.yaml` / `*.yml` files of the directory itself; other regular files give a warning. | A ConfigMap mount has `..data` directories that the recursive read loads twice (hence the reference's need for `RUNTIME_IGNOREDOTFILES`); editor backups (`x.yaml~`) must not load. | `compat::c7_only_yaml_files_of_the_directory` |
//! | C8 | Files load in the order of a Go map; with two files for one domain, either may be named in the error. | Files load in name order; the error names both files. | Deterministic reloads and errors. | `compat::c8_files_load_in_name_order` |
//! | C9 | A `float` in `metadata` that is NaN or infinite loads (it cannot be sent as JSON). | An error. | Metadata is returned as JSON (dynamic metadata, `/rlconfig`). | `compat::c9_non_finite_metadata_is_an_error` |
//! | C10 | The stats key `domain.k1_v1.k2_v2` is split on `.` into Prometheus labels, so a value with a `.` shifts the labels. | [`Match::metric_keys`](crate::config::Match::metric_keys) builds `key1`/`key2` from the match, so a value with a `.` stays in its label. | Labels must not depend on the values' characters. | `compat::c10_dots_stay_in_their_label` |
//! | C11 | The counter (Redis key) is `prefix + domain_k1_v1_k2_v2_…_window`, ambiguous for values with `_`: `(a_b, c)` and `(a, b_c)` share a counter. | [`Match::counter_key`](crate::config::Match::counter_key) is length-prefixed: they are two counters. | Two callers must never share a counter by accident. | `compat::c11_counter_keys_are_unambiguous` |
//! | C12 | `RUNTIME_WATCH_ROOT=true` (its default) reloads only when the runtime root link is swapped; `false` reloads on file events at once, so a file caught half written can fail to load (counted as `config_load_error`). | Both: the watcher polls through the links, and loads a change once two polls (250 ms apart by default) read the same files. | One behaviour for every deployment; no spurious load errors from half-written files. | `config::watch::runtime_root_link_swap_reloads`, `config::watch::file_written_in_place_reloads`, unit tests of `config::watch` |
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
//!
//! # Service (`ShouldRateLimit`, metrics, operations)
//!
//! Tests are in `tests/conformance/` (each on the memory store and on Redis) and
//! `tests/ops/`.
//!
//! | # | reference | here | why | test |
//! |---|---|---|---|---|
//! | R1 | A check (descriptor `hits_addend: 0`) of a counter exactly at its limit answers `OK` (`OVER_LIMIT` only above it), so Envoy's check-then-report flow admits `requests_per_unit + 1` requests per window. | `OVER_LIMIT` at the limit: check-then-report admits `requests_per_unit` per window. | A counter never goes above its limit here (R2), so a check that passed at the limit would pass forever; and the extra request was never meant. | `conformance::addends::check_at_exactly_the_limit_is_over_limit`, `conformance::addends::check_then_report_admits_the_limit_per_window` |
//! | R2 | A refused descriptor's hits are added to its counter anyway. | Refused hits are not counted (the fixed window of ratekeeper-core charges only what it admits): after a refused large request, a smaller one that fits passes. Each descriptor is still charged on its own, so a request refused by one descriptor charges the others (the reference's default; `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` charges all-or-nothing). | Counting refused hits keeps a client that retries locked out and drains shared limits ([envoyproxy/ratelimit#1060](https://github.com/envoyproxy/ratelimit/issues/1060)). | `conformance::addends::refused_hits_are_not_counted`, `conformance::e2e::stop_increment_when_over_limit_keeps_the_other_counters` |
//! | R3 | Refused requests and store failures are gRPC `UNKNOWN` (plain Go errors). | `INVALID_ARGUMENT` (empty domain, no descriptors), `UNAVAILABLE` (no config loaded, store failure); same messages. | Envoy treats every error alike (`failure_mode_deny`); the codes tell a client and a dashboard what happened. | `conformance::errors::empty_domain_is_an_error`, `conformance::errors::no_descriptors_is_an_error`, `conformance::errors::no_config_loaded_is_an_error_until_one_loads` |
//! | R4 | `REDIS_TIMEOUT` defaults to 10 s: with Redis down every call waits that long ([envoyproxy/ratelimit#462](https://github.com/envoyproxy/ratelimit/issues/462)). | Unset, the store's decision deadline applies (50 ms), behind a circuit breaker; a failure answers `UNAVAILABLE` within it (or refuses, for a store built to fail closed) and counts `redis_error`. | A rate limiter must not add seconds to every request when its store is down. | `conformance::errors::store_failure_answers_within_the_deadline` |
//! | R5 | Redis keys are `CACHE_KEY_PREFIX + domain_key_value_…_windowstart`, values in clear. | `rls:[CACHE_KEY_PREFIX:]v2:{<hash>}:rls_<limit>_per_<unit>s`, where the hash is SHA-256 (144 bits, base64url) of the prefix, the domain and the rule's counter key; the window lives in the value. Counters are not shared with reference instances on the same Redis. | Descriptor values can be credentials; they never reach a key name. | `conformance::errors::store_keys_never_hold_descriptor_values` |
//! | R6 | Changing a rule's `requests_per_unit` keeps its count (the key has no limit in it). | A rule whose `requests_per_unit` or `unit` changes counts from zero under the new limit. | Each (limit, unit) is one store policy; a counter is never read under a limit it was not counted for. | `ops::reload::changing_a_limit_starts_its_counter_afresh` |
//! | R7 | The stats key of a descriptor with a `RateLimitOverride` holds every entry's value. | Its `key1`/`key2` labels hold the entries' keys only. | Values reach labels only with the operator's consent (`detailed_metric`). | `ops::metrics::override_stats_labels_hold_keys_only` |
//! | R8 | `response_time` records whole milliseconds (sub-millisecond calls record 0); no cap on label series; `domain_not_found` and `global_shadow_mode` are statsd names outside the Prometheus mapping. | Seconds as measured; at most 2 000 `(domain, key1, key2)` series, later ones counted under `_overflow`; `ratelimit_service_domain_not_found{domain}` and `ratelimit_service_global_shadow_mode`. | Useful latency; bounded memory whatever values arrive. | `ops::metrics::metric_names_and_labels_are_the_references`, `ops::metrics::label_series_past_the_cap_go_to_overflow`, `stats::tests::series_past_the_cap_share_the_overflow_labels` |
//! | R9 | `/rlconfig` (debug port) prints the config as text lines. | `/rlconfig` answers the config in force as JSON (also `/metrics` and `/healthcheck` on the debug port). | Machine-readable. | `ops::health::rlconfig_dumps_the_config_in_force` |
//!
//! Not differences (same as the reference): unknown domains and unmatched descriptors answer
//! `OK` without a limit; `unlimited` answers `OK` with `limit_remaining` 4294967295 and is
//! never counted; `requests_per_unit: 0` refuses every request (without the store);
//! `replaces` drops a named rule for the request; a request's `hits_addend` 0 counts as 1, a
//! descriptor's `hits_addend` is used as given; shadow and quota modes, per rule and global;
//! response headers and dynamic metadata; `duration_until_reset` = unit − (now mod unit),
//! never 0, with epoch-aligned windows (WEEK from Thursday 00:00 UTC, MONTH 30 days, YEAR
//! 365 days); `is_negative_hits` is ignored.
//!
//! # Extensions
//!
//! Keys the reference's files do not use; without them a file means what it means to the
//! reference. Tests are in `tests/extensions/` (`extensions::*`; each service test runs on
//! the memory store and on Redis).
//!
//! | # | key or setting | what it does | why | test |
//! |---|---|---|---|---|
//! | E1 | `rate_limit.algorithm: fixed_window \| gcra \| sliding_window \| sliding_log \| leaky_bucket` (any case, `_` or `-`; default `fixed_window`) | The rule counts with ratekeeper-core's algorithm of that name, per counter. | The fixed window admits up to twice its limit around a window boundary (10 per minute: 10 hits at :59.5 and 10 at :00.5 all pass); GCRA, the leaky bucket and the sliding windows do not. | `extensions::algorithms::fixed_window_admits_twice_the_limit_across_a_boundary`, `extensions::algorithms::other_algorithms_admit_the_limit_across_a_boundary`, `extensions::config::every_algorithm_name_loads_in_any_case_with_underscores_or_dashes` |
//! | E2 | `rate_limit.period: 10s` (`<n>s`, `<n>m`, `<n>h`, `<n>d` or an integer of seconds; 1 s to 365 days) | `requests_per_unit` per period; a fixed window's periods are aligned on the Unix epoch. With `period`, `unit` may be left out; both given must be the same length (else an error at the period). `current_limit` reports `requests_per_unit` per the shortest unit at least as long as the period ([`Unit::covering`](crate::config::Unit::covering)): 100 per 10 s is reported as 100 per MINUTE, which never claims more than the rule admits (over any minute it admits at least 100). `duration_until_reset` is within [1, period] s. | Envoy's units are the only periods the reference has. | `extensions::algorithms::a_ten_second_period_resets_within_ten_seconds`, `extensions::config::*` |
//! | E3 | (always) | `duration_until_reset` and the reset header come from the store's decision (its `reset_after`, rounded up to whole seconds, within [1, period]), so on Redis they follow Redis `TIME`, the clock the windows are counted on; the reference computes them again from the pod's clock. For the fixed window this is the reference's `unit − (now mod unit)`. | Replicas with skewed clocks report one reset. | `extensions::algorithms::a_ten_second_period_resets_within_ten_seconds`, `conformance::*` (the reference's values) |
//! | E4 | `LIMIT_RESPONSE_HEADERS_FORMAT=reference \| ietf \| both` (`--response-headers-format`; default `reference`), with `LIMIT_RESPONSE_HEADERS_ENABLED=true` | `ietf` sends `RateLimit-Policy: "<name>";q=<requests_per_unit>;w=<period s>` and `RateLimit: "<name>";r=<remaining>;t=<reset s>` (draft-ietf-httpapi-ratelimit-headers-11; the policy name is the rule's `name`, else `default`; no `pk`) for the descriptor the reference's headers describe; `both` sends them after the reference's three. | The reference's headers follow draft -03, which carries no window, so a client cannot tell 10 per second from 10 per hour. | `extensions::headers::both_formats_and_the_problem_body`, `extensions::headers::ietf_format_alone`, `extensions::headers::the_default_is_the_references`, `extensions::config::header_format_and_problem_details_settings` |
//! | E5 | `OVER_LIMIT_PROBLEM_DETAILS=true` (`--problem-details`) | On `OVER_LIMIT` (after the global shadow mode), `raw_body` is an RFC 9457 problem (`type` `https://iana.org/assignments/http-problem-types#quota-exceeded`, `title`, `status` 429, `detail`, `violated-policies`) and `Content-Type: application/problem+json` is added to `response_headers_to_add`, for Envoy's 429. | Envoy's default 429 body is empty. | `extensions::headers::both_formats_and_the_problem_body` |
