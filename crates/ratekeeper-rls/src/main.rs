//! `ratekeeper-rls`: reads the settings (flags and environment), then either checks the
//! config files and exits (`--validate`: 0 valid, 1 errors printed as `file:line:col: ...`)
//! or serves: gRPC `ShouldRateLimit` and health, `/healthcheck` and `/json`, `/rlconfig` and
//! the metrics, until SIGTERM or Ctrl-C (health turns `NOT_SERVING`, calls in flight finish,
//! exit 0).

use std::process::ExitCode;

use ratekeeper_rls::Server;
use ratekeeper_rls::config::RateLimitConfig;
use ratekeeper_rls::settings::{LogFormat, LogLevel, Settings, SettingsError};

fn main() -> ExitCode {
    let (settings, warnings) =
        match Settings::parse(std::env::args_os(), |name| std::env::var(name).ok()) {
            Ok(parsed) => parsed,
            Err(SettingsError::Help(text)) => {
                print!("{text}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("ratekeeper-rls: {e}");
                return ExitCode::from(2);
            }
        };
    for w in &warnings {
        eprintln!("ratekeeper-rls: warning: {w}");
    }
    if settings.validate {
        return validate(&settings);
    }
    init_logs(settings.log_level, settings.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ratekeeper-rls: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(settings))
}

fn validate(settings: &Settings) -> ExitCode {
    match RateLimitConfig::check_path(settings.config_path(), &settings.load) {
        Ok(config) => {
            for w in config.warnings() {
                eprintln!("warning: {w}");
            }
            let domains: Vec<&str> = config.domains().collect();
            println!(
                "{}: valid ({} domain{}: {})",
                settings.config_path().display(),
                domains.len(),
                if domains.len() == 1 { "" } else { "s" },
                domains.join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Logs on stderr at `LOG_LEVEL`, as text or one JSON object per line (`LOG_FORMAT`).
/// Descriptor values are never logged.
fn init_logs(level: LogLevel, format: LogFormat) {
    let filter = match level {
        LogLevel::Error => tracing::Level::ERROR,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Trace => tracing::Level::TRACE,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn serve(settings: Settings) -> ExitCode {
    let server = match Server::bind(settings).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("ratekeeper-rls: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::warn!(
        grpc = %server.local_grpc_addr(),
        http = %server.local_http_addr(),
        debug = %server.local_debug_addr(),
        "ratekeeper-rls serving"
    );
    stop_signal().await;
    tracing::warn!("stopping: health is NOT_SERVING, draining calls in flight");
    server.shutdown().await;
    ExitCode::SUCCESS
}

/// SIGTERM or Ctrl-C (SIGINT).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
