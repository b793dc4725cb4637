//! QuorumState: the actor shell around the pure engine [`RaftNode`]
//! (docs/ARCHITECTURE.md, "Actors and threads"; the contract is in the docs of [`crate::raft`]).
//!
//! Every message this actor handles follows the same three steps:
//!
//! 1. `node.tick(now)`: deadlines are compared on *every* message, not only
//!    when the timer fires, because an arbiter drains its mailbox before it
//!    runs `run_later` callbacks and a busy node would otherwise see its
//!    election or check-quorum deadline late;
//! 2. hand the message to the engine;
//! 3. carry out `take_actions()` strictly in order (`QuorumState::execute`).
//!    `PersistElection` holds the actor with `ctx.wait` until the storage
//!    thread reports the election state durable, and only then runs the
//!    actions after it: no other message interleaves, so a vote is never
//!    answered, nor a new role acted on, before it is on disk.
//!
//! Then the single timer is re-armed at `node.next_deadline_ms()`.
//!
//! One report skips step 1: the end of a snapshot install (which holds the
//! actor like `PersistElection`) reaches the engine before its timers, so
//! that the time spent installing is not taken for the leader's silence.
//!
//! Notifications to the FetchPurgatory, the MetadataListeners and the
//! RequestManager go through `post`: these actors run on this arbiter, so
//! checking that a mailbox is open and then pushing with `do_send` is exact
//! (nothing can close it in between) and keeps FIFO order, which `send`
//! does not once the sender is parked on a full mailbox. A closed mailbox of
//! one of these core actors is fatal for the node and is reported.
//!
//! The clock is milliseconds since the actor was created (monotonic).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use actix::fut::wrap_future;
use actix::prelude::*;
use futures::future::{ready, BoxFuture, FutureExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::actors::append_forwarder::{AppendForwarder, Forward};
use crate::actors::fetch_purgatory::{self, FetchPurgatory, HighWatermarkAdvanced, Register, RoleUpdate};
use crate::actors::log_appender::{LogAppender, ReadResult, StorageEvent};
use crate::actors::metadata_listeners::{CommittedUpTo, ListenersRoleUpdate, MetadataListeners};
use crate::messages::actor::{InboundRequest, RequestOutcome, SendRequest};
use crate::messages::records::{CommittedRecord, RecordPage};
use crate::messages::{
    AppendRequest, AppendResponse, Batch, ErrorCode, FetchResponse, RaftRequest, RaftResponse, Record,
};
use crate::raft::snapshot_policy::SnapshotPolicy;
use crate::raft::{Action, AppendRoute, NodeId, Offset, ProposeError, Proposed, RaftNode, RoleInfo, RoleKind};
use crate::storage::tail_cache::{TailCache, TAIL_CACHE_BYTES};
use crate::storage::StorageError;
use crate::types::{AppendError, AppendReply, Appended, MetricsSnapshot, NodeError, QuorumStatus, ReplicaStatus};

/// Longest the timer sleeps even when the engine has nothing due.
const MAX_TIMER_MS: u64 = 10_000;
/// Most inbound requests awaiting the engine's answer (parked fetches,
/// votes in flight); past it a request is refused with BrokerNotAvailable.
const MAX_INBOUND_PENDING: usize = 65_536;
/// How often answered-by-nobody entries (peer gone) are swept.
const INBOUND_SWEEP_INTERVAL_MS: u64 = 1_000;
/// How often the high-watermark hint is passed to the store.
const HW_HINT_INTERVAL_MS: u64 = 1_000;
/// Longest queue of client log reads on the storage thread.
const MAX_CLIENT_READS: usize = 32;
/// Most reads for Fetch and FetchSnapshot answers queued at once (on the
/// storage thread or the snapshot reader); past it a fetch is answered
/// with KAFKA_STORAGE_ERROR, which the fetcher retries after its backoff.
/// Every follower and observer has one fetch in flight; peers can send far
/// more (4 per connection, `transport::MAX_LOG_ANSWERS_PER_CONNECTION`, over
/// up to 1024 connections), and they must never fill the bounded queue the
/// log's own writes need (a write it refuses stops the node).
const MAX_FETCH_READS: usize = 1024;
/// Longest a graceful shutdown waits for its EndQuorumEpoch sends.
pub const SHUTDOWN_GRACE_MS: u64 = 1_000;
/// Most bytes one `read_committed` call reads.
const READ_COMMITTED_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Most records one `read_committed` call returns.
pub const READ_COMMITTED_MAX_RECORDS: usize = 10_000;

// ---------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------

/// Append one batch of data records; resolves when they commit (on a
/// follower: forwarded to the leader, whose answer is relayed).
#[derive(Message, Debug)]
#[rtype(result = "Result<Appended, AppendError>")]
pub struct Propose {
    pub records: Vec<Vec<u8>>,
}

/// Several [`Propose`]s in one message, proposed in order; each outcome
/// goes to its own reply as soon as it is known (one append's commit or
/// refusal never waits for another's). A message dropped unhandled (the
/// node stopped before taking it) answers every append Unavailable:
/// nothing of it was proposed.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ProposeMany {
    pub groups: Vec<(Vec<Vec<u8>>, AppendReply)>,
}

impl Drop for ProposeMany {
    fn drop(&mut self) {
        for (_, reply) in self.groups.drain(..) {
            let _ = reply.send(Err(AppendError::Unavailable(
                "the node stopped before taking the append".into(),
            )));
        }
    }
}

/// This node's view of the quorum.
#[derive(Message, Debug)]
#[rtype(result = "QuorumStatus")]
pub struct Describe;

/// Committed records from `from` (at most `max`).
#[derive(Message, Debug)]
#[rtype(result = "Result<RecordPage, NodeError>")]
pub struct ReadCommitted {
    pub from: Offset,
    pub max: usize,
}

/// The metrics this actor owns (commit latency comes from the purgatory).
#[derive(Message, Debug)]
#[rtype(result = "MetricsSnapshot")]
pub struct GetMetrics;

/// Write a snapshot now, at the committed and flushed end of the log.
#[derive(Message, Debug)]
#[rtype(result = "Result<SnapshotInfo, NodeError>")]
pub struct CreateSnapshot;

/// A snapshot this node holds (`POST /v1/snapshot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    pub end_offset: Offset,
    pub epoch: crate::raft::Epoch,
    pub size_bytes: u64,
    /// False when nothing was committed since the latest snapshot, which is
    /// returned instead.
    pub created: bool,
}

/// Graceful shutdown: a leader resigns (EndQuorumEpoch), then the actor
/// stops after at most [`SHUTDOWN_GRACE_MS`].
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Why the actor stopped; sent to whoever waits for it (the node's
/// supervisor task).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Shutdown,
    Fatal(String),
}

// ---------------------------------------------------------------------
// The actor
// ---------------------------------------------------------------------

/// Everything QuorumState talks to.
pub struct QuorumPeers {
    pub appender: LogAppender,
    pub storage_events: mpsc::UnboundedReceiver<StorageEvent>,
    pub requests: Recipient<SendRequest>,
    pub forwarder: Addr<AppendForwarder>,
    pub purgatory: Addr<FetchPurgatory>,
    pub listeners: Addr<MetadataListeners>,
    /// When to snapshot and compact, seeded with the snapshots found.
    pub snapshots: SnapshotPolicy,
    /// Told once, when the actor stops.
    pub on_stopped: oneshot::Sender<StopReason>,
}

#[derive(Default)]
struct Metrics {
    append_records_total: u64,
    /// Shared with the tasks that complete fetch reads.
    fetch_records_total: Arc<AtomicU64>,
    elections_total: u64,
    fetch_requests_total: u64,
    election_latency_sum_ms: f64,
    election_latency_max_ms: f64,
    /// Set while no leader is known.
    election_started_ms: Option<u64>,
}

