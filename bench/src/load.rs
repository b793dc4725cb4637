//! The closed-loop driver: C clients, each sending its next request as soon
//! as its previous one is answered, for a warm-up and then a measured window.
//! Latencies go into an HDR histogram (1 µs resolution, 3 significant
//! digits); failed requests are counted as errors, never as successes.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::procs;

/// After a failed request a client waits this long before the next one, so
/// that a dead server does not turn the loop into a busy spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// A request not answered within this long counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Distinct error messages kept for the report.
const ERROR_SAMPLES: usize = 5;

/// One client of the closed loop, with its own connection or session.
pub trait Client: Send + 'static {
    /// Sends one request and waits for its answer; `Ok(n)` is a success that
    /// carried `n` records.
    fn request(&mut self) -> impl Future<Output = Result<u64, String>> + Send;
}

/// How long to run.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one closed-loop run measured (the window only).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadResult {
    pub concurrency: usize,
    pub window_secs: f64,
    /// Successful requests completed in the window.
    pub ops: u64,
    /// Records those requests carried.
    pub records: u64,
    /// Failed requests completed in the window.
    pub errors: u64,
    pub ops_per_sec: f64,
    pub records_per_sec: f64,
    pub latency_ms: Latency,
    /// Cores used by the server processes over the window (user + system).
    pub server_cpu_cores: f64,
    /// Cores used by this process (the load generator) over the window.
    pub client_cpu_cores: f64,
    /// A few distinct error messages with their counts.
    pub error_samples: BTreeMap<String, u64>,
    /// The same window split by where the clients sent their requests
    /// (e.g. "leader", "followers"), when they were labelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_target: Vec<TargetResult>,
}

/// What the clients of one target saw in the window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetResult {
    pub target: String,
    pub clients: usize,
    pub ops_per_sec: f64,
    pub latency_ms: Latency,
}

/// Latency percentiles of successful requests, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50: ms(h.value_at_quantile(0.50)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// A histogram of microseconds from 1 µs to 100 s.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// What one client saw in the window.
struct Tally {
    histogram: Histogram<u64>,
    ops: u64,
    records: u64,
    errors: u64,
    error_samples: BTreeMap<String, u64>,
}

/// Runs `clients` in a closed loop: a warm-up, then the measured window.
/// Only requests that complete inside the window count. `server_pids` are
/// the processes whose CPU use is reported (empty for an in-process server).
pub async fn run<C: Client>(clients: Vec<C>, window: Window, server_pids: &[u32]) -> LoadResult {
    let labelled = clients.into_iter().map(|c| (c, String::new())).collect();
    run_labelled(labelled, window, server_pids).await
}

/// [`run`], with each client labelled by its target: the result also
/// splits ops and latency by label (`by_target`, in label order), unless
/// every label is the same.
pub async fn run_labelled<C: Client>(clients: Vec<(C, String)>, window: Window, server_pids: &[u32]) -> LoadResult {
    let concurrency = clients.len();
    let start = Instant::now();
    let measure_from = start + window.warmup;
    let measure_until = measure_from + window.measure;

    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(client, label)| (label, tokio::spawn(drive(client, measure_from, measure_until))))
        .collect();

    tokio::time::sleep_until(measure_from).await;
    let cpu_start = (
        procs::total_cpu_seconds(server_pids),
        procs::self_cpu_seconds().unwrap_or(0.0),
    );
    let wall_start = Instant::now();
    tokio::time::sleep_until(measure_until).await;
    let cpu_end = (
        procs::total_cpu_seconds(server_pids),
        procs::self_cpu_seconds().unwrap_or(0.0),
    );
    let wall = wall_start.elapsed().as_secs_f64();

    let mut histogram = new_histogram();
    let (mut ops, mut records, mut errors) = (0, 0, 0);
    let mut error_samples: BTreeMap<String, u64> = BTreeMap::new();
    let mut targets: BTreeMap<String, (usize, u64, Histogram<u64>)> = BTreeMap::new();
    for (label, task) in tasks {
        match task.await {
            Ok(tally) => {
                histogram.add(&tally.histogram).expect("same histogram bounds");
                let target = targets.entry(label).or_insert_with(|| (0, 0, new_histogram()));
                target.0 += 1;
                target.1 += tally.ops;
                target.2.add(&tally.histogram).expect("same histogram bounds");
                ops += tally.ops;
                records += tally.records;
                errors += tally.errors;
                for (message, count) in tally.error_samples {
                    if error_samples.len() < ERROR_SAMPLES || error_samples.contains_key(&message) {
                        *error_samples.entry(message).or_default() += count;
                    }
                }
            }
            Err(join_error) => {
                errors += 1;
                *error_samples
                    .entry(format!("client task failed: {join_error}"))
                    .or_default() += 1;
            }
        }
    }
    let secs = window.measure.as_secs_f64();
    let by_target = if targets.len() > 1 {
        targets
            .into_iter()
            .map(|(target, (clients, ops, histogram))| TargetResult {
                target,
                clients,
                ops_per_sec: ops as f64 / secs,
                latency_ms: Latency::from_histogram(&histogram),
            })
            .collect()
    } else {
        Vec::new()
    };
    LoadResult {
        concurrency,
        window_secs: secs,
        ops,
        records,
        errors,
        ops_per_sec: ops as f64 / secs,
        records_per_sec: records as f64 / secs,
        latency_ms: Latency::from_histogram(&histogram),
        server_cpu_cores: (cpu_end.0 - cpu_start.0) / wall,
        client_cpu_cores: (cpu_end.1 - cpu_start.1) / wall,
        error_samples,
        by_target,
    }
}

