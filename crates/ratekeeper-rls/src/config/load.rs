//! Reading files from disk and combining parsed files into one config.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrorKind};
use super::parse::{self, FileCtx};
use super::yaml;
use super::{Charging, ConfigWarning, Domain, Inner, Level, LoadOptions, RateLimitConfig};

/// Whether a directory entry's name is a config file: `*.yaml` or `*.yml` (any case).
pub(crate) fn is_config_file_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml")
}

fn io_error(path: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::new(
        &path.display().to_string(),
        None,
        ConfigErrorKind::Io {
            message: e.to_string(),
        },
    )
}

/// Config files as `(path, text)`, and warnings about the directory.
pub(crate) type Files = (Vec<(String, String)>, Vec<ConfigWarning>);

/// The config files under `path` as `(path, text)`, in file-name order, and warnings for the
/// regular files of a directory that are not read.
pub(crate) fn read_path(path: &Path, opts: &LoadOptions) -> Result<Files, ConfigError> {
    let meta = fs::metadata(path).map_err(|e| io_error(path, &e))?;
    let mut warnings = Vec::new();
    if !meta.is_dir() {
        let text = fs::read_to_string(path).map_err(|e| io_error(path, &e))?;
        return Ok((vec![(path.display().to_string(), text)], warnings));
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| io_error(path, &e))? {
        let entry = entry.map_err(|e| io_error(path, &e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if opts.ignore_dotfiles && name.starts_with('.') {
            continue;
        }
        // Follows symbolic links: a ConfigMap's files are links into `..data/`. A dangling
        // link (mid-swap) reads as "not a file" and is picked up by the next reload.
        let is_file = fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if !is_file {
            continue;
        }
        if is_config_file_name(&name) {
            names.push(name);
        } else if !name.starts_with('.') {
            warnings.push(ConfigWarning {
                file: entry.path().display().to_string(),
                position: None,
                message: "not read: config files end in .yaml or .yml".to_owned(),
            });
        }
    }
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let file = path.join(&name);
        let text = fs::read_to_string(&file).map_err(|e| io_error(&file, &e))?;
        files.push((file.display().to_string(), text));
    }
    Ok((files, warnings))
}

/// Parses and combines files; every file's first error, in order, or the config.
pub(crate) fn build<'a, I>(
    files: I,
    opts: &LoadOptions,
    mut warnings: Vec<ConfigWarning>,
) -> Result<RateLimitConfig, Vec<ConfigError>>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
    let mut errors = Vec::new();
    for (file, text) in files {
        let mut ctx = FileCtx {
            file,
            warnings: &mut warnings,
        };
        if let Err(e) = add_file(&mut ctx, text, opts, &mut domains) {
            errors.push(e);
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(RateLimitConfig {
        inner: Arc::new(Inner { domains, warnings }),
    })
}

fn add_file(
    ctx: &mut FileCtx<'_>,
    text: &str,
    opts: &LoadOptions,
    domains: &mut BTreeMap<String, Domain>,
) -> Result<(), ConfigError> {
    let root =
        yaml::parse(text).map_err(|(kind, pos)| ConfigError::new(ctx.file, Some(pos), kind))?;
    let (domain, domain_pos, list, charging) = parse::root(ctx, &root)?;
    let prefix = format!("{domain}.");
    match domains.get_mut(&domain) {
        Some(existing) if !opts.merge_domains => Err(ConfigError::new(
            ctx.file,
            Some(domain_pos),
            ConfigErrorKind::DuplicateDomain {
                domain,
                first_file: existing.file.clone(),
            },
        )),
        Some(existing) => {
            // A duplicate fails the whole load (as in the reference), so a half-merged level
            // is never used.
            if charging == Charging::AllOrNothing {
                existing.charging = charging;
            }
            parse::descriptors(ctx, list, &prefix, &mut existing.level)
        }
        None => {
            let mut level = Level::default();
            parse::descriptors(ctx, list, &prefix, &mut level)?;
            domains.insert(
                domain,
                Domain {
                    file: ctx.file.to_owned(),
                    level,
                    charging,
                },
            );
            Ok(())
        }
    }
}