/// A graceful shutdown in progress: it ends once every voter the resigning
/// leader sent EndQuorumEpoch to has answered (or failed) once, or after
/// [`SHUTDOWN_GRACE_MS`].
#[derive(Default)]
struct ShuttingDown {
    /// EndQuorumEpoch sends (correlation id → voter) not yet answered.
    end_quorum_sends: HashMap<u64, NodeId>,
    /// Voters that answered (or failed) once; the engine's retries to them
    /// are not waited for.
    answered: BTreeSet<NodeId>,
}

impl ShuttingDown {
    fn on_send(&mut self, correlation_id: u64, to: NodeId) {
        if !self.answered.contains(&to) {
            self.end_quorum_sends.insert(correlation_id, to);
        }
    }

    fn on_outcome(&mut self, correlation_id: u64) {
        if let Some(to) = self.end_quorum_sends.remove(&correlation_id) {
            self.answered.insert(to);
            self.end_quorum_sends.retain(|_, voter| *voter != to);
        }
    }

    fn done(&self) -> bool {
        self.end_quorum_sends.is_empty()
    }
}

pub struct QuorumState {
    node_id: NodeId,
    cluster_id: String,
    voters: BTreeMap<NodeId, String>,
    node: RaftNode,
    /// The origin of `now_ms`; the engine was created at `now_ms == 0`.
    started_at: Instant,
    appender: LogAppender,
    storage_events: Option<mpsc::UnboundedReceiver<StorageEvent>>,
    requests: Recipient<SendRequest>,
    forwarder: Addr<AppendForwarder>,
    purgatory: Addr<FetchPurgatory>,
    listeners: Addr<MetadataListeners>,
    /// Replies for the inbound requests handed to the engine, by request id.
    inbound: HashMap<u64, oneshot::Sender<RaftResponse>>,
    next_request_id: u64,
    last_sweep_ms: u64,
    /// The armed timer: (deadline, handle).
    timer: Option<(u64, SpawnHandle)>,
    /// Storage events held back while a `PersistElection` is pending.
    deferred: VecDeque<StorageEvent>,
    /// Client reads (`GET /v1/log`) queued on the storage thread. Bounded,
    /// so clients can never fill the queue the log's own writes need.
    client_reads: usize,
    /// Reads for fetch answers queued and not yet answered (at most
    /// [`MAX_FETCH_READS`]); shared with the tasks that complete them.
    fetch_reads: Arc<AtomicUsize>,
    /// The high watermark of the last *executed* HighWatermark action: the
    /// appends it covers were queued to storage before it.
    executed_high_watermark: Offset,
    last_hint: Offset,
    last_hint_ms: u64,
    shutting_down: Option<ShuttingDown>,
    stop_reason: Option<StopReason>,
    on_stopped: Option<oneshot::Sender<StopReason>>,
    metrics: Metrics,
    snapshots: SnapshotPolicy,
    /// A snapshot is being written (one at a time).
    snapshotting: bool,
    /// The newest batches sent to storage, for fetch reads at the log end.
    tail: TailCache,
    /// A fetched snapshot chunk is on its way to the file: the next
    /// FetchSnapshot answer waits in `held_chunk_answer` until it is.
    chunk_unwritten: bool,
    /// A FetchSnapshot answer held back while the last chunk is written.
    held_chunk_answer: Option<RequestOutcome>,
}

impl QuorumState {
    /// `node` must have been created with `now_ms == 0` just before.
    pub fn new(cluster_id: String, node: RaftNode, peers: QuorumPeers) -> Self {
        let config = node.config().clone();
        let log_start = node.log().start_offset();
        QuorumState {
            node_id: config.node_id,
            cluster_id,
            voters: config.voters,
            node,
            started_at: Instant::now(),
            appender: peers.appender,
            storage_events: Some(peers.storage_events),
            requests: peers.requests,
            forwarder: peers.forwarder,
            purgatory: peers.purgatory,
            listeners: peers.listeners,
            inbound: HashMap::new(),
            next_request_id: 1,
            last_sweep_ms: 0,
            timer: None,
            deferred: VecDeque::new(),
            client_reads: 0,
            fetch_reads: Arc::new(AtomicUsize::new(0)),
            executed_high_watermark: log_start,
            last_hint: log_start,
            last_hint_ms: 0,
            shutting_down: None,
            stop_reason: None,
            on_stopped: Some(peers.on_stopped),
            snapshots: peers.snapshots,
            snapshotting: false,
            tail: TailCache::new(TAIL_CACHE_BYTES),
            chunk_unwritten: false,
            held_chunk_answer: None,
            metrics: Metrics {
                election_started_ms: Some(0),
                ..Metrics::default()
            },
        }
    }

    fn now_ms(&self) -> u64 {
        self.started_at.elapsed().as_millis() as u64
    }

    /// Step 1 of every message: advance the engine's timers.
    fn tick(&mut self) -> u64 {
        let now = self.now_ms();
        self.node.tick(now);
        now
    }

    fn is_stopping(&self) -> bool {
        self.stop_reason.is_some()
    }

    /// Stops the node loudly.
    fn fatal(&mut self, ctx: &mut Context<Self>, reason: String) {
        error!(node_id = self.node_id, "FATAL: {reason}; the node stops");
        self.stop(ctx, StopReason::Fatal(reason));
    }

    fn stop(&mut self, ctx: &mut Context<Self>, reason: StopReason) {
        if self.stop_reason.is_none() {
            self.stop_reason = Some(reason);
        }
        ctx.stop();
    }

