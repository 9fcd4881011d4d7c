//! `attn-diff new-adapter DIR`: a runnable adapter skeleton (numpy paged attention on the
//! Python helper) and a README saying how to run it.

use super::setup::usage;
use crate::cli::NewAdapterArgs;
use std::path::{Path, PathBuf};

const ADAPTER: &str = include_str!("../../templates/adapter.py");
const README: &str = include_str!("../../templates/README.md");

/// The Python package of the checkout this binary was built from.
fn checkout_package() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/python");
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// A name as an adapter name: letters, digits, `-` and `_`.
fn adapter_name(args: &NewAdapterArgs, dir: &Path) -> anyhow::Result<String> {
    let name = match &args.name {
        Some(n) => n.clone(),
        None => dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("my-adapter")
            .to_string(),
    };
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(name)
    } else {
        Err(usage(format!(
            "`{name}` cannot name an adapter (letters, digits, `-` and `_`): pass --name NAME"
        )))
    }
}

/// The value of `--external` that runs `script` with `python3`, quoted for a shell:
/// `NAME='python3 DIR/adapter.py'`.
fn external_flag(name: &str, script: &str) -> String {
    match shlex::try_quote(script) {
        Ok(q) if q == script => format!("{name}='python3 {script}'"),
        _ => {
            let value = format!(
                "{name}=python3 {}",
                shlex::try_quote(script).map_or_else(|_| script.to_string(), |q| q.into_owned())
            );
            shlex::try_quote(&value).map_or(value.clone(), |q| q.into_owned())
        }
    }
}

/// `my-adapter` as a Python class name: `MyAdapter`.
fn class_name(name: &str) -> String {
    let camel: String = name
        .split(['-', '_'])
        .map(|w| {
            let mut c = w.chars();
            c.next().map_or(String::new(), |f| {
                f.to_ascii_uppercase().to_string() + c.as_str()
            })
        })
        .collect();
    if camel.starts_with(|c: char| c.is_ascii_alphabetic()) {
        camel
    } else {
        format!("Adapter{camel}")
    }
}

pub fn run(args: NewAdapterArgs) -> anyhow::Result<bool> {
    let dir = &args.dir;
    let shown = dir.display();
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(usage(format!(
                    "{shown} is not empty: new-adapter writes only into a new or empty directory"
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| usage(format!("cannot make {shown}: {e}")))?
        }
        Err(e) => return Err(usage(format!("cannot read {shown}: {e}"))),
    }
    let absolute = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
    let name = adapter_name(&args, &absolute)?;
    let script = dir.join("adapter.py");
    let script_shown = script.display().to_string();
    let package = checkout_package().display().to_string();
    let flag = external_flag(&name, &script_shown);
    let fill = |template: &str| {
        template
            .replace(
                "__CHECKOUT__",
                &serde_json::to_string(&package).expect("a string"),
            )
            .replace("__PACKAGE__", &package)
            .replace("__EXTERNAL_FLAG__", &flag)
            .replace(
                "__SCRIPT_TOML__",
                &serde_json::to_string(&script_shown).expect("a string"),
            )
            .replace("__CLASS__", &class_name(&name))
            .replace("__NAME__", &name)
    };
    for (file, text) in [("adapter.py", fill(ADAPTER)), ("README.md", fill(README))] {
        let path = dir.join(file);
        attn_reference::golden::write_atomic(&path, text.as_bytes())
            .map_err(|e| usage(format!("cannot write {}: {e}", path.display())))?;
    }
    println!("wrote {shown}/adapter.py and {shown}/README.md");
    println!("run it:");
    println!(
        "  attn-diff check --backend {} --external {flag}",
        attn_results::BackendRef::external(&name)
    );
    println!(
        "the adapter needs attn_diff_adapter: pip install {package} (or it uses that checkout)"
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names() {
        assert_eq!(class_name("my-adapter"), "MyAdapter");
        assert_eq!(class_name("x"), "X");
        assert_eq!(class_name("9lives"), "Adapter9lives");
        assert_eq!(class_name("fast_attn-2"), "FastAttn2");
    }

    #[test]
    fn the_templates_hold_every_placeholder_they_need() {
        for p in [
            "__CHECKOUT__",
            "__CLASS__",
            "__NAME__",
            "__EXTERNAL_FLAG__",
            "__PACKAGE__",
        ] {
            assert!(ADAPTER.contains(p), "{p}");
        }
        for p in ["__EXTERNAL_FLAG__", "__SCRIPT_TOML__", "__PACKAGE__"] {
            assert!(README.contains(p), "{p}");
        }
    }

    #[test]
    fn the_external_flag_survives_a_shell() {
        assert_eq!(
            external_flag("x", "/d/adapter.py"),
            "x='python3 /d/adapter.py'"
        );
        let flag = external_flag("x", "/my dir/adapter.py");
        let words = shlex::split(&flag).unwrap();
        assert_eq!(words, vec!["x=python3 '/my dir/adapter.py'"]);
    }
}