/// One client's loop until the end of the window.
async fn drive<C: Client>(mut client: C, measure_from: Instant, measure_until: Instant) -> Tally {
    let mut tally = Tally {
        histogram: new_histogram(),
        ops: 0,
        records: 0,
        errors: 0,
        error_samples: BTreeMap::new(),
    };
    loop {
        let sent = Instant::now();
        if sent >= measure_until {
            return tally;
        }
        let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, client.request()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        };
        let done = Instant::now();
        let counted = done >= measure_from && done < measure_until;
        match outcome {
            Ok(records) if counted => {
                let micros = (done - sent).as_micros().max(1) as u64;
                tally.histogram.saturating_record(micros);
                tally.ops += 1;
                tally.records += records;
            }
            Ok(_) => {}
            Err(message) => {
                if counted {
                    tally.errors += 1;
                    if tally.error_samples.len() < ERROR_SAMPLES || tally.error_samples.contains_key(&message) {
                        *tally.error_samples.entry(message).or_default() += 1;
                    }
                }
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
        }
    }
}

/// A value of exactly `len` ASCII bytes that names the client and request,
/// padded with `x`.
pub fn payload(client: usize, seq: u64, len: usize) -> String {
    let mut value = format!("c{client:05}-{seq:012}-");
    value.truncate(len);
    while value.len() < len {
        value.push('x');
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flaky {
        n: u64,
    }

    impl Client for Flaky {
        async fn request(&mut self) -> Result<u64, String> {
            self.n += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            if self.n.is_multiple_of(4) {
                Err("every fourth fails".to_string())
            } else {
                Ok(2)
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_counted_apart_from_successes() {
        let window = Window {
            warmup: Duration::from_millis(100),
            measure: Duration::from_millis(1000),
        };
        let result = run(vec![Flaky { n: 0 }, Flaky { n: 0 }], window, &[]).await;
        assert_eq!(result.concurrency, 2);
        assert!(result.ops > 0 && result.errors > 0, "{result:?}");
        assert_eq!(result.records, 2 * result.ops);
        assert!(result.ops > result.errors);
        assert_eq!(result.error_samples.get("every fourth fails"), Some(&result.errors));
        assert!(result.by_target.is_empty(), "one target: no split");
    }

    #[tokio::test(start_paused = true)]
    async fn labelled_clients_are_also_counted_by_target() {
        let window = Window {
            warmup: Duration::from_millis(100),
            measure: Duration::from_millis(1000),
        };
        let clients = vec![
            (Flaky { n: 0 }, "leader".to_string()),
            (Flaky { n: 0 }, "followers".to_string()),
            (Flaky { n: 0 }, "followers".to_string()),
        ];
        let result = run_labelled(clients, window, &[]).await;
        let split: Vec<_> = result.by_target.iter().map(|t| (t.target.as_str(), t.clients)).collect();
        assert_eq!(split, [("followers", 2), ("leader", 1)]);
        let sum: f64 = result.by_target.iter().map(|t| t.ops_per_sec).sum();
        assert!((sum - result.ops_per_sec).abs() < 1e-6, "{result:?}");
    }

    #[test]
    fn payloads_have_the_asked_length() {
        assert_eq!(payload(3, 7, 100).len(), 100);
        assert_eq!(payload(3, 7, 10).len(), 10);
        assert!(payload(3, 7, 100).starts_with("c00003-000000000007-x"));
    }
}