    /// Step 3: carries out everything the engine asked for, in order.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        if self.is_stopping() {
            return;
        }
        let actions = self.node.take_actions();
        self.execute(actions.into_iter(), ctx);
    }

    fn execute(&mut self, mut actions: std::vec::IntoIter<Action>, ctx: &mut Context<Self>) {
        while let Some(action) = actions.next() {
            if self.is_stopping() {
                return;
            }
            match action {
                Action::PersistElection(state) => {
                    let durable = match self.appender.write_election(state.clone()) {
                        Ok(durable) => durable,
                        Err(e) => return self.fatal(ctx, format!("cannot persist election state {state:?}: {e}")),
                    };
                    // Hold the actor until the state is durable; the rest of
                    // the actions run after it, with nothing in between.
                    ctx.wait(
                        wrap_future::<_, Self>(durable).map(move |result, act, ctx| match result {
                            Ok(()) => {
                                act.execute(actions, ctx);
                                act.run_deferred(ctx);
                            }
                            Err(_) => act.fatal(ctx, format!("election state {state:?} was not made durable")),
                        }),
                    );
                    return;
                }
                Action::AppendBatch(batch) => {
                    self.metrics.append_records_total += batch.record_count as u64;
                    let data = batch.holds_data();
                    self.snapshots
                        .on_appended(batch.size_bytes(), batch.next_offset(), data);
                    // Only a leader answers fetches: elsewhere the copy
                    // would be wasted, and dropping the cache keeps it a
                    // contiguous mirror of the log's end (or empty).
                    if self.node.role().role == RoleKind::Leader {
                        self.tail.on_append(&batch);
                    } else {
                        self.tail.clear();
                    }
                    if let Err(e) = self.appender.append(batch) {
                        return self.fatal(ctx, format!("cannot queue an append: {e}"));
                    }
                }
                Action::Truncate { end_offset } => {
                    self.tail.on_truncate(end_offset);
                    if let Err(e) = self.appender.truncate(end_offset) {
                        return self.fatal(ctx, format!("cannot queue a truncation: {e}"));
                    }
                }
                Action::Flush => {
                    if let Err(e) = self.appender.flush() {
                        return self.fatal(ctx, format!("cannot queue a flush: {e}"));
                    }
                }
                Action::Send {
                    to,
                    correlation_id,
                    request,
                } => {
                    if let (Some(shutdown), RaftRequest::EndQuorumEpoch(_)) = (&mut self.shutting_down, &request) {
                        shutdown.on_send(correlation_id, to);
                    }
                    if let Err(e) = post(
                        &self.requests,
                        SendRequest {
                            to,
                            correlation_id,
                            request,
                        },
                    ) {
                        return self.fatal(ctx, format!("request manager: {e}"));
                    }
                }
                Action::Respond {
                    request_id, response, ..
                } => match self.inbound.remove(&request_id) {
                    // A closed reply means the peer went away: nothing to do.
                    Some(reply) => drop(reply.send(response)),
                    None => debug!(request_id, "response for a request that is no longer waiting"),
                },
                Action::RespondFetch {
                    request_id,
                    mut response,
                    read,
                    ..
                } => {
                    let Some(reply) = self.inbound.remove(&request_id) else {
                        debug!(request_id, "fetch response for a request that is no longer waiting");
                        continue;
                    };
                    let Some(range) = read else {
                        let _ = reply.send(RaftResponse::Fetch(response));
                        continue;
                    };
                    if let Some(batches) = self.tail.read(range.from, range.until, range.max_bytes) {
                        let records: u64 = batches.iter().map(|b| b.record_count as u64).sum();
                        self.metrics.fetch_records_total.fetch_add(records, Ordering::Relaxed);
                        let _ = reply.send(RaftResponse::Fetch(complete_fetch(response, Ok(batches))));
                        continue;
                    }
                    let Some(queued) = FetchRead::start(&self.fetch_reads, request_id) else {
                        response.error = ErrorCode::KafkaStorageError;
                        let _ = reply.send(RaftResponse::Fetch(response));
                        continue;
                    };
                    // The read is queued behind every append sent so far and
                    // answered without waiting for a flush (the leader may
                    // ship records before its own fsync; it counts itself
                    // toward the high watermark only after it).
                    let batches = match self.appender.read(range.from, range.until, range.max_bytes) {
                        Ok(batches) => batches,
                        Err(e) => return self.fatal(ctx, format!("cannot queue a fetch read: {e}")),
                    };
                    let fetched = self.metrics.fetch_records_total.clone();
                    actix::spawn(async move {
                        // A dropped reply means the storage thread failed; it
                        // reported that itself and the node is stopping.
                        let read = batches.await;
                        drop(queued);
                        if let Ok(read) = read {
                            let response = complete_fetch(response, read);
                            let records: u64 = response.batches.iter().map(|b| b.record_count as u64).sum();
                            fetched.fetch_add(records, Ordering::Relaxed);
                            let _ = reply.send(RaftResponse::Fetch(response));
                        }
                    });
                }
                Action::RespondFetchSnapshot {
                    request_id,
                    mut response,
                    max_bytes,
                    ..
                } => {
                    let Some(reply) = self.inbound.remove(&request_id) else {
                        continue;
                    };
                    let Some(queued) = FetchRead::start(&self.fetch_reads, request_id) else {
                        response.error = ErrorCode::KafkaStorageError;
                        let _ = reply.send(RaftResponse::FetchSnapshot(response));
                        continue;
                    };
                    let chunk = self
                        .appender
                        .read_snapshot_chunk(response.snapshot_id, response.position, max_bytes);
                    let chunk = match chunk {
                        Ok(chunk) => chunk,
                        Err(e) => return self.fatal(ctx, format!("cannot queue a snapshot read: {e}")),
                    };
                    actix::spawn(async move {
                        let chunk = chunk.await;
                        drop(queued);
                        match chunk {
                            Ok(Ok(chunk)) => {
                                response.size = chunk.size;
                                response.bytes = chunk.bytes;
                            }
                            Ok(Err(e)) => {
                                warn!(id = ?response.snapshot_id, "cannot serve the snapshot: {e}");
                                response.error = ErrorCode::SnapshotNotFound;
                            }
                            // The thread reading it stopped: the next read
                            // is refused, and that stops the node.
                            Err(_) => return,
                        }
                        let _ = reply.send(RaftResponse::FetchSnapshot(response));
                    });
                }
                Action::WriteSnapshotChunk {
                    snapshot_id,
                    size,
                    position,
                    bytes,
                } => {
                    let written = match self.appender.write_snapshot_chunk(snapshot_id, size, position, bytes) {
                        Ok(written) => written,
                        Err(e) => return self.fatal(ctx, format!("cannot queue a snapshot chunk: {e}")),
                    };
                    // The engine asks for the next chunk at once; its answer
                    // reaches the engine only once this one is in the file.
                    // Without that, a disk slower than loopback queued the
                    // snapshot at the storage thread (a joining observer's
                    // RSS peaked anywhere from 24 to 102 MiB with a 107 MiB
                    // snapshot). At most the chunk being written and the
                    // next answer are held, and every other message is
                    // handled meanwhile.
                    self.chunk_unwritten = true;
                    ctx.spawn(wrap_future::<_, Self>(written).map(|_, act, ctx| {
                        act.chunk_unwritten = false;
                        if let Some(held) = act.held_chunk_answer.take() {
                            let now = act.tick();
                            act.deliver_outcome(now, held);
                            act.drive(ctx);
                        }
                    }));
                }
                Action::InstallSnapshot(id) => {
                    self.tail.clear();
                    let installed = match self.appender.install_snapshot(id) {
                        Ok(installed) => installed,
                        Err(e) => return self.fatal(ctx, format!("cannot queue the install of snapshot {id:?}: {e}")),
                    };
                    // Like PersistElection: nothing else reaches the engine
                    // until the log has been replaced.
                    ctx.wait(wrap_future::<_, Self>(installed).map(move |result, act, ctx| {
                        // The engine hears of the install before its timers
                        // run: polled first, a follower whose install took
                        // longer than the fetch timeout would give up on its
                        // leader for time spent on its own disk. Both calls
                        // below advance the clock and poll.
                        let now = act.now_ms();
                        match result {
                            Ok(Ok(meta)) => {
                                info!(?id, size_bytes = meta.size_bytes, "installed the leader's snapshot");
                                if let Err(e) = act.node.on_snapshot_installed(now, id) {
                                    // The store replaced its log; the engine
                                    // kept its view of the old one. A restart
                                    // reconciles the log with the snapshot.
                                    return act.fatal(ctx, format!("the log was replaced by an install, but {e}"));
                                }
                                act.snapshots.on_created(id, meta.size_bytes, now);
                            }
                            Ok(Err(e)) => {
                                warn!(?id, "the fetched snapshot could not be installed: {e}");
                                // Nothing changed on disk; an unexpected report
                                // is logged by the engine and changes nothing.
                                let _ = act.node.on_snapshot_install_failed(now, id);
                            }
                            Err(_) => return act.fatal(ctx, format!("the install of snapshot {id:?} was lost")),
                        }
                        act.execute(actions, ctx);
                        act.run_deferred(ctx);
                        act.drive(ctx);
                    }));
                    return;
                }
                Action::HighWatermark(hw) => {
                    self.executed_high_watermark = self.executed_high_watermark.max(hw);
                    if let Err(e) = post(&self.purgatory, HighWatermarkAdvanced(hw)) {
                        return self.fatal(ctx, format!("fetch purgatory: {e}"));
                    }
                    if let Err(e) = post(&self.listeners, CommittedUpTo(hw)) {
                        return self.fatal(ctx, format!("metadata listeners: {e}"));
                    }
                    self.maybe_pass_high_watermark_hint(false);
                }
                Action::RoleChanged(info) => {
                    if let Err(e) = self.on_role_changed(info) {
                        return self.fatal(ctx, e);
                    }
                }
            }
        }
        self.after_actions(ctx);
    }

    fn on_role_changed(&mut self, info: RoleInfo) -> Result<(), String> {
        let role = if info.is_voter { info.role.as_str() } else { "observer" };
        info!(
            node_id = self.node_id,
            role,
            epoch = info.epoch,
            leader = ?info.leader_id,
            "role changed: {role} in epoch {}, leader {:?}",
            info.epoch,
            info.leader_id
        );
        let now = self.now_ms();
        let leader_known = info.leader_id.is_some() && info.role != RoleKind::Resigned;
        match (leader_known, self.metrics.election_started_ms) {
            (true, Some(started)) => {
                let latency = now.saturating_sub(started) as f64;
                self.metrics.elections_total += 1;
                self.metrics.election_latency_sum_ms += latency;
                self.metrics.election_latency_max_ms = self.metrics.election_latency_max_ms.max(latency);
                self.metrics.election_started_ms = None;
            }
            (false, None) => self.metrics.election_started_ms = Some(now),
            _ => {}
        }
        post(&self.purgatory, RoleUpdate(info.clone())).map_err(|e| format!("fetch purgatory: {e}"))?;
        post(&self.listeners, ListenersRoleUpdate(info)).map_err(|e| format!("metadata listeners: {e}"))?;
        Ok(())
    }

    /// Tells the store, now and then, which prefix is committed *and*
    /// durable here (never ahead of the local flush).
    fn maybe_pass_high_watermark_hint(&mut self, force: bool) {
        let now = self.now_ms();
        if !force && now.saturating_sub(self.last_hint_ms) < HW_HINT_INTERVAL_MS {
            return;
        }
        let hint = self.executed_high_watermark.min(self.node.log().flushed_end());
        if hint > self.last_hint {
            // A failure here means the storage thread is gone, which it
            // reports itself.
            if self.appender.set_high_watermark_hint(hint).is_ok() {
                self.last_hint = hint;
                self.last_hint_ms = now;
            }
        }
    }

    /// After the last action: re-arm the timer, sweep, maybe finish a
    /// shutdown.
    fn after_actions(&mut self, ctx: &mut Context<Self>) {
        if self.is_stopping() {
            return;
        }
        let now = self.now_ms();
        if now.saturating_sub(self.last_sweep_ms) >= INBOUND_SWEEP_INTERVAL_MS {
            self.last_sweep_ms = now;
            self.inbound.retain(|_, reply| !reply.is_closed());
        }
        if self.shutting_down.as_ref().is_some_and(ShuttingDown::done) {
            return self.stop(ctx, StopReason::Shutdown);
        }
        if self.shutting_down.is_none() && !ctx.waiting() {
            if self.snapshots.snapshot_due(now, self.snapshot_end()) {
                let _ = self.write_snapshot(ctx);
            }
            self.maybe_compact(now, ctx);
        }
        self.rearm_timer(ctx);
    }

    /// The committed prefix that is also flushed here: what a snapshot may
    /// hold and the log may be compacted below.
    fn snapshot_end(&self) -> Offset {
        SnapshotPolicy::committed_flushed_end(self.executed_high_watermark, self.node.log())
    }

    /// Starts writing a snapshot at the engine's snapshot point
    /// ([`SnapshotPolicy::snapshot_point`]); the receiver gets it once it
    /// is durable. None when one is being written already or nothing is
    /// newer than the latest.
    fn write_snapshot(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> Option<oneshot::Receiver<Result<SnapshotInfo, StorageError>>> {
        if self.snapshotting {
            return None;
        }
        let id = self
            .snapshots
            .snapshot_point(self.executed_high_watermark, self.node.log())?;
        let created = match self.appender.create_snapshot(id, self.snapshots.latest()) {
            Ok(created) => created,
            Err(e) => {
                warn!(?id, "cannot queue a snapshot: {e}");
                return None;
            }
        };
        self.snapshotting = true;
        let (tx, rx) = oneshot::channel();
        ctx.spawn(wrap_future::<_, Self>(created).map(move |result, act, ctx| {
            act.snapshotting = false;
            let now = act.tick();
            let outcome = match result {
                Ok(Ok(meta)) => {
                    info!(?id, size_bytes = meta.size_bytes, "snapshot written");
                    act.snapshots.on_created(id, meta.size_bytes, now);
                    act.node.on_snapshot_created(now, id);
                    act.drive(ctx);
                    Ok(SnapshotInfo {
                        end_offset: id.end_offset,
                        epoch: id.epoch,
                        size_bytes: meta.size_bytes,
                        created: true,
                    })
                }
                Ok(Err(e)) => {
                    warn!(?id, "writing a snapshot failed: {e}");
                    Err(e)
                }
                Err(_) => Err(StorageError::Abandoned(id)),
            };
            let _ = tx.send(outcome);
        }));
        Some(rx)
    }

    /// Runs the cleaner's decision. The engine's log start moves first (so
    /// nothing below it is read again); on disk the older snapshot files go
    /// before the log below the newest one, so that the earliest snapshot
    /// never ends below the log start (Kafka's invariant).
    fn maybe_compact(&mut self, now: u64, ctx: &mut Context<Self>) {
        if self.snapshotting {
            return;
        }
        let log_start = self.node.log().start_offset();
        let compactable_end = self.snapshot_end();
        let Some(compaction) = self.snapshots.compaction(now, log_start, compactable_end) else {
            return;
        };
        for id in compaction.delete {
            let _ = self.appender.delete_snapshot(id);
        }
        let start = compaction.start;
        if start.end_offset > log_start {
            info!(
                log_start_offset = start.end_offset,
                "compacting the log below the newest snapshot"
            );
            self.node.on_log_start_advanced(now, start.end_offset, start.epoch);
            if let Err(e) = self.appender.delete_before(start) {
                return self.fatal(ctx, format!("cannot queue a compaction: {e}"));
            }
        }
        self.drive(ctx);
    }

    fn rearm_timer(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let deadline = self.node.next_deadline_ms().clamp(now + 1, now + MAX_TIMER_MS);
        if let Some((armed, handle)) = self.timer {
            if armed == deadline {
                return;
            }
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(Duration::from_millis(deadline - now), |act, ctx| {
            act.timer = None;
            if ctx.waiting() {
                // actix runs timers even while `ctx.wait` holds the mailbox;
                // the wait's continuation re-arms the timer.
                return;
            }
            act.tick();
            act.drive(ctx);
        });
        self.timer = Some((deadline, handle));
    }

    /// Registers an accepted proposal with the purgatory.
    fn register(&mut self, proposed: Proposed, complete: fetch_purgatory::Completion) -> Result<(), String> {
        post(&self.purgatory, Register { proposed, complete }).map_err(|e| format!("fetch purgatory: {e}"))
    }

    /// Refuses new appends while shutting down; every other bound is the
    /// engine's (`raft::admission`).
    fn refuse_if_stopping(&self) -> Result<(), AppendError> {
        if self.shutting_down.is_some() || self.is_stopping() {
            return Err(AppendError::Unavailable("the node is shutting down".into()));
        }
        Ok(())
    }

    /// The client's view of a refusal: nothing was written.
    fn refusal(&self, e: ProposeError) -> AppendError {
        match e {
            ProposeError::NotLeader { leader_id, .. } => AppendError::NotLeader {
                leader_id,
                leader_endpoint: self.leader_endpoint(leader_id),
            },
            ProposeError::DiskBehind { .. } | ProposeError::CommitBehind { .. } => {
                AppendError::Unavailable(e.to_string())
            }
            e => AppendError::Rejected(e.to_string()),
        }
    }

    fn leader_endpoint(&self, leader: Option<NodeId>) -> Option<String> {
        leader.and_then(|id| self.voters.get(&id).cloned())
    }

    /// A local append: proposed here on the leader, forwarded to the leader
    /// from anywhere else.
    fn propose_local(
        &mut self,
        now: u64,
        records: Vec<Vec<u8>>,
        ctx: &mut Context<Self>,
    ) -> BoxFuture<'static, Result<Appended, AppendError>> {
        let (reply, outcome) = oneshot::channel();
        self.propose_each(now, vec![(records, reply)], ctx);
        async move {
            outcome.await.unwrap_or_else(|_| {
                Err(AppendError::OutcomeUnknown(
                    "the node stopped before the records committed".into(),
                ))
            })
        }
        .boxed()
    }

    /// Local appends, each with its own reply, proposed in order: on the
    /// leader all of them join the accumulator before it drains (one batch
    /// for a whole hand-over of HTTP requests); anywhere else each goes
    /// where the engine routes it ([`RaftNode::route_append`]). A reply
    /// dropped unanswered means the node stopped: the outcome is unknown.
    fn propose_each(&mut self, now: u64, groups: Vec<(Vec<Vec<u8>>, AppendReply)>, ctx: &mut Context<Self>) {
        let mut accepted = Vec::with_capacity(groups.len());
        for (records, reply) in groups {
            if let Err(e) = self.refuse_if_stopping() {
                let _ = reply.send(Err(e));
                continue;
            }
            match self.node.route_append(&records) {
                AppendRoute::Propose => {
                    accepted.push((records.into_iter().map(Record::Data).collect::<Vec<_>>(), reply))
                }
                AppendRoute::Forward(leader_id) => self.forward(leader_id, records, reply),
                AppendRoute::Refuse(e) => drop(reply.send(Err(self.refusal(e)))),
            }
        }
        if accepted.is_empty() {
            return;
        }
        let (proposals, replies): (Vec<_>, Vec<_>) = accepted.into_iter().unzip();
        let outcomes = self.node.propose_many(now, proposals);
        for (outcome, reply) in outcomes.into_iter().zip(replies) {
            match outcome {
                Ok(proposed) => {
                    if let Err(e) = self.register(proposed, Box::new(move |result| drop(reply.send(result)))) {
                        return self.fatal(ctx, e);
                    }
                }
                Err(e) => drop(reply.send(Err(self.refusal(e)))),
            }
        }
    }

    /// A local append on a node that does not lead, relayed to the leader.
    fn forward(&mut self, leader_id: NodeId, records: Vec<Vec<u8>>, reply: AppendReply) {
        let forwarded = self.forwarder.send(Forward { leader_id, records });
        actix::spawn(async move {
            let outcome = forwarded
                .await
                .unwrap_or_else(|_| Err(AppendError::Unavailable("the append forwarder stopped".into())));
            // A closed reply: the client went away; the outcome stands.
            let _ = reply.send(outcome);
        });
    }

    /// A follower forwarded a client's append (`RaftRequest::Append`): not
    /// for the engine. Proposed on the leader and answered at commit.
    fn handle_forwarded_append(
        &mut self,
        now: u64,
        request: AppendRequest,
        reply: oneshot::Sender<RaftResponse>,
        ctx: &mut Context<Self>,
    ) {
        let answer = |response: AppendResponse| RaftResponse::Append(response);
        if let Err(e) = self.refuse_if_stopping() {
            debug!("refusing a forwarded append: {e}");
            let _ = reply.send(answer(AppendResponse::NotLeader { leader_id: None }));
            return;
        }
        // Before the role: a node whose disk is behind says so, leader or
        // not, so the follower that forwarded it answers Unavailable.
        if let Err(e) = self.node.admit() {
            let _ = reply.send(answer(AppendResponse::Unavailable { reason: e.to_string() }));
            return;
        }
        let records = request
            .records
            .into_iter()
            .map(|bytes| Record::Data(bytes.into_vec()))
            .collect();
        match self.node.propose(now, records) {
            Ok(proposed) => {
                let complete = Box::new(move |result: Result<Appended, AppendError>| {
                    let response = match result {
                        Ok(a) => AppendResponse::Committed {
                            base_offset: a.base_offset,
                            last_offset: a.last_offset,
                            epoch: a.epoch,
                        },
                        // The records were accepted: whatever went wrong
                        // after that leaves their fate open.
                        Err(AppendError::OutcomeUnknown(reason)) | Err(AppendError::Unavailable(reason)) => {
                            AppendResponse::OutcomeUnknown { reason }
                        }
                        Err(AppendError::Rejected(reason)) => AppendResponse::Rejected { reason },
                        Err(AppendError::NotLeader { leader_id, .. }) => AppendResponse::NotLeader { leader_id },
                    };
                    let _ = reply.send(answer(response));
                });
                if let Err(e) = self.register(proposed, complete) {
                    self.fatal(ctx, e);
                }
            }
            Err(ProposeError::NotLeader { leader_id, .. }) => {
                let _ = reply.send(answer(AppendResponse::NotLeader { leader_id }));
            }
            Err(e @ (ProposeError::DiskBehind { .. } | ProposeError::CommitBehind { .. })) => {
                let _ = reply.send(answer(AppendResponse::Unavailable { reason: e.to_string() }));
            }
            Err(e) => {
                let _ = reply.send(answer(AppendResponse::Rejected { reason: e.to_string() }));
            }
        }
    }

    fn status(&self, now: u64) -> QuorumStatus {
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

    fn metrics_snapshot(&self, now: u64) -> MetricsSnapshot {
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
            storage: self.appender.stats(),
            uptime_ms: now,
            ..MetricsSnapshot::default()
        }
    }
}

