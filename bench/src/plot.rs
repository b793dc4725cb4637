//! The latency-vs-throughput chart (SVG): x = ops/s, y = latency, both on
//! log scales; per system a solid p50 line and a dashed p99 line, with a
//! point per concurrency level.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One point: a concurrency level of one system.
pub struct Point {
    pub concurrency: usize,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

pub struct Series {
    pub system: String,
    pub points: Vec<Point>,
}

const COLORS: [RGBColor; 4] = [
    RGBColor(0xd6, 0x27, 0x28), // kraft
    RGBColor(0x1f, 0x77, 0xb4), // etcd
    RGBColor(0x2c, 0xa0, 0x2c), // ZooKeeper
    RGBColor(0x94, 0x67, 0xbd),
];

pub fn latency_vs_throughput(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| p.ops_per_sec > 0.0)
    };
    if points().next().is_none() {
        return Err(anyhow!("no successful point to plot"));
    }
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for p in points() {
        x_min = x_min.min(p.ops_per_sec);
        x_max = x_max.max(p.ops_per_sec);
        for y in [p.p50_ms, p.p99_ms].into_iter().filter(|y| *y > 0.0) {
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    if y_max == 0.0 {
        (y_min, y_max) = (0.1, 1.0);
    }
    let x_range = (x_min / 1.5)..(x_max * 1.5);
    let y_range = (y_min / 1.5)..(y_max * 1.5);

    let root = SVGBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .max_light_lines(3)
        .x_labels(8)
        .y_labels(8)
        .x_desc("throughput (ops/s, log scale)")
        .y_desc("commit latency (ms, log scale)")
        .x_label_formatter(&|x| {
            if *x >= 1000.0 {
                format!("{}k", x / 1000.0)
            } else {
                format!("{x:.0}")
            }
        })
        .y_label_formatter(&|y| if *y < 1.0 { format!("{y:.2}") } else { format!("{y:.0}") })
        .draw()
        .map_err(draw_error)?;

    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<&Point> = s.points.iter().filter(|p| p.ops_per_sec > 0.0).collect();
        pts.sort_by_key(|p| p.concurrency);
        let p50: Vec<(f64, f64)> = pts.iter().map(|p| (p.ops_per_sec, p.p50_ms)).collect();
        let p99: Vec<(f64, f64)> = pts.iter().map(|p| (p.ops_per_sec, p.p99_ms)).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), color.stroke_width(2)).point_size(4))
            .map_err(draw_error)?
            .label(format!("{} p50", s.system))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(p99.clone(), 8, 5, color.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!("{} p99", s.system))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2)));
        chart
            .draw_series(p99.iter().map(|&(x, y)| TriangleMarker::new((x, y), 5, color.filled())))
            .map_err(draw_error)?;
        // Label each p50 point with its concurrency.
        chart
            .draw_series(pts.iter().map(|p| {
                Text::new(
                    format!("C={}", p.concurrency),
                    (p.ops_per_sec, p.p50_ms),
                    ("sans-serif", 12).into_font().color(&color),
                )
            }))
            .map_err(draw_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

fn draw_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}
