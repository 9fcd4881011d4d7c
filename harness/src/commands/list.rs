//! `attn-diff list`: the backends with what each declines (probed feature by feature from
//! [`attn_reference::Feature`]), the declared adapters (not started), and the named specs.

use super::setup::usage;
use crate::cli::ListArgs;
use crate::render::{table, Format};
use attn_backends::{all_backends, declines, declines_batch, Backend};
use attn_reference::{Aspect, AttentionConfig, DType, Feature};
use attn_results::list::Declined;
use attn_results::{AdapterEntry, BackendEntry, ListDocument, SpecEntry};

/// Columns the text list fits in.
pub const TEXT_WIDTH: usize = 100;

pub fn run(args: ListArgs) -> anyhow::Result<bool> {
    // Declared adapters are listed, not started: starting one runs its command.
    let declared = args.external.declared().map_err(|e| usage(e.to_string()))?;
    let doc = ListDocument {
        schema_version: attn_results::SCHEMA_VERSION,
        backends: all_backends().iter().map(|b| entry(b.as_ref())).collect(),
        adapters: declared
            .iter()
            .map(|a| AdapterEntry {
                name: attn_results::BackendRef::external(&a.name).to_string(),
                command: a.command.clone(),
                timeout_seconds: a.timeout.as_secs_f64(),
            })
            .collect(),
        specs: attn_reference::all_specs()
            .into_iter()
            .map(|s| SpecEntry {
                name: s.name.to_string(),
                kind: s.kind.to_string(),
                seq_lens: s.seq_lens.to_vec(),
                query_lens: s.query_lens.to_vec(),
            })
            .collect(),
    };
    let text = match args.format {
        Format::Json => attn_results::to_json(&doc),
        Format::Text => render(&doc, |h, r| table::text_wrapped(h, r, TEXT_WIDTH)),
        Format::Markdown => render(&doc, |h, r| attn_results::markdown::table(h, r)),
    };
    println!("{text}");
    Ok(true)
}

/// What `backend` declines: each feature probed on a plain config in a dtype it supports, so
/// a backend that refuses a dtype is not also reported as refusing every feature.
fn entry(backend: &dyn Backend) -> BackendEntry {
    let plain = |dt| AttentionConfig::new(8, 2, 128, 16, dt);
    let base = [DType::Bf16, DType::F16, DType::F32]
        .into_iter()
        .map(plain)
        .find(|c| declines(backend, c).is_ok())
        .unwrap_or_else(|| plain(DType::Bf16));
    // The features of a batch are probed with a batch that uses them.
    let batch_probes: Vec<(String, Result<(), _>)> = Feature::OF_THE_BATCH
        .into_iter()
        .map(|f| {
            let mut batch = attn_reference::Batch::plain(vec![1], vec![1]);
            f.turn_on_batch(&mut batch);
            (f.label().to_string(), declines_batch(backend, &batch))
        })
        .collect();
    let runs = Feature::ALL
        .into_iter()
        .flat_map(|f| f.probes(&base))
        .filter(|(_, config)| declines(backend, config).is_ok())
        .map(|(probe, _)| probe)
        .chain(
            batch_probes
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(p, _)| p.clone()),
        )
        .collect();
    let declines = Aspect::ALL
        .into_iter()
        .flat_map(|f| f.probes(&base))
        .filter_map(|(probe, config)| {
            declines(backend, &config)
                .err()
                .map(|reason| Declined { probe, reason })
        })
        .chain(
            batch_probes
                .into_iter()
                .filter_map(|(probe, r)| r.err().map(|reason| Declined { probe, reason })),
        )
        .collect();
    let layout = backend.cache_layout();
    BackendEntry {
        name: backend.name().to_string(),
        cache_shape: layout.shape.to_string(),
        cache_description: layout.description.to_string(),
        runs,
        declines,
    }
}

/// Lengths with runs of one value collapsed: `[2048×32]`, `[1, 1, 5, 5]`.
fn lengths(v: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let run = v[i..].iter().take_while(|&&x| x == v[i]).count();
        parts.push(if run > 4 {
            format!("{}×{run}", v[i])
        } else {
            vec![v[i].to_string(); run].join(", ")
        });
        i += run;
    }
    format!("[{}]", parts.join(", "))
}

fn render(doc: &ListDocument, table: impl Fn(&[&str], &[Vec<String>]) -> String) -> String {
    let backends: Vec<Vec<String>> = doc
        .backends
        .iter()
        .map(|b| vec![b.name.clone(), b.cache_shape.clone(), b.runs.join(", ")])
        .collect();
    let adapters: Vec<Vec<String>> = doc
        .adapters
        .iter()
        .map(|a| {
            vec![
                a.name.clone(),
                a.command.join(" "),
                format!("{:.0} s", a.timeout_seconds),
            ]
        })
        .collect();
    let declines: Vec<Vec<String>> = doc
        .backends
        .iter()
        .flat_map(|b| {
            b.declines
                .iter()
                .map(|d| vec![b.name.clone(), d.probe.clone(), d.reason.to_string()])
        })
        .collect();
    let specs: Vec<Vec<String>> = doc
        .specs
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.kind.clone(),
                lengths(&s.seq_lens),
                lengths(&s.query_lens),
            ]
        })
        .collect();
    let mut out = table(&["backend", "cache layout", "optional features"], &backends);
    if !adapters.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["adapter (started on use)", "command", "timeout per case"],
            &adapters,
        ));
    }
    format!(
        "{out}\n{}\n{}",
        table(&["backend", "declines", "because"], &declines),
        table(&["spec", "kind", "seq_lens", "query_lens"], &specs)
    )
}