/// Pushes `msg` to an actor on this arbiter in FIFO order, or reports that
/// its mailbox is closed (see the module docs for why not `send`).
fn post<M, R>(to: &R, msg: M) -> Result<(), String>
where
    R: Postable<M>,
{
    if !to.is_connected() {
        return Err("mailbox closed".to_string());
    }
    to.push(msg);
    Ok(())
}

/// `Addr` and `Recipient` alike, for [`post`].
trait Postable<M> {
    fn is_connected(&self) -> bool;
    fn push(&self, msg: M);
}

impl<A, M> Postable<M> for Addr<A>
where
    A: Actor<Context = Context<A>> + Handler<M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn is_connected(&self) -> bool {
        self.connected()
    }
    fn push(&self, msg: M) {
        self.do_send(msg)
    }
}

impl<M> Postable<M> for Recipient<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn is_connected(&self) -> bool {
        self.connected()
    }
    fn push(&self, msg: M) {
        self.do_send(msg)
    }
}

impl Actor for QuorumState {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Peers and the embedding application use `send`; a roomier mailbox
        // keeps them from parking under bursts.
        ctx.set_mailbox_capacity(1024);
        if let Some(events) = self.storage_events.take() {
            let mut events = events;
            ctx.add_stream(futures::stream::poll_fn(move |cx| events.poll_recv(cx)));
        }
        // The engine has acted in `new`: it announced its starting role (and
        // a single voter has elected itself). Carry that out first.
        self.tick();
        self.drive(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Peers waiting on us are told we are gone rather than left to time out.
        for (_, reply) in self.inbound.drain() {
            let _ = reply.send(RaftResponse::Error(ErrorCode::BrokerNotAvailable));
        }
        if !matches!(self.stop_reason, Some(StopReason::Fatal(_))) {
            self.maybe_pass_high_watermark_hint(true);
            // Whatever was written becomes durable before the thread stops
            // (the supervisor's shutdown of the storage thread flushes too).
            let _ = self.appender.flush();
        }
        let reason = self.stop_reason.clone().unwrap_or(StopReason::Shutdown);
        info!(node_id = self.node_id, ?reason, "quorum state stopped");
        if let Some(on_stopped) = self.on_stopped.take() {
            let _ = on_stopped.send(reason);
        }
    }
}

