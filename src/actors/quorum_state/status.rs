//! What the QuorumState reports about itself: `GET /v1/quorum`'s status and
//! the counters behind `GET /metrics`.

use super::*;

#[derive(Default)]
pub(super) struct Metrics {
    append_records_total: u64,
    /// Shared with the tasks that complete fetch reads.
    pub(super) fetch_records_total: Arc<AtomicU64>,
    elections_total: u64,
    pub(super) fetch_requests_total: u64,
    pub(super) forwarded_requests_total: u64,
    pub(super) forwarded_appends_total: u64,
    election_latency_sum_ms: f64,
    election_latency_max_ms: f64,
    /// Set while no leader is known.
    election_started_ms: Option<u64>,
}

impl Metrics {
    /// A node starts without a leader: its first election is timed from
    /// the start.
    pub(super) fn new() -> Metrics {
        Metrics {
            election_started_ms: Some(0),
            ..Metrics::default()
        }
    }

    pub(super) fn on_appended(&mut self, records: u64) {
        self.append_records_total += records;
    }

    /// An election is timed from the moment no leader is known until one is.
    pub(super) fn on_role(&mut self, leader_known: bool, now: u64) {
        match (leader_known, self.election_started_ms) {
            (true, Some(started)) => {
                let latency = now.saturating_sub(started) as f64;
                self.elections_total += 1;
                self.election_latency_sum_ms += latency;
                self.election_latency_max_ms = self.election_latency_max_ms.max(latency);
                self.election_started_ms = None;
            }
            (false, None) => self.election_started_ms = Some(now),
            _ => {}
        }
    }
}

impl QuorumState {
    pub(super) fn status(&self, now: u64) -> QuorumStatus {
        let role = self.node.role();
        let described = self.node.describe(now);
        let replica = |r: crate::messages::ReplicaInfo| ReplicaStatus {
            id: r.id,
            log_end_offset: r.log_end_offset,
            last_fetch_ms_ago: r.last_fetch_ms_ago,
            last_caught_up_ms_ago: r.last_caught_up_ms_ago,
        };
        QuorumStatus {
            cluster_id: self.cluster_id.clone(),
            node_id: self.node_id,
            role: if role.is_voter {
                role.role.as_str().to_string()
            } else {
                "observer".to_string()
            },
            leader_id: role.leader_id,
            leader_epoch: role.epoch,
            high_watermark: self.node.high_watermark(),
            log_start_offset: self.node.log().start_offset(),
            log_end_offset: self.node.log().end_offset(),
            voters: described.voters.into_iter().map(replica).collect(),
            observers: described.observers.into_iter().map(replica).collect(),
        }
    }

    pub(super) fn metrics_snapshot(&self, now: u64) -> MetricsSnapshot {
        let role = self.node.role();
        let m = &self.metrics;
        MetricsSnapshot {
            current_state: role.role.metric_code(),
            current_leader: role.leader_id.unwrap_or(-1),
            current_epoch: role.epoch,
            high_watermark: self.node.high_watermark(),
            log_end_offset: self.node.log().end_offset(),
            append_records_total: m.append_records_total,
            fetch_records_total: m.fetch_records_total.load(Ordering::Relaxed),
            elections_total: m.elections_total,
            election_latency_avg_ms: if m.elections_total == 0 {
                0.0
            } else {
                m.election_latency_sum_ms / m.elections_total as f64
            },
            election_latency_max_ms: m.election_latency_max_ms,
            fetch_requests_total: m.fetch_requests_total,
            forwarded_requests_total: m.forwarded_requests_total,
            forwarded_appends_total: m.forwarded_appends_total,
            storage: self.appender.stats(),
            uptime_ms: now,
            ..MetricsSnapshot::default()
        }
    }
}
