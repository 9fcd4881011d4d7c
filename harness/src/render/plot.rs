//! Pictures: the error heat map of a divergence (tokens × heads) and bar charts for `bench`.
//! Drawn with plotters into PNG, with an embedded font so labels render anywhere.

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;
use std::sync::Once;

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSansMono.ttf");

fn init_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Registering a valid embedded font cannot fail in practice; if it does, text is lost,
        // not the picture.
        let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Absolute errors, `tokens` rows of `heads`.
#[derive(Clone, Copy, Debug)]
pub struct ErrorGrid<'a> {
    pub errors: &'a [f64],
    pub tokens: usize,
    pub heads: usize,
}

/// Heat map of `grid` relative to `allowance`: cells within tolerance are pale, beyond it
/// they go from orange to dark red (log scale).
pub fn heat_map(
    path: &Path,
    title: &str,
    grid: ErrorGrid<'_>,
    allowance: f64,
    boundaries: &[usize],
) -> Result<(), String> {
    let ErrorGrid {
        errors,
        tokens,
        heads,
    } = grid;
    init_font();
    let cell = (640 / tokens.max(1)).clamp(4, 48) as u32;
    let bar_width = 130;
    let w = (cell * tokens.max(1) as u32 + 140).max(360) + bar_width;
    let h = (cell * heads.max(1) as u32 + 110).max(220);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(w - bar_width);
    let mut chart = ChartBuilder::on(&left)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(0..tokens.max(1), 0..heads.max(1))
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("token (lines: sequence boundaries)")
        .y_desc("head")
        .draw()
        .map_err(err)?;
    let allowance = allowance.max(f64::MIN_POSITIVE);
    let colour = |e: f64| -> RGBColor {
        if !e.is_finite() {
            return RGBColor(0, 0, 0);
        }
        let r = e / allowance;
        if r <= 1.0 {
            let t = (r * 40.0) as u8;
            return RGBColor(235 - t, 245 - t, 255);
        }
        // 1x..1000x the allowance: orange to dark red.
        let t = (r.log10() / 3.0).clamp(0.0, 1.0);
        RGBColor((255.0 - 120.0 * t) as u8, (170.0 * (1.0 - t)) as u8, 0)
    };
    chart
        .draw_series(
            (0..tokens)
                .flat_map(|t| (0..heads).map(move |h| (t, h)))
                .map(|(t, h)| {
                    let e = errors[t * heads + h];
                    Rectangle::new([(t, h), (t + 1, h + 1)], colour(e).filled())
                }),
        )
        .map_err(err)?;
    // Where one sequence's tokens end and the next one's begin.
    chart
        .draw_series(
            boundaries
                .iter()
                .filter(|&&b| b > 0 && b < tokens)
                .map(|&b| PathElement::new(vec![(b, 0), (b, heads.max(1))], BLACK.stroke_width(2))),
        )
        .map_err(err)?;
    colour_bar(&right, allowance, &colour, h)
}

/// The heat map's scale: error 0 to the tolerance (blue), 1x to 1000x the tolerance (orange
/// to dark red), and NaN/Inf (black), labelled.
fn colour_bar(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    allowance: f64,
    colour: &dyn Fn(f64) -> RGBColor,
    h: u32,
) -> Result<(), String> {
    let (top, bottom) = (40i32, h as i32 - 60);
    let x = 10i32;
    let steps = (bottom - top).max(1);
    // Bottom half: 0..=tolerance linearly; top half: tolerance..1000x logarithmically.
    let value_at = |y: i32| -> f64 {
        let f = (bottom - y) as f64 / steps as f64;
        if f <= 0.5 {
            allowance * f * 2.0
        } else {
            allowance * 10f64.powf((f - 0.5) * 2.0 * 3.0)
        }
    };
    for y in top..bottom {
        area.draw(&Rectangle::new(
            [(x, y), (x + 20, y + 1)],
            colour(value_at(y)).filled(),
        ))
        .map_err(err)?;
    }
    area.draw(&Rectangle::new(
        [(x, bottom + 8), (x + 20, bottom + 22)],
        RGBColor(0, 0, 0).filled(),
    ))
    .map_err(err)?;
    let label = |text: String, y: i32| Text::new(text, (x + 26, y - 6), ("sans-serif", 12));
    let mid = top + steps / 2;
    for (text, y) in [
        ("1000x tol".to_string(), top),
        ("10x tol".to_string(), top + steps / 6),
        (format!("tol {allowance:.1e}"), mid),
        ("0".to_string(), bottom),
        ("NaN / Inf".to_string(), bottom + 15),
    ] {
        area.draw(&label(text, y)).map_err(err)?;
    }
    // The tolerance: where passing turns into failing.
    area.draw(&PathElement::new(
        vec![(x - 4, mid), (x + 24, mid)],
        BLACK.stroke_width(2),
    ))
    .map_err(err)?;
    area.draw(&Text::new("abs error", (x, 16), ("sans-serif", 13)))
        .map_err(err)?;
    Ok(())
}

/// A grouped bar chart, log-scaled: one group per label, one bar per series.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    labels: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<(), String> {
    init_font();
    let values = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo > hi {
        (0.01, 1.0)
    } else {
        (lo / 2.0, hi * 2.0)
    };
    let groups = labels.len().max(1);
    let width = (groups as u32 * (30 + 18 * series.len() as u32) + 160).max(640);
    let root = BitMapBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..groups as f64, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 && i < labels.len() {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    let n = series.len().max(1) as f64;
    let bar = 0.8 / n;
    for (si, (name, vals)) in series.iter().enumerate() {
        let colour = Palette99::pick(si).to_rgba();
        chart
            .draw_series(
                vals.iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite() && **v > 0.0)
                    .map(|(g, &v)| {
                        let x0 = g as f64 + 0.1 + bar * si as f64;
                        Rectangle::new([(x0, lo), (x0 + bar * 0.95, v)], colour.filled())
                    }),
            )
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}
