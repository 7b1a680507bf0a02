//! Draws `crates/ratekeeper-core/docs/algorithms.svg`: every rate-limiting algorithm run on the
//! same bursty trace, in the memory store on a manual clock.
//!
//! ```text
//! cargo run -p ratekeeper-examples-chart --example algorithms_chart [-- <output.svg>]
//! ```
//!
//! The quota is 10 requests per minute (burst 10) for one client. The trace is 180 s long:
//! bursts of requests 50 ms apart at fixed times (12 at 0 s, 4 at 30 s, 3 at 75 s, 10 just
//! before the window boundary at 119.5 s and 10 just after it at 120.5 s), then one request
//! every 3 s from 150 s on (20 per minute, twice the quota). The top
//! panel shows the requests each algorithm admitted so far; the bottom panel the capacity it
//! reports as remaining, read every 250 ms with a free probe (a charge of cost 0).

use std::error::Error;
use std::num::NonZeroU32;
use std::time::Duration;

use plotters::prelude::*;
use ratekeeper_core::clock::ManualClock;
use ratekeeper_core::store::{Charge, MemoryStore, Store};
use ratekeeper_core::{Algorithm, Key, Policy, Quota};

/// Length of the trace, in milliseconds.
const END_MS: u64 = 180_000;
/// Interval between two probes of the remaining capacity, in milliseconds.
const PROBE_MS: u64 = 250;
/// Time between two requests of one burst, in milliseconds.
const BURST_GAP_MS: u64 = 50;

/// The bursts: (start in milliseconds, number of requests).
const BURSTS: [(u64, u64); 5] = [
    (0, 12),
    (30_000, 4),
    (75_000, 3),
    (119_500, 10),
    (120_500, 10),
];

/// The arrival time of every request, in milliseconds, sorted.
fn trace() -> Vec<u64> {
    let mut arrivals: Vec<u64> = BURSTS
        .iter()
        .flat_map(|&(at, n)| (0..n).map(move |i| at + i * BURST_GAP_MS))
        .collect();
    arrivals.extend((150_000..END_MS).step_by(3_000));
    arrivals.sort_unstable();
    arrivals
}

/// What one algorithm did with the trace, as points (seconds, value).
struct Run {
    algorithm: Algorithm,
    admitted: Vec<(f64, f64)>,
    remaining: Vec<(f64, f64)>,
    total: u32,
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Runs `algorithm` over `arrivals`: each request costs 1; a probe of cost 0 every
/// [`PROBE_MS`] reads the remaining capacity without spending any.
fn run(algorithm: Algorithm, arrivals: &[u64]) -> Result<Run, Box<dyn Error>> {
    let clock = ManualClock::new();
    let mut store = MemoryStore::with_clock(clock.clone());
    let quota = Quota::per_minute(NonZeroU32::new(10).ok_or("a zero quota")?);
    let id = store.register(&Policy::new("chart", quota).with_algorithm(algorithm))?;
    let client = Key::from("client");

    let mut out = Run {
        algorithm,
        admitted: vec![(0.0, 0.0)],
        remaining: Vec::new(),
        total: 0,
    };
    let mut requests = arrivals.iter().copied().peekable();
    let mut probe = 0;
    while probe <= END_MS {
        // Requests first when a request and a probe fall on the same millisecond.
        let request_next = requests.peek().is_some_and(|&at| at <= probe);
        if request_next {
            let at = requests.next().unwrap_or(probe);
            clock.set_elapsed(Duration::from_millis(at));
            if store
                .check_now(&[Charge::new(id, &client, 1)])?
                .is_allowed()
            {
                out.admitted.push((secs(at), f64::from(out.total)));
                out.total += 1;
                out.admitted.push((secs(at), f64::from(out.total)));
            }
        } else {
            clock.set_elapsed(Duration::from_millis(probe));
            let decisions = store.check_now(&[Charge::new(id, &client, 0)])?;
            let remaining = decisions.as_slice().first().map_or(0, |d| d.remaining());
            out.remaining.push((secs(probe), f64::from(remaining)));
            probe += PROBE_MS;
        }
    }
    out.admitted.push((secs(END_MS), f64::from(out.total)));
    Ok(out)
}

/// Line colour and dash pattern per algorithm, so overlapping lines stay readable.
fn style(i: usize) -> (RGBColor, u32) {
    const COLOURS: [RGBColor; 5] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x94, 0x67, 0xbd),
    ];
    (COLOURS[i % COLOURS.len()], if i == 1 { 6 } else { 0 })
}