impl QuorumState {
    /// Storage events that arrived while a `PersistElection` held the actor,
    /// handled once it is durable and the actions after it have run.
    fn run_deferred(&mut self, ctx: &mut Context<Self>) {
        while !ctx.waiting() {
            let Some(event) = self.deferred.pop_front() else { break };
            self.on_storage_event(event, ctx);
        }
    }

    fn on_storage_event(&mut self, event: StorageEvent, ctx: &mut Context<Self>) {
        match event {
            // The engine knows which truncations the flush cannot vouch for.
            StorageEvent::Flushed { durable_end, .. } => {
                let now = self.tick();
                self.node.on_flushed(now, durable_end);
                self.drive(ctx);
            }
            StorageEvent::Failed(reason) => self.fatal(ctx, reason),
        }
    }
}

impl StreamHandler<StorageEvent> for QuorumState {
    fn handle(&mut self, event: StorageEvent, ctx: &mut Self::Context) {
        // actix polls streams even while `ctx.wait` holds the mailbox; an
        // event handled now would run engine actions ahead of the held ones
        // (before the election state they follow is durable).
        if ctx.waiting() || !self.deferred.is_empty() {
            self.deferred.push_back(event);
            return;
        }
        self.on_storage_event(event, ctx);
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        if !self.is_stopping() {
            self.fatal(ctx, "the storage thread exited".to_string());
        }
    }
}

impl Handler<InboundRequest> for QuorumState {
    type Result = ();

