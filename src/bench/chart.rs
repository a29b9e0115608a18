//! The TTFT-per-turn chart: one line per server on a log scale, so cold vs warm is visible at
//! a glance.

use std::path::Path;

use plotters::prelude::*;

use super::error::BenchError;
use super::report::Row;

/// Median TTFT per conversation turn (1 = cold, the last one after the interleaved job).
fn ttft_by_turn(rows: &[Row], server: &str) -> Vec<(u32, f64)> {
    let mut turns: Vec<u32> =
        rows.iter().filter(|r| r.server == server && r.scenario.is_conversation_turn()).map(|r| r.turn).collect();
    turns.sort_unstable();
    turns.dedup();
    turns
        .into_iter()
        .filter_map(|turn| {
            let mut values: Vec<f64> = rows
                .iter()
                .filter(|r| r.server == server && r.turn == turn && r.error.is_empty())
                .filter(|r| r.scenario.is_conversation_turn())
                .filter_map(|r| r.ttft_ms)
                .filter(|v| *v > 0.0)
                .collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).map(|&median| (turn, median))
        })
        .collect()
}

/// Checks that the chart can be written to `path` (SVG only: PNG text rendering would need
/// system fonts).
///
/// # Errors
/// [`BenchError::NotSvg`]: not an `.svg` path.
pub fn check_plot_path(path: &Path) -> Result<(), BenchError> {
    if path.extension().and_then(|e| e.to_str()) == Some("svg") {
        Ok(())
    } else {
        Err(BenchError::NotSvg(path.to_path_buf()))
    }
}

/// Draws the chart as SVG.
///
/// # Errors
/// [`BenchError::NotSvg`]: not an `.svg` path; [`BenchError::NothingToPlot`]: no conversation
/// turn succeeded; [`BenchError::Drawing`]: the chart cannot be drawn or written.
pub fn plot(rows: &[Row], path: &Path) -> Result<(), BenchError> {
    check_plot_path(path)?;
    let mut servers: Vec<&str> = Vec::new();
    for row in rows {
        if !servers.contains(&row.server.as_str()) {
            servers.push(&row.server);
        }
    }
    let series: Vec<(&str, Vec<(u32, f64)>)> = servers.iter().map(|s| (*s, ttft_by_turn(rows, s))).collect();
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let (mut lowest, mut highest, mut last_turn) = (f64::INFINITY, 0.0f64, 1u32);
    for &(turn, ms) in points {
        lowest = lowest.min(ms);
        highest = highest.max(ms);
        last_turn = last_turn.max(turn);
    }
    if !lowest.is_finite() {
        return Err(BenchError::NothingToPlot);
    }
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| BenchError::Drawing { path: path.to_path_buf(), message: e.to_string() };
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Time to first token per turn (median; turn 1 cold, last turn after an interleaved job)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(1u32..last_turn, ((lowest / 2.0)..(highest * 2.0)).log_scale())
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("turn")
        .y_desc("TTFT, ms (log)")
        .x_labels(last_turn as usize)
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, (server, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| draw(&e))?
            .label(*server)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}
