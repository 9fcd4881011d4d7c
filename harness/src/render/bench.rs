//! Rendering a bench summary: a text or markdown table under a headline, and a bar chart.

use attn_results::{BenchStatus, BenchSummary};

fn num(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".into()
    }
}

const HEADER: [&str; 10] = [
    "backend",
    "spec",
    "median ms",
    "min ms",
    "tokens/s",
    "KV GB/s",
    "of bandwidth",
    "peak extra MiB",
    "vs baseline",
    "status",
];

fn table_rows(s: &BenchSummary) -> Vec<Vec<String>> {
    s.rows
        .iter()
        .map(|r| {
            vec![
                r.backend.to_string(),
                r.spec.clone(),
                num(r.median_ms, 3),
                num(r.min_ms, 3),
                num(r.tokens_per_s, 0),
                num(r.kv_gb_per_s, 1),
                if r.fraction_of_bandwidth.is_finite() {
                    format!("{:.0}%", 100.0 * r.fraction_of_bandwidth)
                } else {
                    "-".into()
                },
                num(r.peak_extra_mib, 1),
                r.ratio_to_baseline
                    .map_or("-".into(), |x| format!("{x:.2}x")),
                r.status.to_string(),
            ]
        })
        .collect()
}

fn headline(s: &BenchSummary) -> String {
    format!(
        "attn-diff bench: {} heads {}/{}, head size {}{}, block size {}, {} thread(s), median of {} reps{}; measured read bandwidth {:.1} GB/s",
        s.dtype,
        s.heads.0,
        s.heads.1,
        s.head_size,
        s.mla_head_size_v
            .map_or(String::new(), |v| format!(" (MLA latent, V {v})")),
        s.block_size,
        s.threads,
        s.reps,
        if s.cold { ", caches evicted before each call" } else { "" },
        s.read_bandwidth_gb_per_s
    )
}

pub fn render_text(s: &BenchSummary) -> String {
    format!(
        "{}\n{}",
        headline(s),
        crate::render::table::text(&HEADER, &table_rows(s))
    )
}

pub fn render_markdown(s: &BenchSummary) -> String {
    format!(
        "{}\n\n{}",
        headline(s),
        attn_results::markdown::table(&HEADER, &table_rows(s))
    )
}

/// Bar chart of median time per spec per backend (log scale).
pub fn plot(s: &BenchSummary, path: &std::path::Path) -> Result<(), String> {
    let mut specs: Vec<String> = Vec::new();
    let mut backends: Vec<&attn_results::BackendId> = Vec::new();
    for r in &s.rows {
        if !specs.contains(&r.spec) {
            specs.push(r.spec.clone());
        }
        if !backends.contains(&&r.backend) {
            backends.push(&r.backend);
        }
    }
    let series: Vec<(String, Vec<f64>)> = backends
        .iter()
        .map(|b| {
            (
                b.to_string(),
                specs
                    .iter()
                    .map(|sp| {
                        s.rows
                            .iter()
                            .find(|r| {
                                &r.backend == *b && &r.spec == sp && r.status == BenchStatus::Ok
                            })
                            .map_or(f64::NAN, |r| r.median_ms)
                    })
                    .collect(),
            )
        })
        .collect();
    let title = format!(
        "median time of one call, {} {}/{} d{} bs{}, {} thread(s)",
        s.dtype, s.heads.0, s.heads.1, s.head_size, s.block_size, s.threads
    );
    crate::render::plot::bar_chart(path, &title, "ms (log scale)", &specs, &series)
}
