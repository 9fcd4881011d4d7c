//! External backends on the command line: `--backend external:NAME` runs the adapter NAME,
//! declared in `attn-diff.toml` (`[backends.NAME]`) or with `--external NAME='command …'`.
//!
//! ```toml
//! [backends.numpy-ref]
//! command = ["python3", "adapters/python/numpy_reference.py"]   # no shell
//! env = { OMP_NUM_THREADS = "1" }                               # optional
//! timeout_seconds = 60                                          # per case (default 60)
//! startup_timeout_seconds = 120                                 # handshake (default 120)
//! cwd = "."                 # optional; relative to the file; default the file's directory
//! ```

use attn_backends::external::{AdapterSpec, ExternalBackend};
use attn_backends::Backend;
use attn_results::BackendRef;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// The link `cargo xtask setup` makes, beside `attn-diff.toml`, to the Python environment that
/// holds the adapters' packages (numpy, safetensors).
pub const PYTHON_ENV: &str = ".python-env";

/// The interpreter of the set-up Python environment next to `dir`, if there is one.
pub fn provisioned_python(dir: &Path) -> Option<PathBuf> {
    let python = dir.join(PYTHON_ENV).join("bin").join("python3");
    python.is_file().then_some(python)
}

/// The interpreter to run an adapter of this checkout with: the provisioned environment's, or
/// `python3` from PATH when set-up has not made one.
pub fn adapter_python(dir: &Path) -> String {
    provisioned_python(dir).map_or_else(|| "python3".into(), |p| p.display().to_string())
}

/// A bare `python3` (or `python`), in a config file or in `--external`, means "the Python the
/// adapters were set up for": the provisioned environment in `dir` when there is one, else
/// whatever PATH finds. `dir` is the config file's directory for its entries; for
/// `--external`, the directory of `--config FILE` when given, else the current directory
/// (where `./attn-diff.toml` is read from). Any other program (a path, `python3.12`, a
/// wrapper) is the user's choice and kept as written.
fn resolve_interpreter(mut command: Vec<String>, dir: &Path) -> Vec<String> {
    if matches!(
        command.first().map(String::as_str),
        Some("python3" | "python")
    ) {
        if let Some(python) = provisioned_python(dir) {
            command[0] = python.display().to_string();
        }
    }
    command
}

/// The file read when `--config` is not given (if it exists).
pub const DEFAULT_CONFIG: &str = "attn-diff.toml";

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ExternalArgs {
    /// Declare an adapter for `--backend external:NAME`: NAME='program arg …' (split like a
    /// shell would, but run without one). Repeatable.
    #[arg(long = "external", value_name = "NAME=COMMAND")]
    pub external: Vec<String>,
    /// Seconds an adapter given with --external gets per case before it is killed.
    #[arg(long, value_name = "SECONDS")]
    pub external_timeout: Option<f64>,
    /// File declaring adapters as [backends.NAME] (default: ./attn-diff.toml, if present).
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Adapter processes per adapter (a check's `--jobs`; 0 is 1).
    #[arg(skip)]
    pub processes: usize,
}

#[derive(Debug, Error, PartialEq)]
pub enum ExternalConfigError {
    #[error("{what}: `max_processes` of `{name}` is 0 (at least 1 process runs the adapter)")]
    ZeroProcesses { what: String, name: String },
    #[error("--external `{0}` must look like NAME='command …'")]
    BadFlag(String),
    #[error("--external {name}: cannot split the command `{command}` (unbalanced quotes?)")]
    BadCommand { name: String, command: String },
    #[error("{what}: the command of `{name}` is empty")]
    EmptyCommand { what: String, name: String },
    #[error("{what}: {field} of `{name}` must be a positive number of seconds, not {value}")]
    BadSeconds {
        what: String,
        name: String,
        field: &'static str,
        value: f64,
    },
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("no adapter `{name}` is declared (declared: {declared}){suggestion}; add [backends.{name}] to {file} or pass --external {name}='command …'")]
    Unknown {
        name: String,
        declared: String,
        /// `; did you mean `X`?`, or empty.
        suggestion: String,
        file: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAdapter {
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    timeout_seconds: Option<f64>,
    startup_timeout_seconds: Option<f64>,
    cwd: Option<PathBuf>,
    /// Most processes of this adapter a run starts at once (each holds its own model of
    /// the kernel's memory); `--jobs` starts fewer when it asks for fewer.
    max_processes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    backends: BTreeMap<String, FileAdapter>,
}

fn seconds(
    what: &str,
    name: &str,
    field: &'static str,
    value: Option<f64>,
    default: Duration,
) -> Result<Duration, ExternalConfigError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(Duration::from_secs_f64(v)),
        Some(v) => Err(ExternalConfigError::BadSeconds {
            what: what.into(),
            name: name.into(),
            field,
            value: v,
        }),
    }
}

