//! `ratekeeper-rls`: reads the settings (flags and environment) and, with `--validate`,
//! checks the config files and exits 0 (valid) or 1 (errors printed as `file:line:col: ...`).

use std::process::ExitCode;

use ratekeeper_rls::config::RateLimitConfig;
use ratekeeper_rls::settings::{Settings, SettingsError};

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
            if settings.validate {
                ExitCode::SUCCESS
            } else {
                eprintln!("ratekeeper-rls: serving is not built yet; use --validate");
                ExitCode::from(2)
            }
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            ExitCode::FAILURE
        }
    }
}
