//! `GET /metrics`: Kafka's raft metrics (`kafka.server:type=raft-metrics`)
//! in the Prometheus text exposition format, version 0.0.4.
//!
//! Kafka's `-rate` meters become `_total` counters: Prometheus derives the
//! rate itself (`rate(kraft_raft_append_records_total[1m])` is
//! append-records-rate), and a counter survives scrapes at any interval.

use std::fmt::Write;

use crate::node::MetricsSnapshot;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

enum Kind {
    Gauge,
    Counter,
}

/// Renders `snapshot`; one HELP, one TYPE and one sample line per metric.
pub fn render(snapshot: &MetricsSnapshot) -> String {
    let s = snapshot;
    let mut out = String::with_capacity(2048);
    use Kind::{Counter, Gauge};
    let metrics: [(&str, Kind, &str, f64); 21] = [
        (
            "kraft_raft_current_state",
            Gauge,
            "current-state: 0 unattached, 1 prospective, 2 candidate, 3 leader, 4 follower, 5 resigned",
            f64::from(s.current_state),
        ),
        (
            "kraft_raft_current_leader",
            Gauge,
            "current-leader: the leader's node id, -1 when unknown",
            f64::from(s.current_leader),
        ),
        (
            "kraft_raft_current_epoch",
            Gauge,
            "current-epoch: the current quorum epoch",
            f64::from(s.current_epoch),
        ),
        (
            "kraft_raft_high_watermark",
            Gauge,
            "high-watermark: the first offset not yet committed",
            s.high_watermark as f64,
        ),
        (
            "kraft_raft_log_end_offset",
            Gauge,
            "log-end-offset: the next offset to be written",
            s.log_end_offset as f64,
        ),
        (
            "kraft_raft_commit_latency_avg_ms",
            Gauge,
            "commit-latency-avg: average time from append to commit, in milliseconds",
            s.commit_latency_avg_ms,
        ),
        (
            "kraft_raft_commit_latency_max_ms",
            Gauge,
            "commit-latency-max: longest time from append to commit, in milliseconds",
            s.commit_latency_max_ms,
        ),
        (
            "kraft_raft_commits_total",
            Counter,
            "appends committed on this node as leader",
            s.commits_total as f64,
        ),
        (
            "kraft_raft_append_records_total",
            Counter,
            "records appended to the log (rate() gives append-records-rate)",
            s.append_records_total as f64,
        ),
        (
            "kraft_raft_fetch_records_total",
            Counter,
            "records fetched from the leader (rate() gives fetch-records-rate)",
            s.fetch_records_total as f64,
        ),
        (
            "kraft_raft_election_latency_avg_ms",
            Gauge,
            "election-latency-avg: average time to elect a leader, in milliseconds",
            s.election_latency_avg_ms,
        ),
        (
            "kraft_raft_election_latency_max_ms",
            Gauge,
            "election-latency-max: longest time to elect a leader, in milliseconds",
            s.election_latency_max_ms,
        ),
        (
            "kraft_raft_elections_total",
            Counter,
            "elections this node has taken part in as candidate",
            s.elections_total as f64,
        ),
        (
            "kraft_raft_fetch_requests_total",
            Counter,
            "fetch requests received by this node, refused ones included (on the leader: the replicas' fetch cycles)",
            s.fetch_requests_total as f64,
        ),
        (
            "kraft_raft_forwarded_requests_total",
            Counter,
            "forwarded-append requests received from followers and observers (each carries one or more clients' appends)",
            s.forwarded_requests_total as f64,
        ),
        (
            "kraft_raft_forwarded_appends_total",
            Counter,
            "clients' appends those forwarded requests carried",
            s.forwarded_appends_total as f64,
        ),
        (
            "kraft_storage_flushes_total",
            Counter,
            "group flushes of the log (sled flush + fdatasync, covering every append before it); election-state writes, compaction and snapshot installs sync on their own and are not counted",
            s.storage.flushes_total as f64,
        ),
        (
            "kraft_storage_flush_seconds_total",
            Counter,
            "time spent in those flushes, in seconds (divide by kraft_storage_flushes_total for the average)",
            s.storage.flush_seconds_total,
        ),
        (
            "kraft_storage_appended_batches_total",
            Counter,
            "record batches written to the log",
            s.storage.appended_batches_total as f64,
        ),
        (
            "kraft_storage_appended_bytes_total",
            Counter,
            "bytes of record batches written to the log",
            s.storage.appended_bytes_total as f64,
        ),
        (
            "kraft_uptime_seconds",
            Gauge,
            "seconds since this node started",
            s.uptime_ms as f64 / 1000.0,
        ),
    ];
    for (name, kind, help, value) in metrics {
        let kind = match kind {
            Gauge => "gauge",
            Counter => "counter",
        };
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {}", format_value(value));
    }
    out
}

/// Prometheus spells the special floats `NaN`, `+Inf` and `-Inf`; Rust's
/// `Display` would write `inf`.
fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_type_and_one_sample() {
        let snapshot = MetricsSnapshot {
            current_state: 3,
            current_leader: 1,
            current_epoch: 7,
            high_watermark: 42,
            commit_latency_avg_ms: 1.5,
            append_records_total: 10,
            ..MetricsSnapshot::default()
        };
        let text = render(&snapshot);
        for line in [
            "kraft_raft_current_state 3",
            "kraft_raft_current_epoch 7",
            "kraft_raft_high_watermark 42",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("kraft_raft_commit_latency_avg_ms 1.5\n"));
        assert!(text.contains("# TYPE kraft_raft_append_records_total counter\n"));
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples.len(), 21);
        for sample in samples {
            let name = sample.split(' ').next().unwrap();
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} has no TYPE");
        }
    }

    #[test]
    fn special_floats_use_prometheus_spelling() {
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(3.0), "3");
    }
}