    fn handle(&mut self, msg: InboundRequest, ctx: &mut Self::Context) {
        let now = self.tick();
        match msg.request {
            RaftRequest::Append(request) => self.handle_forwarded_append(now, request, msg.reply, ctx),
            request => {
                if self.inbound.len() >= MAX_INBOUND_PENDING {
                    warn!(
                        from = msg.from,
                        api = request.api_name(),
                        "too many requests waiting; refused"
                    );
                    let _ = msg.reply.send(RaftResponse::Error(ErrorCode::BrokerNotAvailable));
                } else {
                    if let RaftRequest::Fetch(_) = request {
                        self.metrics.fetch_requests_total += 1;
                    }
                    let request_id = self.next_request_id;
                    self.next_request_id += 1;
                    self.inbound.insert(request_id, msg.reply);
                    self.node.handle_request(now, msg.from, request_id, request);
                }
            }
        }
        self.drive(ctx);
    }
}

impl Handler<RequestOutcome> for QuorumState {
    type Result = ();

    fn handle(&mut self, msg: RequestOutcome, ctx: &mut Self::Context) {
        let now = self.tick();
        if let Some(shutdown) = &mut self.shutting_down {
            shutdown.on_outcome(msg.correlation_id);
        }
        if self.chunk_unwritten && matches!(msg.result, Ok(RaftResponse::FetchSnapshot(_))) {
            // Handed to the engine once the last chunk is in the file (see
            // `Action::WriteSnapshotChunk`). A newer answer replaces an
            // older one: the engine has given up on that request.
            self.held_chunk_answer = Some(msg);
            return;
        }
        self.deliver_outcome(now, msg);
        self.drive(ctx);
    }
}

impl QuorumState {
    /// Hands the outcome of an outbound request to the engine.
    fn deliver_outcome(&mut self, now: u64, msg: RequestOutcome) {
        match msg.result {
            Ok(response) => self.node.handle_response(now, msg.from, msg.correlation_id, response),
            Err(e) => {
                debug!(
                    to = msg.from,
                    correlation_id = msg.correlation_id,
                    "request failed: {e}"
                );
                self.node.handle_request_failed(now, msg.from, msg.correlation_id);
            }
        }
    }
}

impl Handler<Propose> for QuorumState {
    type Result = ResponseFuture<Result<Appended, AppendError>>;

    fn handle(&mut self, msg: Propose, ctx: &mut Self::Context) -> Self::Result {
        let now = self.tick();
        let outcome = self.propose_local(now, msg.records, ctx);
        self.drive(ctx);
        Box::pin(outcome)
    }
}

impl Handler<ProposeMany> for QuorumState {
    type Result = ();

    fn handle(&mut self, mut msg: ProposeMany, ctx: &mut Self::Context) {
        let now = self.tick();
        self.propose_each(now, std::mem::take(&mut msg.groups), ctx);
        self.drive(ctx);
    }
}

impl Handler<Describe> for QuorumState {
    type Result = MessageResult<Describe>;

    fn handle(&mut self, _msg: Describe, ctx: &mut Self::Context) -> Self::Result {
        let now = self.tick();
        self.drive(ctx);
        MessageResult(self.status(now))
    }
}

impl Handler<GetMetrics> for QuorumState {
    type Result = MessageResult<GetMetrics>;

    fn handle(&mut self, _msg: GetMetrics, ctx: &mut Self::Context) -> Self::Result {
        let now = self.tick();
        self.drive(ctx);
        MessageResult(self.metrics_snapshot(now))
    }
}

impl Handler<CreateSnapshot> for QuorumState {
    type Result = ResponseFuture<Result<SnapshotInfo, NodeError>>;

    fn handle(&mut self, _msg: CreateSnapshot, ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        self.drive(ctx);
        if let Some(created) = self.write_snapshot(ctx) {
            return Box::pin(async move {
                match created.await {
                    Ok(result) => result.map_err(|e| NodeError(e.to_string())),
                    Err(_) => Err(NodeError("the node stopped while writing the snapshot".to_string())),
                }
            });
        }
        let answer = if self.snapshotting {
            Err(NodeError("a snapshot is being written; try again".to_string()))
        } else {
            match self.snapshots.latest_held() {
                Some(held) => Ok(SnapshotInfo {
                    end_offset: held.id.end_offset,
                    epoch: held.id.epoch,
                    size_bytes: held.size_bytes,
                    created: false,
                }),
                None => Err(NodeError("nothing is committed yet".to_string())),
            }
        };
        Box::pin(ready(answer))
    }
}

impl Handler<ReadCommitted> for QuorumState {
    type Result = ResponseFuture<Result<RecordPage, NodeError>>;

    fn handle(&mut self, msg: ReadCommitted, ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        self.drive(ctx);
        // The executed high watermark: every batch below it has been queued
        // to storage, so a read queued now sees exactly the committed log.
        let high_watermark = self.executed_high_watermark;
        let log_start_offset = self.node.log().start_offset();
        // Below the log start the records come from the newest snapshot,
        // which holds every one of them.
        let from = msg.from.max(0);
        let max = msg.max.min(READ_COMMITTED_MAX_RECORDS);
        let empty = RecordPage {
            high_watermark,
            log_start_offset,
            records: Vec::new(),
        };
        if from >= high_watermark || max == 0 {
            return Box::pin(ready(Ok(empty)));
        }
        if self.client_reads >= MAX_CLIENT_READS {
            return Box::pin(ready(Err(NodeError(format!(
                "{MAX_CLIENT_READS} log reads are already in progress; try again"
            )))));
        }
        let batches = match self.appender.read(from, high_watermark, READ_COMMITTED_MAX_BYTES) {
            Ok(batches) => batches,
            Err(e) => return Box::pin(ready(Err(NodeError(format!("cannot read the log: {e}"))))),
        };
        // The read stays counted until the storage thread has answered it,
        // even if the client goes away first.
        self.client_reads += 1;
        let (tx, rx) = oneshot::channel();
        ctx.spawn(wrap_future::<_, Self>(batches).map(move |result, act, _ctx| {
            act.client_reads -= 1;
            let _ = tx.send(result);
        }));
        Box::pin(async move {
            let batches = rx
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| NodeError("the storage thread stopped".into()))?
                .map_err(|e| NodeError(format!("cannot read the log: {e}")))?;
            let records = committed_records(batches, from, high_watermark, max)?;
            Ok(RecordPage {
                high_watermark,
                log_start_offset,
                records,
            })
        })
    }
}

/// One queued fetch read, counted in `QuorumState::fetch_reads` until it
/// is dropped (its answer came, or the storage side went away).
struct FetchRead(Arc<AtomicUsize>);

impl FetchRead {
    /// Counts one more queued read, or None when [`MAX_FETCH_READS`] are
    /// queued already (the fetch is then answered with a storage error).
    fn start(fetch_reads: &Arc<AtomicUsize>, request_id: u64) -> Option<FetchRead> {
        if fetch_reads.load(Ordering::Relaxed) >= MAX_FETCH_READS {
            debug!(
                request_id,
                "{MAX_FETCH_READS} fetch reads are queued; answering a storage error"
            );
            return None;
        }
        fetch_reads.fetch_add(1, Ordering::Relaxed);
        Some(FetchRead(fetch_reads.clone()))
    }
}

impl Drop for FetchRead {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A fetch answer once its read is done: the batches read, or, when the
/// read failed, none and Kafka's KAFKA_STORAGE_ERROR, which the follower
/// retries after its backoff (rather than waiting out its request timeout
/// for an answer that never comes).
fn complete_fetch(mut response: FetchResponse, read: ReadResult) -> FetchResponse {
    match read {
        Ok(batches) => response.batches = batches,
        Err(e) => {
            warn!("a fetch is answered with a storage error: {e}");
            response.error = ErrorCode::KafkaStorageError;
            response.batches = Vec::new();
        }
    }
    response
}

/// The records of `batches` in `[from, until)`, at most `max`, contiguous
/// from `from`.
fn committed_records(
    batches: Vec<Batch>,
    from: Offset,
    until: Offset,
    max: usize,
) -> Result<Vec<CommittedRecord>, NodeError> {
    let mut entries = Vec::new();
    let mut expected = from;
    'batches: for batch in batches {
        let records = batch.records().map_err(|e| {
            NodeError(format!(
                "committed batch at offset {} does not decode: {e}",
                batch.base_offset
            ))
        })?;
        for (i, record) in records.into_iter().enumerate() {
            let offset = batch.base_offset + i as Offset;
            if offset < expected {
                continue;
            }
            if offset >= until || entries.len() >= max {
                break 'batches;
            }
            if offset != expected {
                return Err(NodeError(format!(
                    "gap in the committed log: expected offset {expected}, found {offset}"
                )));
            }
            entries.push(CommittedRecord {
                offset,
                epoch: batch.epoch,
                record,
            });
            expected += 1;
        }
    }
    Ok(entries)
}

