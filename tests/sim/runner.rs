//! Runs many seeds over a few threads and reports: per-seed lines in verbose
//! mode, totals at the end, and for every failing seed its rule, the last
//! lines of its trace and the command that replays it.
//!
//! Environment:
//! - `KRAFT_SIM_SEEDS=N`: run N seeds (default 1000), from `KRAFT_SIM_SEED_START` (default 0).
//! - `KRAFT_SIM_SEED=S`: run only seed S and print its summary.
//! - `KRAFT_SIM_EVENTS=E`: events in each seed's chaotic phase (default 10,000).
//! - `KRAFT_SIM_THREADS=T`: worker threads (default 2).
//! - `KRAFT_SIM_VERBOSE=1`: one line per seed.
//! - `KRAFT_SIM_TRACE=1`: with `KRAFT_SIM_SEED`, print every event and action.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::cluster::{Sim, Stats};
use super::trace::Trace;

pub const DEFAULT_SEEDS: u64 = 20_000;
pub const DEFAULT_EVENTS: u64 = 10_000;
/// Trace lines kept for a failure report.
const TAIL_LINES: usize = 400;

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

pub fn replay_command(seed: u64, events: u64) -> String {
    let events = if events == DEFAULT_EVENTS {
        String::new()
    } else {
        format!("KRAFT_SIM_EVENTS={events} ")
    };
    format!("KRAFT_SIM_SEED={seed} {events}cargo test --test simulation randomized_seeds -- --nocapture")
}

pub struct SeedResult {
    pub seed: u64,
    pub hash: u64,
    pub stats: Stats,
    pub params: String,
    /// The broken rule (or panic) and where.
    pub failure: Option<String>,
    pub tail: Vec<String>,
    pub nodes: String,
}

/// One seed, start to end; a panic inside the engine is a failure too.
pub fn run_seed(seed: u64, events: u64, trace: Trace) -> SeedResult {
    let mut slot: Option<Sim> = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        slot = Some(Sim::random(seed, events, trace)?);
        slot.as_mut().unwrap().run()
    }));
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(f)) => Some(f.to_string()),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(non-string panic)".to_string());
            let at = slot
                .as_ref()
                .map(|s| format!(" at t={}ms after {} events", s.now, s.stats.events));
            Some(format!("[panic]{} {msg}", at.unwrap_or_default()))
        }
    };
    match slot {
        Some(mut sim) => {
            sim.finish_stats();
            SeedResult {
                seed,
                hash: sim.trace.hash(),
                params: sim.params_summary.clone(),
                stats: sim.stats.clone(),
                tail: sim.trace.tail(),
                nodes: sim.describe_nodes(),
                failure,
            }
        }
        None => SeedResult {
            seed,
            hash: 0,
            stats: Stats::default(),
            params: String::new(),
            failure,
            tail: Vec::new(),
            nodes: String::new(),
        },
    }
}

/// Runs `seeds` over `threads` threads; results in seed-list order.
pub fn run_many(seeds: &[u64], events: u64, threads: usize, verbose: bool) -> Vec<SeedResult> {
    let threads = threads.max(1);
    let mut results: Vec<(usize, SeedResult)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for (i, &seed) in seeds.iter().enumerate().skip(t).step_by(threads) {
                        let started = Instant::now();
                        let r = run_seed(seed, events, Trace::new(false, 0));
                        if verbose {
                            println!(
                                "seed {seed:>6} {} in {:>5} ms hash {:016x} {}\n             {}",
                                if r.failure.is_some() { "FAIL" } else { "ok  " },
                                started.elapsed().as_millis(),
                                r.hash,
                                r.stats.summary(),
                                r.params
                            );
                        }
                        out.push((i, r));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker thread"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Prints a failing seed's report, re-running it to collect its trace tail.
pub fn report_failure(r: &SeedResult, events: u64) -> String {
    let again = run_seed(r.seed, events, Trace::new(false, TAIL_LINES));
    let mut s = format!(
        "\n==== seed {} FAILED: {}\n  params: {}\n  stats: {}\n  nodes:{}\n  replay: {}\n",
        r.seed,
        r.failure.as_deref().unwrap_or("?"),
        r.params,
        r.stats.summary(),
        again.nodes,
        replay_command(r.seed, events)
    );
    if again.hash != r.hash || again.failure != r.failure {
        s.push_str(&format!(
            "  NOT REPRODUCIBLE: the re-run gave hash {:016x} (was {:016x}) and {:?}\n",
            again.hash, r.hash, again.failure
        ));
    }
    s.push_str(&format!("  last {} trace lines:\n", again.tail.len()));
    for line in &again.tail {
        s.push_str("    ");
        s.push_str(line);
        s.push('\n');
    }
    s
}

/// `KRAFT_SIM_SEED=S`: one seed, its summary, and (with `KRAFT_SIM_TRACE=1`)
/// every event.
pub fn run_single(seed: u64, events: u64) -> SeedResult {
    let started = Instant::now();
    let r = run_seed(seed, events, Trace::new(env_flag("KRAFT_SIM_TRACE"), TAIL_LINES));
    println!("seed {seed}: {}", if r.failure.is_some() { "FAILED" } else { "ok" });
    println!("  params: {}", r.params);
    println!("  stats:  {}", r.stats.summary());
    println!(
        "  trace hash {:016x}, wall {} ms",
        r.hash,
        started.elapsed().as_millis()
    );
    println!("  nodes:{}", r.nodes);
    if let Some(f) = &r.failure {
        println!("  failure: {f}");
        if !env_flag("KRAFT_SIM_TRACE") {
            println!("  last {} trace lines:", r.tail.len());
            for line in &r.tail {
                println!("    {line}");
            }
        }
    }
    r
}