/// Parse the text of an `attn-diff.toml` whose directory is `dir`.
pub fn parse_config(
    text: &str,
    path: &Path,
    dir: &Path,
) -> Result<Vec<AdapterSpec>, ExternalConfigError> {
    let what = path.display().to_string();
    let file: ConfigFile = toml::from_str(text).map_err(|e| ExternalConfigError::Parse {
        path: what.clone(),
        message: e.to_string(),
    })?;
    file.backends
        .into_iter()
        .map(|(name, a)| {
            if a.command.is_empty() {
                return Err(ExternalConfigError::EmptyCommand {
                    what: what.clone(),
                    name,
                });
            }
            let mut spec = AdapterSpec::new(name.clone(), resolve_interpreter(a.command, dir));
            spec.env = a.env;
            spec.cwd = Some(match a.cwd {
                Some(c) if c.is_absolute() => c,
                Some(c) => dir.join(c),
                None => dir.to_path_buf(),
            });
            spec.timeout = seconds(
                &what,
                &name,
                "timeout_seconds",
                a.timeout_seconds,
                spec.timeout,
            )?;
            spec.startup_timeout = seconds(
                &what,
                &name,
                "startup_timeout_seconds",
                a.startup_timeout_seconds,
                spec.startup_timeout,
            )?;
            if let Some(m) = a.max_processes {
                if m == 0 {
                    return Err(ExternalConfigError::ZeroProcesses {
                        what: what.clone(),
                        name,
                    });
                }
                spec.max_processes = Some(m);
            }
            Ok(spec)
        })
        .collect()
}

/// Parse one `--external NAME='command …'`.
pub fn parse_flag(flag: &str, timeout: Option<f64>) -> Result<AdapterSpec, ExternalConfigError> {
    let (name, command) = flag
        .split_once('=')
        .filter(|(n, _)| !n.trim().is_empty())
        .ok_or_else(|| ExternalConfigError::BadFlag(flag.to_string()))?;
    let name = &adapter_of(name);
    let words = shlex::split(command).ok_or_else(|| ExternalConfigError::BadCommand {
        name: name.into(),
        command: command.into(),
    })?;
    if words.is_empty() {
        return Err(ExternalConfigError::EmptyCommand {
            what: "--external".into(),
            name: name.into(),
        });
    }
    let mut spec = AdapterSpec::new(name, words);
    spec.timeout = seconds(
        "--external",
        name,
        "--external-timeout",
        timeout,
        spec.timeout,
    )?;
    Ok(spec)
}

