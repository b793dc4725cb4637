//! The `ab` command: two kraft builds in alternated pairs, kraft only.
//!
//! This machine's speed moves by up to 1.5× within minutes, so one run of
//! each build says little about a change. `ab` runs the baseline and the
//! candidate one after the other, pair after pair, in the order A B, B A,
//! A B, … (so a slow drift of the machine does not favour whichever build
//! always runs second), each point on a fresh cluster like `cluster`. For
//! every concurrency level it then prints each pair's candidate/baseline
//! ratio, their median, and in how many pairs the candidate did better:
//! the figures BENCHMARKS.md reports for a change.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::harness::{self, ClusterOptions, Installed, Machine, PointRecord, System};
use crate::procs;

pub struct AbOptions {
    /// The cluster settings (window, levels, value size, data root, out).
    pub cluster: ClusterOptions,
    pub baseline: PathBuf,
    pub candidate: PathBuf,
    pub pairs: usize,
}

/// Which build a run used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Build {
    #[serde(rename = "baseline")]
    Baseline,
    #[serde(rename = "candidate")]
    Candidate,
}

impl Build {
    fn label(self) -> &'static str {
        match self {
            Build::Baseline => "A (baseline)",
            Build::Candidate => "B (candidate)",
        }
    }
}

/// The builds of pair `pair` (from 1) in the order they run: A B in odd
/// pairs, B A in even ones.
pub fn order(pair: usize) -> [Build; 2] {
    if pair % 2 == 1 {
        [Build::Baseline, Build::Candidate]
    } else {
        [Build::Candidate, Build::Baseline]
    }
}

#[derive(Serialize)]
struct AbPoint {
    pair: usize,
    build: Build,
    point: PointRecord,
}

/// candidate / baseline at one concurrency level, pair by pair.
#[derive(Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub concurrency: usize,
    /// ops/s ratio of each pair where both runs succeeded (above 1: the candidate is faster).
    pub ops_ratios: Vec<f64>,
    /// p50 latency ratio of each such pair (below 1: the candidate is quicker).
    pub p50_ratios: Vec<f64>,
    /// p99 latency ratio of each such pair.
    pub p99_ratios: Vec<f64>,
}

