//! The deployment files (`deploy/`) as the service reads them: the Kubernetes manifests'
//! container environment through the binary's own settings parser, and the Dockerfile's
//! final stage. Images are not built here; these checks catch a manifest or Dockerfile that
//! no longer matches the binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ratekeeper_rls::settings::{Settings, StoreKind};
use saphyr::{LoadableYamlNode, Yaml};

fn crate_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    let path = crate_file(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of a manifest file, each with its `kind`.
fn manifests(text: &str) -> Vec<Yaml<'_>> {
    Yaml::load_from_str(text).unwrap_or_else(|e| panic!("the manifests do not parse: {e}"))
}

fn find<'a, 'i>(docs: &'a [Yaml<'i>], kind: &str, name: &str) -> &'a Yaml<'i> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifests"))
}

fn seq<'a, 'i>(node: &'a Yaml<'i>) -> &'a [Yaml<'i>] {
    node.as_vec().map_or(&[], Vec::as_slice)
}

fn text<'a>(node: &'a Yaml<'_>) -> &'a str {
    node.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {node:?}"))
}

fn port(node: &Yaml<'_>) -> u16 {
    let n = node
        .as_integer()
        .unwrap_or_else(|| panic!("expected a port number, found {node:?}"));
    u16::try_from(n).expect("a port number")
}