impl Handler<Shutdown> for QuorumState {
    type Result = ();

    fn handle(&mut self, _msg: Shutdown, ctx: &mut Self::Context) {
        if self.shutting_down.is_some() || self.is_stopping() {
            return;
        }
        let now = self.tick();
        info!(
            node_id = self.node_id,
            role = self.node.role().role.as_str(),
            "graceful shutdown"
        );
        self.shutting_down = Some(ShuttingDown::default());
        // A leader resigns and sends EndQuorumEpoch (recorded as they are
        // executed); after_actions stops the actor once each was answered
        // once, which for any other role is at once.
        self.node.resign(now);
        // Whatever happens, stop within the grace period.
        ctx.run_later(Duration::from_millis(SHUTDOWN_GRACE_MS), |act, ctx| {
            act.stop(ctx, StopReason::Shutdown)
        });
        self.drive(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_records_are_contiguous_and_bounded_and_shown_as_text_for_http() {
        let b0 = Batch::new(
            0,
            1,
            &[Record::LeaderChange {
                leader_id: 1,
                voters: vec![1],
                granting_voters: vec![1],
            }],
        );
        let b1 = Batch::new(
            1,
            1,
            &[
                Record::Data(b"a".to_vec()),
                Record::Data(vec![0xff, 0x00, 0xfe]),
                Record::NoOp,
            ],
        );
        let all = committed_records(vec![b0.clone(), b1.clone()], 0, 4, 100).unwrap();
        assert_eq!(all.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(all[0].record.kind(), "leader_change");
        assert_eq!(all[1].record, Record::Data(b"a".to_vec()));
        assert_eq!(all[2].record, Record::Data(vec![0xff, 0x00, 0xfe]), "bytes as appended");
        assert_eq!(all[3].record, Record::NoOp);
        // From the middle of a batch, bounded by the high watermark and max.
        let some = committed_records(vec![b1.clone()], 2, 4, 1).unwrap();
        assert_eq!(some.len(), 1);
        assert_eq!(some[0].offset, 2);
        let below_hw = committed_records(vec![b0, b1], 0, 2, 100).unwrap();
        assert_eq!(below_hw.len(), 2);
        // The HTTP API's page: kinds as words, data as (lossy) text.
        let page = crate::messages::records::LogPage::from(RecordPage {
            high_watermark: 4,
            log_start_offset: 0,
            records: all,
        });
        let shown: Vec<(&str, Option<&str>)> = page
            .records
            .iter()
            .map(|e| (e.kind.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("leader_change", None),
                ("data", Some("a")),
                ("data", Some("\u{fffd}\u{0}\u{fffd}")),
                ("noop", None)
            ]
        );
    }

    #[test]
    fn a_fetch_whose_read_failed_is_answered_with_a_storage_error() {
        let response = FetchResponse {
            error: ErrorCode::None,
            epoch: 3,
            leader_id: Some(1),
            high_watermark: 10,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            batches: Vec::new(),
        };
        let batch = Batch::new(4, 3, &[Record::NoOp]);
        let read = complete_fetch(response.clone(), Ok(vec![batch.clone()]));
        assert_eq!((read.error, read.batches), (ErrorCode::None, vec![batch]));
        let failed = complete_fetch(
            response.clone(),
            Err(StorageError::Io(std::io::Error::other("disk on fire"))),
        );
        assert_eq!(
            failed,
            FetchResponse {
                error: ErrorCode::KafkaStorageError,
                ..response
            }
        );
    }

    #[test]
    fn committed_records_reject_a_gap() {
        let b = Batch::new(5, 1, &[Record::NoOp]);
        assert!(committed_records(vec![b], 3, 10, 100).is_err());
    }
}

#[cfg(test)]
mod snapshot_fetch_tests {
    //! The shell's side of fetching the leader's snapshot (KIP-630): a real
    //! QuorumState over a real storage thread, whose leader and disk the
    //! test plays.

    use std::path::Path;

    use super::*;
    use crate::actors::log_appender::tests::{store, FlushGate};
    use crate::config::Config;
    use crate::messages::FetchSnapshotResponse;
    use crate::messages::SnapshotId;
    use crate::raft::{Epoch, LogView, RaftConfig};
    use crate::storage::snapshot::{self, SnapshotWriter};
    use crate::storage::LogStore;

    const LEADER: NodeId = 1;
    const EPOCH: Epoch = 1;
    const OBSERVER: NodeId = 100;
    /// How long the test waits for something that must happen before it
    /// calls it a hang (not a timing check).
    const LIVENESS_WAIT: Duration = Duration::from_secs(30);

    /// The observer's network: every request it sends lands in the test's
    /// channel, for the test to answer as the leader.
    struct Wire(mpsc::UnboundedSender<SendRequest>);

    impl Actor for Wire {
        type Context = Context<Self>;
    }

    impl Handler<SendRequest> for Wire {
        type Result = ();

        fn handle(&mut self, msg: SendRequest, _ctx: &mut Self::Context) {
            let _ = self.0.send(msg);
        }
    }

    /// Answered once every request posted to the wire before it is in the
    /// test's channel (a mailbox is FIFO).
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Drained;

    impl Handler<Drained> for Wire {
        type Result = ();

        fn handle(&mut self, _msg: Drained, _ctx: &mut Self::Context) {}
    }

    /// Node 100, an observer of the quorum whose only voter, node 1, leads
    /// epoch 1, with its snapshot files in `dir`: the actors of
    /// `node::launch`, the storage on a thread of its own as in production.
    struct Observer {
        quorum: Addr<QuorumState>,
        wire: Addr<Wire>,
        sent: mpsc::UnboundedReceiver<SendRequest>,
        appender: LogAppender,
        storage_thread: std::thread::JoinHandle<()>,
        stall: FlushGate,
        stopped: oneshot::Receiver<StopReason>,
    }

    impl Observer {
        fn start(dir: &Path) -> Observer {
            // A memory store whose flush can be made to hang: a disk slower
            // than the network, which the storage thread waits for.
            let (disk, _) = store();
            let stall = disk.gate.clone();
            let election = disk.election_state().unwrap();
            let log = LogView::new(
                disk.start_offset(),
                disk.start_epoch(),
                disk.end_offset(),
                disk.epoch_cache(),
            );
            let (events, storage_events) = mpsc::unbounded_channel();
            let (appender, storage_thread) =
                LogAppender::spawn(OBSERVER, Box::new(disk), Some(dir.into()), events).unwrap();
            let (to_test, sent) = mpsc::unbounded_channel();
            let wire = Wire(to_test).start();
            let voters: BTreeMap<NodeId, String> = [(LEADER, "127.0.0.1:9001".to_string())].into();
            let mut config = RaftConfig::new(OBSERVER, voters.clone(), "127.0.0.1:9100".to_string());
            // Nothing times out while the test holds the disk: a request
            // the engine gave up on would be sent again and taken for the
            // next one.
            config.request_timeout_ms = 600_000;
            config.fetch_timeout_ms = 600_000;
            let engine = RaftNode::new(config, election, log, 0, 1);
            let defaults = Config::default();
            let (on_stopped, stopped) = oneshot::channel();
            let peers = QuorumPeers {
                appender: appender.clone(),
                storage_events,
                requests: wire.clone().recipient(),
                forwarder: AppendForwarder::new(wire.clone().recipient(), voters).start(),
                purgatory: FetchPurgatory::new().start(),
                listeners: MetadataListeners::new(OBSERVER, appender.clone(), 0).start(),
                snapshots: SnapshotPolicy::new(defaults.snapshot_settings(), Vec::new(), 0, 0),
                on_stopped,
            };
            let quorum = QuorumState::new("held-chunk".to_string(), engine, peers).start();
            Observer {
                quorum,
                wire,
                sent,
                appender,
                storage_thread,
                stall,
                stopped,
            }
        }

        /// The next request the observer sends (all go to the leader).
        async fn next_request(&mut self) -> SendRequest {
            let sent = tokio::time::timeout(LIVENESS_WAIT, self.sent.recv()).await;
            let request = sent
                .expect("the observer sends its next request")
                .expect("the wire is up");
            assert_eq!(request.to, LEADER, "{request:?}");
            request
        }

        /// Answers `request` as the leader. Returns once the observer has
        /// handled the answer and whatever it sent in turn is in `sent`.
        async fn answer(&self, request: &SendRequest, response: RaftResponse) {
            let outcome = RequestOutcome {
                from: LEADER,
                correlation_id: request.correlation_id,
                result: Ok(response),
            };
            self.quorum.send(outcome).await.expect("the observer is running");
            self.wire.send(Drained).await.expect("the wire is up");
        }

        /// Stalls the disk: returns once the storage thread hangs in a
        /// flush, until the returned sender is dropped. A snapshot chunk
        /// never reaches the store (it goes to the `.part` file), so the
        /// disk stalls just ahead of it: the storage thread does one thing
        /// at a time, in order, and a chunk queued now is not in the file
        /// (nor reported written) until the flush ends, as if its own write
        /// were that slow.
        /// Blocks this thread until then: the storage thread needs nothing
        /// from it to start the flush.
        fn stall_the_disk(&self) -> std::sync::mpsc::Sender<()> {
            let (entered, stalled) = std::sync::mpsc::channel();
            let (release, waiting) = std::sync::mpsc::channel();
            *self.stall.lock().unwrap() = Some((entered, waiting));
            self.appender.flush().unwrap();
            stalled.recv_timeout(LIVENESS_WAIT).expect("the disk stalls");
            release
        }

        /// A graceful shutdown, the storage thread last (as the supervisor
        /// of `node::launch` does).
        async fn stop(self) {
            self.quorum.send(Shutdown).await.expect("the observer is running");
            assert_eq!(self.stopped.await, Ok(StopReason::Shutdown));
            self.appender.shutdown().unwrap().await.unwrap();
            self.storage_thread.join().unwrap();
        }
    }

    /// The leader's snapshot of 64 data records (in batches of 2), written
    /// in `dir` by the writer the leader itself uses, and its bytes.
    fn leader_snapshot(dir: &Path) -> (SnapshotId, Vec<u8>) {
        let id = SnapshotId {
            end_offset: 64,
            epoch: EPOCH,
        };
        let mut writer = SnapshotWriter::create(dir, id, 0).unwrap();
        for base in (0..id.end_offset).step_by(2) {
            let records: Vec<Record> = (base..base + 2)
                .map(|offset| Record::Data(format!("record {offset}").into_bytes()))
                .collect();
            writer.append(base, EPOCH, &records).unwrap();
        }
        writer.freeze().unwrap();
        (id, std::fs::read(snapshot::path_of(dir, id)).unwrap())
    }

    /// The leader's answer to a Fetch when its log starts at the end of
    /// `snapshot` (or, with None, is empty).
    fn fetch_answer(snapshot: Option<SnapshotId>) -> RaftResponse {
        let log_start = snapshot.map_or(0, |id| id.end_offset);
        RaftResponse::Fetch(FetchResponse {
            error: ErrorCode::None,
            epoch: EPOCH,
            leader_id: Some(LEADER),
            high_watermark: log_start,
            log_start_offset: log_start,
            diverging_epoch: None,
            snapshot_id: snapshot,
            batches: Vec::new(),
        })
    }

    /// Where a FetchSnapshot request asks to resume, None for any other.
    fn snapshot_position(request: &SendRequest) -> Option<u64> {
        match &request.request {
            RaftRequest::FetchSnapshot(fetch) => Some(fetch.position),
            _ => None,
        }
    }

    /// The leader's answer to a FetchSnapshot of snapshot `id` (whose bytes
    /// are `file`) at `position`: the next `chunk` bytes at most.
    fn chunk_answer(id: SnapshotId, file: &[u8], position: u64, chunk: usize) -> RaftResponse {
        let from = position as usize;
        let until = (from + chunk).min(file.len());
        RaftResponse::FetchSnapshot(FetchSnapshotResponse {
            error: ErrorCode::None,
            epoch: EPOCH,
            leader_id: Some(LEADER),
            snapshot_id: id,
            size: file.len() as u64,
            position,
            bytes: file[from..until].to_vec(),
        })
    }

    #[actix_rt::test]
    async fn a_fetched_snapshot_chunk_holds_back_the_next_one_until_it_is_in_the_file() {
        let leader_dir = tempfile::tempdir().unwrap();
        let (id, file) = leader_snapshot(leader_dir.path());
        // Four answers carry the whole file.
        let chunk = file.len().div_ceil(4);
        let dir = tempfile::tempdir().unwrap();
        let mut node = Observer::start(dir.path());

        // The observer finds the leader, whose log starts past its own end.
        let discovery = node.next_request().await;
        node.answer(&discovery, fetch_answer(None)).await;
        let fetch = node.next_request().await;
        assert!(matches!(fetch.request, RaftRequest::Fetch(_)), "{fetch:?}");
        node.answer(&fetch, fetch_answer(Some(id))).await;

        // The first chunk goes to a disk that has stalled...
        let first = node.next_request().await;
        assert_eq!(snapshot_position(&first), Some(0), "{first:?}");
        let release = node.stall_the_disk();
        node.answer(&first, chunk_answer(id, &file, 0, chunk)).await;
        // ...and the engine asks for the next one at once, which the leader
        // answers while the first is still on its way to the file.
        let second = node.next_request().await;
        assert_eq!(snapshot_position(&second), Some(chunk as u64), "{second:?}");
        node.answer(&second, chunk_answer(id, &file, chunk as u64, chunk)).await;
        // The engine takes a chunk and asks for the one after it in the same
        // step: a third request means it took the second chunk, and the
        // shell queued it for the file behind the first.
        if let Ok(third) = node.sent.try_recv() {
            panic!(
                "a second chunk was queued for the file while the first was still being written \
                 (the answer at byte {chunk} reached the engine, which sent {:?})",
                third.request
            );
        }

        // Once the disk catches up, the held answer goes on to the engine
        // and the transfer completes.
        drop(release);
        let mut answered = vec![0, chunk as u64];
        let after_install = loop {
            let request = node.next_request().await;
            let Some(position) = snapshot_position(&request) else {
                break request;
            };
            answered.push(position);
            node.answer(&request, chunk_answer(id, &file, position, chunk)).await;
        };
        let expected: Vec<u64> = (0..file.len()).step_by(chunk).map(|p| p as u64).collect();
        assert_eq!(answered, expected, "each chunk is asked for once, in order");
        // The observer fetches the log again from the snapshot's end, which
        // it asks for only once the snapshot is installed.
        match &after_install.request {
            RaftRequest::Fetch(fetch) => {
                assert_eq!(
                    (fetch.fetch_offset, fetch.last_fetched_epoch),
                    (id.end_offset, id.epoch)
                )
            }
            other => panic!("expected a Fetch after the install, got {other:?}"),
        }
        let status = node.quorum.send(Describe).await.unwrap();
        assert_eq!(
            (status.log_start_offset, status.log_end_offset),
            (id.end_offset, id.end_offset),
            "the log starts at the installed snapshot's end"
        );
        assert_eq!(
            std::fs::read(snapshot::path_of(dir.path(), id)).unwrap(),
            file,
            "the installed file is the leader's"
        );
        node.stop().await;
    }
}