fn draw(path: &str, runs: &[Run], arrivals: &[u64]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "10 requests per minute (burst 10), one bursty 180 s trace",
        ("sans-serif", 22),
    )?;
    let (top, bottom) = root.split_vertically(400);

    let offered: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
        .chain(
            arrivals
                .iter()
                .enumerate()
                .flat_map(|(i, &at)| [(secs(at), i as f64), (secs(at), (i + 1) as f64)]),
        )
        .chain(std::iter::once((secs(END_MS), arrivals.len() as f64)))
        .collect();
    let mut chart = ChartBuilder::on(&top)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .caption("Requests admitted so far", ("sans-serif", 18))
        .build_cartesian_2d(0f64..secs(END_MS), 0f64..(arrivals.len() as f64 + 2.0))?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart
        .draw_series(LineSeries::new(offered, BLACK.mix(0.35).stroke_width(2)))?
        .label(format!("offered ({})", arrivals.len()))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.35)));
    for (i, run) in runs.iter().enumerate() {
        let (colour, dash) = style(i);
        let line = colour.stroke_width(2);
        if dash > 0 {
            chart.draw_series(DashedLineSeries::new(
                run.admitted.iter().copied(),
                dash,
                dash / 2 + 2,
                line,
            ))?;
        } else {
            chart.draw_series(LineSeries::new(run.admitted.iter().copied(), line))?;
        }
        chart
            .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())?
            .label(format!("{} ({} admitted)", run.algorithm, run.total))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()?;

    let mut chart = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .caption("Remaining capacity (read every 250 ms)", ("sans-serif", 18))
        .build_cartesian_2d(0f64..secs(END_MS), 0f64..11f64)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("remaining")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, run) in runs.iter().enumerate() {
        let (colour, dash) = style(i);
        let line = colour.stroke_width(2);
        if dash > 0 {
            chart.draw_series(DashedLineSeries::new(
                run.remaining.iter().copied(),
                dash,
                dash / 2 + 2,
                line,
            ))?;
        } else {
            chart.draw_series(LineSeries::new(run.remaining.iter().copied(), line))?;
        }
    }
    root.present()?;
    Ok(())
}

fn chart() -> Result<(), Box<dyn Error>> {
    let default = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../crates/ratekeeper-core/docs/algorithms.svg"
    );
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| default.to_owned());
    let arrivals = trace();
    let runs = Algorithm::ALL
        .into_iter()
        .filter(|a| *a != Algorithm::Concurrency)
        .map(|a| run(a, &arrivals))
        .collect::<Result<Vec<_>, _>>()?;
    for run in &runs {
        println!(
            "{}: {} of {} admitted",
            run.algorithm,
            run.total,
            arrivals.len()
        );
    }
    draw(&path, &runs, &arrivals)?;
    // Scale down in narrow pages (rustdoc inlines the file); the viewBox keeps the drawing.
    let svg = std::fs::read_to_string(&path)?;
    let svg = svg.replacen(
        "<svg width=\"960\" height=\"720\"",
        "<svg width=\"960\" height=\"720\" style=\"max-width:100%;height:auto\"",
        1,
    );
    std::fs::write(&path, svg)?;
    println!("wrote {path}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    ratekeeper_examples::exit(chart())
}