/// The Deployment's container, started as the image starts it (`/ratekeeper-rls` and the
/// container's `args`; a `command` replaces the image's entrypoint), with exactly the
/// container's environment, gives the settings the Service and the mounts expect: the config
/// directory where the ConfigMap is mounted, gRPC 8081 / HTTP 8080 / debug 6070 / Prometheus
/// 9090 on every address (`HOST`/`GRPC_HOST` `::`), the Redis store at `redis:6379` (the
/// Service of `redis.yaml`), and no error for Istio's `USE_STATSD=false`.
#[test]
fn the_kubernetes_deployment_parses_to_the_settings_its_service_and_mounts_expect() {
    let text_rl = read("deploy/kubernetes/ratelimit.yaml");
    let docs = manifests(&text_rl);
    let deployment = find(&docs, "Deployment", "ratelimit");
    let pod = &deployment["spec"]["template"];
    let containers = seq(&pod["spec"]["containers"]);
    assert_eq!(containers.len(), 1, "one container");
    let container = &containers[0];

    let mut argv: Vec<String> = match container.as_mapping_get("command") {
        Some(command) => seq(command).iter().map(|a| text(a).to_owned()).collect(),
        None => vec!["/ratekeeper-rls".to_owned()],
    };
    if let Some(args) = container.as_mapping_get("args") {
        argv.extend(seq(args).iter().map(|a| text(a).to_owned()));
    }
    let env: BTreeMap<String, String> = seq(&container["env"])
        .iter()
        .map(|e| (text(&e["name"]).to_owned(), text(&e["value"]).to_owned()))
        .collect();
    // Istio's sample's names, with its values.
    for (name, value) in [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6379"),
        ("HOST", "::"),
        ("GRPC_HOST", "::"),
    ] {
        assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}");
    }
    assert!(env.contains_key("LOG_LEVEL"));

    let (settings, warnings) = Settings::parse(&argv, |name| env.get(name).cloned())
        .unwrap_or_else(|e| panic!("the container's {argv:?} and {env:?} do not parse: {e}"));

    // The config directory is the ConfigMap's mount.
    let mounts = seq(&container["volumeMounts"]);
    let mount = mounts
        .iter()
        .find(|m| Path::new(text(&m["mountPath"])) == settings.config_path())
        .unwrap_or_else(|| {
            panic!(
                "no volume is mounted at the config directory {}",
                settings.config_path().display()
            )
        });
    assert_eq!(settings.config_path(), Path::new("/data/ratelimit/config"));
    let volume = seq(&pod["spec"]["volumes"])
        .iter()
        .find(|v| v["name"].as_str() == Some(text(&mount["name"])))
        .expect("the mounted volume");
    let config_map = find(&docs, "ConfigMap", text(&volume["configMap"]["name"]));
    // The ConfigMap holds the crate's example configuration, byte for byte.
    assert_eq!(
        config_map["data"]["api.yaml"].as_str(),
        Some(read("examples/ratelimit/config/api.yaml").as_str()),
        "the ConfigMap's api.yaml and examples/ratelimit/config/api.yaml differ"
    );

    // Listeners: every address, the reference's ports.
    let any: std::net::IpAddr = "::".parse().expect("::");
    assert_eq!(settings.grpc_addr, SocketAddr::new(any, 8081));
    assert_eq!(settings.http_addr, SocketAddr::new(any, 8080));
    assert_eq!(settings.debug_addr.port(), 6070);
    let metrics = settings.metrics.as_ref().expect("USE_PROMETHEUS=true");
    assert_eq!(metrics.addr.port(), 9090);
    assert_eq!(metrics.path, "/metrics");

    // The Service exposes exactly the ports the settings listen on, and the container
    // declares them.
    let service = find(&docs, "Service", "ratelimit");
    let mut service_ports: Vec<(u16, u16)> = seq(&service["spec"]["ports"])
        .iter()
        .map(|p| (port(&p["port"]), port(&p["targetPort"])))
        .collect();
    service_ports.sort_unstable();
    assert_eq!(
        service_ports,
        [(6070, 6070), (8080, 8080), (8081, 8081), (9090, 9090)]
    );
    let mut container_ports: Vec<u16> = seq(&container["ports"])
        .iter()
        .map(|p| port(&p["containerPort"]))
        .collect();
    container_ports.sort_unstable();
    let mut listening = vec![
        settings.debug_addr.port(),
        settings.http_addr.port(),
        settings.grpc_addr.port(),
        metrics.addr.port(),
    ];
    listening.sort_unstable();
    assert_eq!(container_ports, listening);
    assert_eq!(
        service["spec"]["selector"]["app"].as_str(),
        pod["metadata"]["labels"]["app"].as_str()
    );
    // The probes ask the HTTP listener's /healthcheck.
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some("/healthcheck"), "{probe}");
        assert_eq!(port(&get["port"]), settings.http_addr.port(), "{probe}");
    }

    // Redis at the Service redis.yaml defines.
    assert_eq!(settings.store, StoreKind::Redis);
    let redis = settings.redis.as_ref().expect("Redis settings");
    assert_eq!(redis.urls, ["redis://redis:6379"]);
    let text_redis = read("deploy/kubernetes/redis.yaml");
    let redis_docs = manifests(&text_redis);
    let redis_service = find(&redis_docs, "Service", "redis");
    assert_eq!(port(&redis_service["spec"]["ports"][0]["port"]), 6379);

    // USE_STATSD=false asks for nothing the service lacks.
    assert!(warnings.is_empty(), "{warnings:?}");

    // Not root, as the image's user.
    let security = &pod["spec"]["securityContext"];
    assert_eq!(security["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(security["runAsUser"].as_integer(), Some(65_532));
}

/// The image's final stage ships the binary cargo builds as `/ratekeeper-rls` (the
/// `ENTRYPOINT`) and `/bin/ratelimit` (the reference's path, which Istio's and Envoy
/// Gateway's manifests run), on a distroless base, as a non-root user.
#[test]
fn the_dockerfile_ships_the_binary_as_a_non_root_entrypoint_and_as_bin_ratelimit() {
    let dockerfile = read("deploy/Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let stages: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("FROM "))
        .collect();
    assert_eq!(stages.len(), 2, "a build stage and a final stage");
    let build = &lines[stages[0]..stages[1]];
    let last = &lines[stages[1]..];

    // The build stage builds this crate's binary (the name cargo gives the tests).
    let bin = Path::new(env!("CARGO_BIN_EXE_ratekeeper-rls"))
        .file_name()
        .and_then(|n| n.to_str())
        .expect("the binary's name");
    assert_eq!(bin, "ratekeeper-rls");
    assert!(
        lines[stages[0]].ends_with(" AS build"),
        "{}",
        lines[stages[0]]
    );
    assert!(
        build
            .iter()
            .any(|l| l
                .contains("cargo build --release --locked -p ratekeeper-rls --bin ratekeeper-rls")),
        "the build stage builds the ratekeeper-rls binary: {build:?}"
    );
    assert!(
        build
            .iter()
            .any(|l| l.contains("cp target/release/ratekeeper-rls /ratekeeper-rls")),
        "{build:?}"
    );

    // The final stage: distroless, the binary twice, a non-root user, the entrypoint.
    assert!(
        last[0].starts_with("FROM gcr.io/distroless/") && last[0].ends_with(":nonroot"),
        "{}",
        last[0]
    );
    for target in ["/ratekeeper-rls", "/bin/ratelimit"] {
        let copy = format!("COPY --from=build /ratekeeper-rls {target}");
        assert!(last.contains(&copy.as_str()), "no `{copy}` in {last:?}");
    }
    let users: Vec<&str> = last
        .iter()
        .filter_map(|l| l.strip_prefix("USER "))
        .collect();
    assert_eq!(users.len(), 1, "{last:?}");
    let uid = users[0].split(':').next().expect("a user");
    assert!(
        !matches!(uid, "" | "0" | "root"),
        "the image runs as root: USER {}",
        users[0]
    );
    let entrypoints: Vec<&str> = last
        .iter()
        .filter_map(|l| l.strip_prefix("ENTRYPOINT "))
        .collect();
    assert_eq!(entrypoints, [r#"["/ratekeeper-rls"]"#]);
    let exposed: Vec<&str> = last
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .collect();
    assert_eq!(exposed, ["8080", "8081", "6070", "9090"]);
}