impl Comparison {
    /// Pairs in which the candidate had more ops/s.
    pub fn candidate_faster(&self) -> usize {
        self.ops_ratios.iter().filter(|r| **r > 1.0).count()
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Pairs up the runs of each level: one ratio per pair in which both builds
/// produced a result.
fn compare(points: &[AbPoint], levels: &[usize], pairs: usize) -> Vec<Comparison> {
    levels
        .iter()
        .map(|&concurrency| {
            let mut comparison = Comparison {
                concurrency,
                ops_ratios: Vec::new(),
                p50_ratios: Vec::new(),
                p99_ratios: Vec::new(),
            };
            for pair in 1..=pairs {
                let result = |build: Build| {
                    points
                        .iter()
                        .find(|p| p.pair == pair && p.build == build && p.point.concurrency == concurrency)
                        .and_then(|p| p.point.result.as_ref())
                };
                let (Some(a), Some(b)) = (result(Build::Baseline), result(Build::Candidate)) else {
                    continue;
                };
                let mut push = |to: fn(&mut Comparison) -> &mut Vec<f64>, a: f64, b: f64| {
                    if a > 0.0 {
                        to(&mut comparison).push(b / a);
                    }
                };
                push(|c| &mut c.ops_ratios, a.ops_per_sec, b.ops_per_sec);
                push(|c| &mut c.p50_ratios, a.latency_ms.p50, b.latency_ms.p50);
                push(|c| &mut c.p99_ratios, a.latency_ms.p99, b.latency_ms.p99);
            }
            comparison
        })
        .collect()
}

fn print_comparisons(comparisons: &[Comparison], pairs: usize) {
    println!("\n== candidate / baseline, pair by pair (ops/s: above 1 = the candidate is faster; p50, p99: below 1 = quicker)");
    let list = |values: &[f64]| values.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>().join(" ");
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for c in comparisons {
        println!(
            "C={:<4} ops/s median {} (faster in {} of {} pairs): {}",
            c.concurrency,
            show(median(&c.ops_ratios)),
            c.candidate_faster(),
            c.ops_ratios.len(),
            list(&c.ops_ratios)
        );
        println!(
            "       p50   median {}: {}",
            show(median(&c.p50_ratios)),
            list(&c.p50_ratios)
        );
        println!(
            "       p99   median {}: {}",
            show(median(&c.p99_ratios)),
            list(&c.p99_ratios)
        );
        if c.ops_ratios.len() < pairs {
            println!(
                "       ({} of {pairs} pairs had a failed run and are left out)",
                pairs - c.ops_ratios.len()
            );
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    started_unix: u64,
    machine: Machine,
    baseline: String,
    candidate: String,
    pairs: usize,
    concurrency: &'a [usize],
    warmup_secs: f64,
    duration_secs: f64,
    value_bytes: usize,
    client_threads: usize,
    points: &'a [AbPoint],
    comparisons: &'a [Comparison],
}

pub async fn run(options: AbOptions) -> Result<()> {
    let cluster = &options.cluster;
    let machine = Machine::here(&cluster.data_root);
    println!(
        "kraft-bench ab: {} cores, kernel {}, data on {}",
        machine.nproc, machine.kernel, machine.data_filesystem
    );
    for (flag, bin) in [("--baseline", &options.baseline), ("--candidate", &options.candidate)] {
        anyhow::ensure!(bin.is_file(), "{flag} {}: no such file", bin.display());
    }
    let (baseline, candidate) = (options.baseline.clone(), options.candidate.clone());
    println!(
        "A (baseline):  {}\nB (candidate): {}",
        baseline.display(),
        candidate.display()
    );
    std::fs::create_dir_all(&cluster.out)
        .with_context(|| format!("cannot create the results directory {}", cluster.out.display()))?;
    let started_unix = procs::since_epoch().as_secs();
    println!(
        "== {} alternated pairs (A B, B A, ...), a fresh 3-node cluster per point, {}-byte values, warm-up {:?}, measured {:?}",
        options.pairs, cluster.value_bytes, cluster.window.warmup, cluster.window.measure
    );

    let mut points = Vec::new();
    for pair in 1..=options.pairs {
        for build in order(pair) {
            let installed = Installed {
                kraft: match build {
                    Build::Baseline => baseline.clone(),
                    Build::Candidate => candidate.clone(),
                },
                etcd: None,
                zookeeper: None,
            };
            println!("\n-- pair {pair}, {}", build.label());
            harness::print_header();
            for &concurrency in &cluster.concurrency {
                let system = if cluster.native {
                    System::KraftNative
                } else {
                    System::Kraft
                };
                let placement = cluster.placements[0];
                let point = harness::measure_point(system, placement, concurrency, pair, &installed, cluster).await;
                harness::print_point(&point);
                points.push(AbPoint { pair, build, point });
            }
        }
    }

    let comparisons = compare(&points, &cluster.concurrency, options.pairs);
    print_comparisons(&comparisons, options.pairs);

    let json_path = cluster.out.join(format!("ab-{started_unix}.json"));
    let report = Report {
        kind: "ab",
        started_unix,
        machine,
        baseline: baseline.display().to_string(),
        candidate: candidate.display().to_string(),
        pairs: options.pairs,
        concurrency: &cluster.concurrency,
        warmup_secs: cluster.window.warmup.as_secs_f64(),
        duration_secs: cluster.window.measure.as_secs_f64(),
        value_bytes: cluster.value_bytes,
        client_threads: cluster.client_threads,
        points: &points,
        comparisons: &comparisons,
    };
    procs::write_json(&json_path, &report)?;
    println!("\nresults: {}", json_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Latency, LoadResult};

    fn point(pair: usize, build: Build, concurrency: usize, ops: Option<f64>, p50: f64) -> AbPoint {
        AbPoint {
            pair,
            build,
            point: PointRecord {
                system: System::Kraft,
                placement: harness::Placement::Leader,
                concurrency,
                run: pair,
                leader: None,
                fdatasync_p50_ms_before: None,
                result: ops.map(|ops| LoadResult {
                    concurrency,
                    window_secs: 1.0,
                    ops: ops as u64,
                    records: ops as u64,
                    errors: 0,
                    ops_per_sec: ops,
                    records_per_sec: ops,
                    latency_ms: Latency {
                        p50,
                        p99: 2.0 * p50,
                        ..Latency::default()
                    },
                    server_cpu_cores: 0.0,
                    client_cpu_cores: 0.0,
                    error_samples: Default::default(),
                    by_target: Vec::new(),
                }),
                error: ops.is_none().then(|| "failed".to_string()),
            },
        }
    }

    #[test]
    fn pairs_alternate_which_build_runs_first() {
        assert_eq!(order(1), [Build::Baseline, Build::Candidate]);
        assert_eq!(order(2), [Build::Candidate, Build::Baseline]);
        assert_eq!(order(3), [Build::Baseline, Build::Candidate]);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn each_pair_gives_one_ratio_per_level_and_a_failed_run_drops_its_pair() {
        let points = vec![
            point(1, Build::Baseline, 64, Some(100.0), 2.0),
            point(1, Build::Candidate, 64, Some(120.0), 1.0),
            point(1, Build::Baseline, 1, Some(10.0), 1.0),
            point(1, Build::Candidate, 1, Some(5.0), 2.0),
            point(2, Build::Candidate, 64, Some(90.0), 2.0),
            point(2, Build::Baseline, 64, Some(100.0), 2.0),
            point(2, Build::Candidate, 1, None, 0.0),
            point(2, Build::Baseline, 1, Some(10.0), 1.0),
        ];
        let comparisons = compare(&points, &[1, 64], 2);
        assert_eq!(comparisons[0].concurrency, 1);
        assert_eq!(comparisons[0].ops_ratios, vec![0.5]);
        assert_eq!(comparisons[0].p50_ratios, vec![2.0]);
        assert_eq!(comparisons[0].candidate_faster(), 0);
        assert_eq!(comparisons[1].ops_ratios, vec![1.2, 0.9]);
        assert_eq!(comparisons[1].p50_ratios, vec![0.5, 1.0]);
        assert_eq!(comparisons[1].p99_ratios, vec![0.5, 1.0]);
        assert_eq!(comparisons[1].candidate_faster(), 1);
    }
}
