//! `attn-diff handshake`: start an adapter, print what its handshake declares, and stop it.

use super::setup::usage;
use crate::cli::HandshakeArgs;
use crate::render::Format;
use attn_backends::external::ExternalBackend;
use attn_results::BackendRef;

/// The adapter to start: the one named (with or without `external:`), else the only one given
/// with `--external`.
fn adapter_name(args: &HandshakeArgs) -> anyhow::Result<String> {
    if let Some(name) = &args.backend {
        return Ok(crate::external::adapter_of(name));
    }
    let flags = args
        .external
        .external
        .iter()
        .map(|f| crate::external::parse_flag(f, None).map(|s| s.name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(e.to_string()))?;
    match flags.as_slice() {
        [one] => Ok(one.clone()),
        _ => {
            let declared = args.external.declared().map_err(|e| usage(e.to_string()))?;
            let names: Vec<String> = declared
                .iter()
                .map(|a| BackendRef::external(&a.name).to_string())
                .collect();
            Err(usage(format!(
                "name the adapter with --backend external:NAME{} (declared: {})",
                if flags.is_empty() {
                    " or declare one with --external NAME='command …'"
                } else {
                    ""
                },
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            )))
        }
    }
}

pub fn run(args: HandshakeArgs) -> anyhow::Result<bool> {
    let name = adapter_name(&args)?;
    let spec = args.external.spec(&name).map_err(|e| {
        let known: Vec<String> = args
            .external
            .declared()
            .map(|d| d.into_iter().map(|a| a.name).collect())
            .unwrap_or_default();
        usage(format!(
            "{e}{}",
            crate::suggest::did_you_mean(&name, &known)
        ))
    })?;
    let command = spec.command.clone();
    let backend = ExternalBackend::start(spec).map_err(|e| usage(e.to_string()))?;
    let hello = backend.hello();
    let capabilities = serde_json::to_value(&hello.capabilities)?;
    let text = match args.format {
        Format::Json => serde_json::to_string_pretty(&serde_json::json!({
            "backend": BackendRef::external(&name).to_string(),
            "command": command,
            "name": hello.name,
            "version": hello.version,
            "description": hello.description,
            "capabilities": capabilities,
            "environment": hello.environment,
            "inherited_capabilities": hello.inherited_capabilities,
        }))?,
        Format::Text | Format::Markdown => {
            let sessions = if hello.version >= 2 {
                "sessions: keeps its cache across a trace's steps"
            } else {
                "single cases: traces are declined"
            };
            let quoted: Vec<String> = command
                .iter()
                .map(|w| shlex::try_quote(w).map_or_else(|_| w.clone(), |q| q.into_owned()))
                .collect();
            let rows = [
                ("backend", BackendRef::external(&name).to_string()),
                ("command", quoted.join(" ")),
                ("name", hello.name.clone()),
                (
                    "protocol",
                    format!("version {} ({sessions})", hello.version),
                ),
                (
                    "description",
                    hello.description.clone().unwrap_or_else(|| "-".into()),
                ),
                ("capabilities", capabilities.to_string()),
                ("case space", hello.capabilities.to_string()),
                (
                    "environment",
                    if hello.environment.is_empty() {
                        "-".into()
                    } else {
                        hello
                            .environment
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    },
                ),
                (
                    "inherited",
                    hello.inherited_capabilities.as_ref().map_or_else(
                        || "-".into(),
                        |c| format!("capabilities of {c} (the class declares none of its own)"),
                    ),
                ),
            ];
            rows.iter()
                .map(|(k, v)| format!("{:<13} {v}", format!("{k}:")))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    println!("{text}");
    // Dropping the backend closes the adapter's stdin, then ends its process group.
    drop(backend);
    Ok(true)
}
