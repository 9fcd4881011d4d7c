//! `attn-diff export`: a case's tensors and the oracle's output as a safetensors file.

use super::setup::{load_case, spec_named, usage};
use crate::cli::ExportArgs;

pub fn run(args: ExportArgs) -> anyhow::Result<bool> {
    let case = match (args.spec, args.case) {
        (Some(name), _) => {
            let spec = spec_named(&name)?;
            let mut config = attn_reference::AttentionConfig::new(
                args.heads.query,
                args.heads.kv,
                args.head_size,
                args.block_size,
                args.dtype,
            );
            config.sliding_window = args.window;
            config.kind = spec.kind;
            // Check the config before building anything from it.
            config.validate().map_err(|e| usage(e.to_string()))?;
            super::setup::check_spec_size(&spec, &config)?;
            attn_reference::build_spec_case(&spec, config, args.seed)
        }
        (None, Some(path)) => load_case(&path)?,
        (None, None) => return Err(usage("export needs --spec NAME or --case FILE")),
    };
    let expected = attn_reference::reference_output(&case);
    let bytes = crate::export::case_to_safetensors(&case, Some(&expected));
    attn_reference::golden::write_atomic(&args.out, &bytes)
        .map_err(|e| usage(format!("cannot write {}: {e}", args.out.display())))?;
    eprintln!(
        "wrote {} ({} bytes): {}",
        args.out.display(),
        bytes.len(),
        case.shape_summary()
    );
    Ok(true)
}
