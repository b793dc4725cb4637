//! The run's fingerprint: a 64-bit FNV-1a hash over every event and every
//! action in the order they happen, plus an optional human-readable trace
//! (printed live, or kept as the last lines for a failure report).

use std::collections::VecDeque;

use kraft::messages::{RaftRequest, RaftResponse};
use kraft::raft::Action;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

pub struct Trace {
    hash: u64,
    /// Print every line as it happens (`KRAFT_SIM_TRACE=1`).
    pub print: bool,
    /// Keep the last `keep` lines for a failure report (0 = none).
    keep: usize,
    lines: VecDeque<String>,
}

impl Trace {
    pub fn new(print: bool, keep: usize) -> Self {
        Trace {
            hash: FNV_OFFSET,
            print,
            keep,
            lines: VecDeque::new(),
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// True when lines are wanted; callers format only then.
    pub fn wants_lines(&self) -> bool {
        self.print || self.keep > 0
    }

    pub fn line(&mut self, line: String) {
        if self.print {
            println!("{line}");
        }
        if self.keep > 0 {
            if self.lines.len() == self.keep {
                self.lines.pop_front();
            }
            self.lines.push_back(line);
        }
    }

    pub fn tail(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }

    pub fn u64(&mut self, v: u64) {
        for byte in v.to_le_bytes() {
            self.hash ^= byte as u64;
            self.hash = self.hash.wrapping_mul(FNV_PRIME);
        }
    }

    pub fn i64(&mut self, v: i64) {
        self.u64(v as u64)
    }

    pub fn tag(&mut self, tag: u8) {
        self.hash ^= tag as u64;
        self.hash = self.hash.wrapping_mul(FNV_PRIME);
    }

    pub fn request(&mut self, request: &RaftRequest) {
        match request {
            RaftRequest::Vote(r) => {
                self.tag(1);
                self.i64(r.epoch as i64);
                self.i64(r.candidate_id as i64);
                self.i64(r.last_epoch as i64);
                self.i64(r.last_epoch_end_offset);
                self.tag(r.pre_vote as u8);
            }
            RaftRequest::BeginQuorumEpoch(r) => {
                self.tag(2);
                self.i64(r.epoch as i64);
                self.i64(r.leader_id as i64);
            }
            RaftRequest::EndQuorumEpoch(r) => {
                self.tag(3);
                self.i64(r.epoch as i64);
                self.i64(r.leader_id as i64);
                for s in &r.preferred_successors {
                    self.i64(*s as i64);
                }
            }
            RaftRequest::Fetch(r) => {
                self.tag(4);
                self.i64(r.replica_id as i64);
                self.i64(r.current_epoch as i64);
                self.i64(r.fetch_offset);
                self.i64(r.last_fetched_epoch as i64);
                self.u64(r.max_wait_ms);
                self.u64(r.max_bytes as u64);
            }
            RaftRequest::FetchSnapshot(r) => {
                self.tag(5);
                self.i64(r.snapshot_id.end_offset);
                self.u64(r.position);
            }
            RaftRequest::DescribeQuorum => self.tag(6),
            RaftRequest::Append(r) => {
                self.tag(7);
                self.u64(r.records.len() as u64);
            }
            RaftRequest::AppendMany(r) => {
                self.tag(8);
                self.u64(r.groups.len() as u64);
            }
            RaftRequest::Controller(bytes) => {
                self.tag(9);
                self.u64(bytes.len() as u64);
            }
            RaftRequest::ReadIndex => self.tag(10),
        }
    }

    pub fn response(&mut self, response: &RaftResponse) {
        match response {
            RaftResponse::Vote(r) => {
                self.tag(11);
                self.tag(r.error as u8);
                self.i64(r.epoch as i64);
                self.i64(r.leader_id.unwrap_or(-1) as i64);
                self.tag(r.vote_granted as u8);
                self.tag(r.pre_vote as u8);
            }
            RaftResponse::BeginQuorumEpoch(r) | RaftResponse::EndQuorumEpoch(r) => {
                self.tag(12);
                self.tag(r.error as u8);
                self.i64(r.epoch as i64);
                self.i64(r.leader_id.unwrap_or(-1) as i64);
            }
            RaftResponse::Fetch(r) => {
                self.tag(13);
                self.tag(r.error as u8);
                self.i64(r.epoch as i64);
                self.i64(r.leader_id.unwrap_or(-1) as i64);
                self.i64(r.high_watermark);
                if let Some(d) = r.diverging_epoch {
                    self.i64(d.epoch as i64);
                    self.i64(d.end_offset);
                }
                for b in &r.batches {
                    self.i64(b.base_offset);
                    self.u64(b.crc as u64);
                }
            }
            RaftResponse::FetchSnapshot(r) => {
                self.tag(14);
                self.i64(r.epoch as i64);
            }
            RaftResponse::DescribeQuorum(r) => {
                self.tag(15);
                self.i64(r.high_watermark);
            }
            RaftResponse::Append(_) => self.tag(16),
            RaftResponse::AppendMany(_) => self.tag(18),
            RaftResponse::Controller(_) => self.tag(19),
            RaftResponse::ReadIndex(_) => self.tag(20),
            RaftResponse::Error(e) => {
                self.tag(17);
                self.tag(*e as u8);
            }
        }
    }

    pub fn action(&mut self, node: i32, action: &Action) {
        self.i64(node as i64);
        match action {
            Action::PersistElection(s) => {
                self.tag(21);
                self.i64(s.epoch as i64);
                self.i64(s.voted_for.unwrap_or(-1) as i64);
                self.i64(s.leader_id.unwrap_or(-1) as i64);
            }
            Action::AppendBatch(b) => {
                self.tag(22);
                self.i64(b.base_offset);
                self.i64(b.epoch as i64);
                self.u64(b.crc as u64);
            }
            Action::Truncate { end_offset } => {
                self.tag(23);
                self.i64(*end_offset);
            }
            Action::Flush => self.tag(24),
            Action::Send {
                to,
                correlation_id,
                request,
                ..
            } => {
                self.tag(25);
                self.i64(*to as i64);
                self.u64(*correlation_id);
                self.request(request);
            }
            Action::Respond {
                to,
                request_id,
                response,
            } => {
                self.tag(26);
                self.i64(*to as i64);
                self.u64(*request_id);
                self.response(response);
            }
            Action::RespondFetch {
                to,
                request_id,
                response,
                read,
            } => {
                self.tag(27);
                self.i64(*to as i64);
                self.u64(*request_id);
                self.i64(response.high_watermark);
                if let Some(r) = read {
                    self.i64(r.from);
                    self.i64(r.until);
                }
            }
            Action::RespondFetchSnapshot {
                to,
                request_id,
                response,
                max_bytes,
            } => {
                self.tag(30);
                self.i64(*to as i64);
                self.u64(*request_id);
                self.i64(response.snapshot_id.end_offset);
                self.u64(response.position);
                self.u64(*max_bytes as u64);
            }
            Action::WriteSnapshotChunk {
                snapshot_id,
                position,
                bytes,
                ..
            } => {
                self.tag(31);
                self.i64(snapshot_id.end_offset);
                self.u64(*position);
                self.u64(bytes.len() as u64);
            }
            Action::InstallSnapshot(id) => {
                self.tag(32);
                self.i64(id.end_offset);
                self.i64(id.epoch as i64);
            }
            Action::HighWatermark(o) => {
                self.tag(28);
                self.i64(*o);
            }
            Action::RoleChanged(info) => {
                self.tag(29);
                self.tag(info.role.metric_code() as u8);
                self.i64(info.epoch as i64);
                self.i64(info.leader_id.unwrap_or(-1) as i64);
            }
        }
    }
}

/// A short one-line description of an action for the readable trace.
pub fn describe_action(action: &Action) -> String {
    match action {
        Action::PersistElection(s) => format!("persist {s:?}"),
        Action::AppendBatch(b) => {
            format!(
                "append [{}..{}) epoch {} crc {:08x}",
                b.base_offset,
                b.next_offset(),
                b.epoch,
                b.crc
            )
        }
        Action::Truncate { end_offset } => format!("truncate to {end_offset}"),
        Action::Flush => "flush".to_string(),
        Action::Send {
            to,
            correlation_id,
            request,
            ..
        } => {
            format!("send #{correlation_id} to {to}: {}", describe_request(request))
        }
        Action::Respond {
            to,
            request_id,
            response,
        } => {
            format!("respond r{request_id} to {to}: {}", describe_response(response))
        }
        Action::RespondFetch {
            to,
            request_id,
            response,
            read,
        } => format!(
            "respond-fetch r{request_id} to {to}: err {:?} epoch {} leader {:?} hw {} diverging {:?} read {:?}",
            response.error, response.epoch, response.leader_id, response.high_watermark, response.diverging_epoch, read
        ),
        Action::RespondFetchSnapshot {
            to,
            request_id,
            response,
            max_bytes,
        } => format!(
            "respond-fetch-snapshot r{request_id} to {to}: {:?} from {} max {max_bytes}",
            response.snapshot_id, response.position
        ),
        Action::WriteSnapshotChunk {
            snapshot_id,
            size,
            position,
            bytes,
        } => format!(
            "write snapshot {snapshot_id:?} [{position}, +{}) of {size}",
            bytes.len()
        ),
        Action::InstallSnapshot(id) => format!("install snapshot {id:?}"),
        Action::HighWatermark(o) => format!("high watermark {o}"),
        Action::RoleChanged(info) => format!(
            "role {} epoch {} leader {:?} voted {:?}",
            info.role.as_str(),
            info.epoch,
            info.leader_id,
            info.voted_for
        ),
    }
}

pub fn describe_request(request: &RaftRequest) -> String {
    match request {
        RaftRequest::Fetch(r) => format!(
            "Fetch(epoch {} offset {} last_epoch {} wait {})",
            r.current_epoch, r.fetch_offset, r.last_fetched_epoch, r.max_wait_ms
        ),
        other => format!("{other:?}"),
    }
}

pub fn describe_response(response: &RaftResponse) -> String {
    match response {
        RaftResponse::Fetch(r) => format!(
            "Fetch(err {:?} epoch {} leader {:?} hw {} diverging {:?} batches {:?})",
            r.error,
            r.epoch,
            r.leader_id,
            r.high_watermark,
            r.diverging_epoch,
            r.batches
                .iter()
                .map(|b| (b.base_offset, b.next_offset(), b.epoch))
                .collect::<Vec<_>>()
        ),
        other => format!("{other:?}"),
    }
}