impl ExternalArgs {
    /// Every declared adapter: `--external` ones first, then the config file's. A bare
    /// `python3` resolves the same way in both ([`resolve_interpreter`]).
    pub fn declared(&self) -> Result<Vec<AdapterSpec>, ExternalConfigError> {
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        let flag_dir = match &self.config {
            Some(file) => std::fs::canonicalize(file)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or_else(|| PathBuf::from(".")),
            None => PathBuf::from("."),
        };
        let mut specs = self
            .external
            .iter()
            .map(|f| {
                parse_flag(f, self.external_timeout).map(|mut spec| {
                    spec.command = resolve_interpreter(spec.command, &flag_dir);
                    spec
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.config.is_some() || path.exists() {
            let text = std::fs::read_to_string(&path).map_err(|e| ExternalConfigError::Read {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            let dir = std::fs::canonicalize(&path)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or_else(|| PathBuf::from("."));
            specs.extend(parse_config(&text, &path, &dir)?);
        }
        Ok(specs)
    }

    /// The adapter `name`, as declared.
    pub fn spec(&self, name: &str) -> Result<AdapterSpec, ExternalConfigError> {
        let declared = self.declared()?;
        let names: Vec<String> = declared.iter().map(|s| s.name.clone()).collect();
        declared
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ExternalConfigError::Unknown {
                name: name.into(),
                suggestion: crate::suggest::did_you_mean(name, &names),
                declared: if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
                file: self
                    .config
                    .as_ref()
                    .map_or(DEFAULT_CONFIG.into(), |p| p.display().to_string()),
            })
    }
}

/// The flag among `--external` `flags` that declares `backend` (`external:NAME`), as given:
/// what a replay command needs to start the same adapter.
pub fn flag_for(backend: &str, flags: &[String]) -> Option<String> {
    let backend = BackendRef::parse(backend);
    let name = backend.adapter()?;
    flags
        .iter()
        .find(|f| {
            f.split_once('=')
                .is_some_and(|(n, _)| adapter_of(n) == name)
        })
        .cloned()
}

/// The adapter `name` names, with or without `external:` (a name with another prefix stays
/// whole).
pub fn adapter_of(name: &str) -> String {
    let r = BackendRef::parse(name);
    r.adapter().map_or_else(|| r.to_string(), String::from)
}

/// Start the adapter `name` (handshake included) as a backend.
pub fn start_backend(name: &str, args: &ExternalArgs) -> anyhow::Result<Arc<dyn Backend>> {
    let declared = args.spec(name)?;
    // As many as the run's jobs, within the adapter's own `max_processes`.
    let spec = AdapterSpec {
        processes: args
            .processes
            .max(1)
            .min(declared.max_processes.unwrap_or(usize::MAX)),
        ..declared
    };
    crate::progress::note(&format!(
        "starting adapter {name} and waiting for its handshake (up to {:.0} s)",
        spec.startup_timeout.as_secs_f64()
    ));
    let backend = ExternalBackend::start(spec)?;
    if let Some(from) = &backend.hello().inherited_capabilities {
        // Said at once: every failure in a feature it inherited would otherwise look like a bug.
        eprintln!(
            "warning: adapter {name}: its class declares no capabilities of its own and \
             inherits those of {from}, so it is sent every feature {from} runs; declare \
             `capabilities` on the class if its forward implements fewer"
        );
    }
    Ok(Arc::new(backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_file_declares_adapters() {
        let text = r#"
            [backends.a]
            command = ["python3", "a.py"]
            env = { X = "1" }
            timeout_seconds = 2.5
            [backends.b]
            command = ["b"]
            cwd = "sub"
        "#;
        let specs = parse_config(text, Path::new("t.toml"), Path::new("/d")).unwrap();
        assert_eq!(specs[0].name, "a");
        assert_eq!(specs[0].command, vec!["python3", "a.py"]);
        assert_eq!(specs[0].env.get("X").map(String::as_str), Some("1"));
        assert_eq!(specs[0].timeout, Duration::from_millis(2500));
        assert_eq!(specs[0].cwd.as_deref(), Some(Path::new("/d")));
        assert_eq!(specs[1].cwd.as_deref(), Some(Path::new("/d/sub")));
    }

    #[test]
    fn config_mistakes_are_named() {
        let e = parse_config("[backends.a]\ncommand = []", Path::new("t"), Path::new("."));
        assert!(matches!(e, Err(ExternalConfigError::EmptyCommand { .. })));
        let e = parse_config(
            "[backends.a]\ncommand = [\"x\"]\ntimeout = 3",
            Path::new("t"),
            Path::new("."),
        );
        assert!(e.unwrap_err().to_string().contains("timeout"));
        let e = parse_config(
            "[backends.a]\ncommand = [\"x\"]\ntimeout_seconds = -1",
            Path::new("t"),
            Path::new("."),
        );
        assert!(matches!(e, Err(ExternalConfigError::BadSeconds { .. })));
        let e = parse_config(
            "[backends.a]\ncommand = [\"x\"]\nmax_processes = 0",
            Path::new("t"),
            Path::new("."),
        );
        assert!(matches!(e, Err(ExternalConfigError::ZeroProcesses { .. })));
        let ok = parse_config(
            "[backends.a]\ncommand = [\"x\"]\nmax_processes = 3",
            Path::new("t"),
            Path::new("."),
        );
        assert_eq!(ok.unwrap()[0].max_processes, Some(3));
    }

    #[test]
    fn a_bare_python_in_the_config_is_the_provisioned_environment() {
        let dir = std::env::temp_dir().join(format!("attn-diff-pyenv-{}", std::process::id()));
        let bin = dir.join(PYTHON_ENV).join("bin");
        let text = "[backends.a]\ncommand = [\"python3\", \"a.py\"]\n\
                    [backends.b]\ncommand = [\"/usr/bin/python3\", \"b.py\"]\n\
                    [backends.c]\ncommand = [\"python\", \"c.py\"]";
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Without the environment, PATH decides.
        let specs = parse_config(text, Path::new("t"), &dir).unwrap();
        assert_eq!(specs[0].command[0], "python3");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("python3"), "").unwrap();
        let specs = parse_config(text, Path::new("t"), &dir).unwrap();
        let provisioned = bin.join("python3").display().to_string();
        assert_eq!(specs[0].command, vec![provisioned.clone(), "a.py".into()]);
        assert_eq!(
            specs[1].command[0], "/usr/bin/python3",
            "a named interpreter is kept"
        );
        assert_eq!(specs[2].command[0], provisioned);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--external x='python3 a.py'` runs the same interpreter as `command = ["python3",
    /// "a.py"]` in the config file beside it: the provisioned environment when there is one.
    #[test]
    fn a_bare_python_in_a_flag_resolves_as_in_the_config() {
        let dir = std::env::temp_dir().join(format!("attn-diff-flagenv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bin = dir.join(PYTHON_ENV).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("python3"), "").unwrap();
        let config = dir.join("attn-diff.toml");
        std::fs::write(&config, "[backends.t]\ncommand = [\"python3\", \"t.py\"]\n").unwrap();
        let args = ExternalArgs {
            external: vec!["f=python3 f.py".into(), "g=/usr/bin/python3 g.py".into()],
            external_timeout: None,
            config: Some(config),
            processes: 1,
        };
        let provisioned = std::fs::canonicalize(bin.join("python3"))
            .unwrap()
            .display()
            .to_string();
        let declared = args.declared().unwrap();
        let command = |n: &str| {
            declared
                .iter()
                .find(|s| s.name == n)
                .unwrap()
                .command
                .clone()
        };
        assert_eq!(command("f"), vec![provisioned.clone(), "f.py".into()]);
        assert_eq!(
            command("t")[0],
            command("f")[0],
            "the flag and the file agree"
        );
        assert_eq!(
            command("g")[0],
            "/usr/bin/python3",
            "a named interpreter is kept"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_split_like_a_shell() {
        let s = parse_flag("x=python3 'my adapter.py' --fast", Some(3.0)).unwrap();
        assert_eq!(s.name, "x");
        assert_eq!(s.command, vec!["python3", "my adapter.py", "--fast"]);
        assert_eq!(s.timeout, Duration::from_secs(3));
        assert!(parse_flag("nocommand", None).is_err());
        assert!(parse_flag("x=", None).is_err());
        assert!(parse_flag("x='open", None).is_err());
    }
}
