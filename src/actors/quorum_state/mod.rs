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
//!
//! This file holds the actor: its messages, its state, the handlers and
//! `execute`. What it carries out for particular actions and messages is
//! beside it: `appends.rs` (client and forwarded appends), `reads.rs`
//! (fetch answers, snapshot chunks, committed reads), `snapshots.rs`
//! (writing, installing and compacting) and `status.rs` (status and
//! metrics).

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

use crate::actors::fetch_purgatory::{self, FetchPurgatory, HighWatermarkAdvanced, Register, RoleUpdate};
use crate::actors::log_appender::{LogAppender, ReadResult, StorageEvent};
use crate::actors::metadata_listeners::{CommittedUpTo, ListenersRoleUpdate, LogBounds, MetadataListeners};
use crate::actors::state_machine::TakeSnapshot;
use crate::messages::actor::{ControllerInbound, InboundRequest, RequestOutcome, SendRequest};
use crate::messages::records::{CommittedRecord, RecordPage};
use crate::messages::{
    AppendRequest, AppendResponse, Batch, ErrorCode, FetchResponse, RaftRequest, RaftResponse, Record,
    MAX_APPEND_GROUPS,
};
use crate::raft::snapshot_policy::SnapshotPolicy;
use crate::raft::{Action, AppendRoute, NodeId, Offset, ProposeError, Proposed, RaftNode, RoleInfo, RoleKind};
use crate::storage::tail_cache::{TailCache, TAIL_CACHE_BYTES};
use crate::storage::StorageError;
use crate::types::{AppendError, AppendReply, Appended, MetricsSnapshot, NodeError, QuorumStatus, ReplicaStatus};

mod appends;
mod forwarding;
mod read_index;
mod reads;
mod snapshots;

pub use read_index::{ReadIndex, WaitCommitted};
mod status;

use status::Metrics;

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
    /// Where forwarded appends go: a RequestManager of their own, whose
    /// outcomes come back to this actor too.
    pub forward_requests: Recipient<SendRequest>,
    pub purgatory: Addr<FetchPurgatory>,
    pub listeners: Addr<MetadataListeners>,
    /// When to snapshot and compact, seeded with the snapshots found.
    pub snapshots: SnapshotPolicy,
    /// The state machine whose state the snapshots hold; None: they hold
    /// the log's records (`node.state_machine = "log"`).
    pub state_machine: Option<Recipient<TakeSnapshot>>,
    /// Where operations forwarded to this node's controller go (a voter in
    /// metadata mode).
    pub controller: Option<Recipient<ControllerInbound>>,
    /// Told once, when the actor stops.
    pub on_stopped: oneshot::Sender<StopReason>,
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
    /// This node's clients' appends forwarded to the leader.
    forwarding: forwarding::Forwarding,
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
    /// See [`QuorumPeers::state_machine`].
    state_machine: Option<Recipient<TakeSnapshot>>,
    /// See [`QuorumPeers::controller`].
    controller: Option<Recipient<ControllerInbound>>,
    /// A snapshot is being written (one at a time).
    snapshotting: bool,
    /// The newest batches sent to storage, for fetch reads at the log end.
    tail: TailCache,
    /// A fetched snapshot chunk is on its way to the file: the next
    /// FetchSnapshot answer waits in `held_chunk_answer` until it is.
    chunk_unwritten: bool,
    /// A FetchSnapshot answer held back while the last chunk is written.
    held_chunk_answer: Option<RequestOutcome>,
    /// Linearizable reads waiting for the high watermark.
    read_indexes: read_index::ReadIndexes,
}

impl QuorumState {
    /// `node` must have been created with `now_ms == 0` just before.
    pub fn new(cluster_id: String, node: RaftNode, peers: QuorumPeers) -> Self {
        let config = node.config().clone();
        let log_start = node.log().start_offset();
        QuorumState {
            node_id: config.node_id,
            cluster_id,
            voters: config.voters.clone(),
            node,
            started_at: Instant::now(),
            appender: peers.appender,
            storage_events: Some(peers.storage_events),
            requests: peers.requests,
            forwarding: forwarding::Forwarding::new(
                peers.forward_requests,
                config.voters.clone(),
                config.request_timeout_ms,
                config.max_batch_bytes,
            ),
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
            state_machine: peers.state_machine,
            controller: peers.controller,
            snapshotting: false,
            tail: TailCache::new(TAIL_CACHE_BYTES),
            chunk_unwritten: false,
            held_chunk_answer: None,
            read_indexes: Default::default(),
            metrics: Metrics::new(),
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

    /// Step 3: carries out everything the engine asked for, in order. Not
    /// while a durability wait holds the actor: what the engine asked for
    /// since comes after the held actions, and the wait's continuation
    /// drives it once they have run.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        if self.is_stopping() || ctx.waiting() {
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
                                act.drive(ctx);
                            }
                            Err(_) => act.fatal(ctx, format!("election state {state:?} was not made durable")),
                        }),
                    );
                    return;
                }
                Action::AppendBatch(batch) => {
                    self.metrics.on_appended(batch.record_count as u64);
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
                    timeout_ms,
                } => {
                    debug_assert!(
                        !forwarding::Forwarding::owns(correlation_id),
                        "the engine's ids never reach the forwarded appends' bit"
                    );
                    if let (Some(shutdown), RaftRequest::EndQuorumEpoch(_)) = (&mut self.shutting_down, &request) {
                        shutdown.on_send(correlation_id, to);
                    }
                    if let Err(e) = post(
                        &self.requests,
                        SendRequest {
                            to,
                            correlation_id,
                            request,
                            timeout_ms,
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
                    response,
                    read,
                    ..
                } => {
                    if let Err(e) = self.answer_fetch(request_id, response, read) {
                        return self.fatal(ctx, e);
                    }
                }
                Action::RespondFetchSnapshot {
                    request_id,
                    response,
                    max_bytes,
                    ..
                } => {
                    if let Err(e) = self.answer_snapshot_chunk(request_id, response, max_bytes) {
                        return self.fatal(ctx, e);
                    }
                }
                Action::WriteSnapshotChunk {
                    snapshot_id,
                    size,
                    position,
                    bytes,
                } => {
                    if let Err(e) = self.write_snapshot_chunk(snapshot_id, size, position, bytes, ctx) {
                        return self.fatal(ctx, e);
                    }
                }
                // Holds the actor like PersistElection; the rest of the
                // actions run once the log has been replaced.
                Action::InstallSnapshot(id) => return self.install_snapshot(id, actions, ctx),
                Action::HighWatermark(hw) => {
                    self.executed_high_watermark = self.executed_high_watermark.max(hw);
                    self.read_indexes.on_high_watermark(self.executed_high_watermark);
                    if let Err(e) = post(&self.purgatory, HighWatermarkAdvanced(hw)) {
                        return self.fatal(ctx, format!("fetch purgatory: {e}"));
                    }
                    if let Err(e) = post(&self.listeners, CommittedUpTo(hw)) {
                        return self.fatal(ctx, format!("metadata listeners: {e}"));
                    }
                    self.maybe_pass_high_watermark_hint(false);
                }
                Action::RoleChanged(info) => {
                    self.read_indexes.on_role(&info, self.node_id);
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
        self.metrics.on_role(leader_known, now);
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
        self.forwarding.stop();
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
            RaftRequest::AppendMany(request) if request.groups.len() > MAX_APPEND_GROUPS => {
                warn!(
                    from = msg.from,
                    groups = request.groups.len(),
                    "refusing an AppendMany of too many groups"
                );
                let _ = msg.reply.send(RaftResponse::Error(ErrorCode::InvalidRequest));
            }
            RaftRequest::AppendMany(request) => {
                let reply = msg.reply;
                let answer = move |answers| drop(reply.send(RaftResponse::AppendMany(answers)));
                self.handle_forwarded_appends(now, request.groups, answer, ctx)
            }
            RaftRequest::Controller(bytes) => match &self.controller {
                // The controller answers on the reply itself.
                Some(controller) if controller.connected() => controller.do_send(ControllerInbound {
                    from: msg.from,
                    bytes,
                    reply: msg.reply,
                }),
                _ => {
                    let _ = msg.reply.send(RaftResponse::Error(ErrorCode::NotLeaderOrFollower));
                }
            },
            RaftRequest::ReadIndex => self.inbound_read_index(now, msg.reply),
            RaftRequest::Append(request) => {
                let reply = msg.reply;
                let answer = move |mut answers: Vec<AppendResponse>| {
                    let answer = answers.pop().expect("one answer for one group");
                    drop(reply.send(RaftResponse::Append(answer)))
                };
                self.handle_forwarded_appends(now, vec![request], answer, ctx)
            }
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
        if forwarding::Forwarding::owns(msg.correlation_id) {
            return self.forwarding.on_outcome(msg);
        }
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

/// What the shell's tests share.
#[cfg(test)]
mod test_support {
    use super::*;

    /// A network for the test: every request sent lands in the test's
    /// channel, for the test to answer as the peer.
    pub(super) struct Wire(pub(super) mpsc::UnboundedSender<SendRequest>);

    impl Actor for Wire {
        type Context = Context<Self>;
    }

    impl Handler<SendRequest> for Wire {
        type Result = ();

        fn handle(&mut self, msg: SendRequest, _ctx: &mut Self::Context) {
            let _ = self.0.send(msg);
        }
    }
}

#[cfg(test)]
mod snapshot_fetch_tests {
    //! The shell's side of fetching the leader's snapshot (KIP-630): a real
    //! QuorumState over a real storage thread, whose leader and disk the
    //! test plays.

    use std::path::Path;

    use super::test_support::Wire;
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
        election_gate: FlushGate,
        stopped: oneshot::Receiver<StopReason>,
    }

    impl Observer {
        fn start(dir: &Path) -> Observer {
            // A memory store whose flush can be made to hang: a disk slower
            // than the network, which the storage thread waits for.
            let (disk, _) = store();
            let stall = disk.gate.clone();
            let election_gate = disk.election_gate.clone();
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
                forward_requests: wire.clone().recipient(),
                purgatory: FetchPurgatory::new().start(),
                listeners: MetadataListeners::new(OBSERVER, appender.clone(), 0, false, None).start(),
                snapshots: SnapshotPolicy::new(defaults.snapshot_settings(), Vec::new(), 0, 0),
                state_machine: None,
                controller: None,
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
                election_gate,
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

        /// Holds the next election-state write in the store until the
        /// returned sender is dropped; the receiver hears when it starts.
        fn hold_the_next_election_write(&self) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
            let (entered, started) = std::sync::mpsc::channel();
            let (release, waiting) = std::sync::mpsc::channel();
            *self.election_gate.lock().unwrap() = Some((entered, waiting));
            (started, release)
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

    /// `request` is the Fetch of a node whose log starts at `id`'s end.
    fn assert_fetches_from_the_end_of(id: SnapshotId, request: &SendRequest) {
        match &request.request {
            RaftRequest::Fetch(fetch) => {
                assert_eq!(
                    (fetch.fetch_offset, fetch.last_fetched_epoch),
                    (id.end_offset, id.epoch)
                )
            }
            other => panic!("expected a Fetch after the install, got {other:?}"),
        }
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
        assert_fetches_from_the_end_of(id, &after_install);
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

    /// Waits for `signal` off the actors' thread, which has work to do
    /// before it comes.
    async fn heard(signal: std::sync::mpsc::Receiver<()>, what: &str) {
        let heard = tokio::task::spawn_blocking(move || signal.recv_timeout(LIVENESS_WAIT))
            .await
            .unwrap();
        assert!(heard.is_ok(), "{what}");
    }

    /// The leader's answer, handed to the engine as `RequestOutcome` hands
    /// it; then what the engine asked for runs with a `PersistElection` of
    /// its own state after it.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct AnswerThenPersistElection(RequestOutcome);

    impl Handler<AnswerThenPersistElection> for QuorumState {
        type Result = ();

        fn handle(&mut self, msg: AnswerThenPersistElection, ctx: &mut Self::Context) {
            let now = self.tick();
            self.deliver_outcome(now, msg.0);
            let mut actions = self.node.take_actions();
            assert!(
                matches!(actions.last(), Some(Action::InstallSnapshot(_))),
                "the answer completes the transfer: {actions:?}"
            );
            actions.push(Action::PersistElection(self.node.election_state().clone()));
            self.execute(actions.into_iter(), ctx);
        }
    }

    /// The engine's first rule: nothing after a `PersistElection` runs
    /// before the election state is durable. An install holds the actor
    /// too, and the engine, told the install is done, at once asks for more
    /// (the next Fetch), while a `PersistElection` queued behind the install
    /// may still be on its way to the disk. The engine does not put one
    /// there today, so the test does, after the last chunk's answer.
    #[actix_rt::test]
    async fn what_the_engine_asks_after_an_install_waits_for_an_election_state_queued_behind_it() {
        let leader_dir = tempfile::tempdir().unwrap();
        let (id, file) = leader_snapshot(leader_dir.path());
        let dir = tempfile::tempdir().unwrap();
        let mut node = Observer::start(dir.path());
        let discovery = node.next_request().await;
        node.answer(&discovery, fetch_answer(None)).await;
        let fetch = node.next_request().await;
        node.answer(&fetch, fetch_answer(Some(id))).await;
        let first = node.next_request().await;
        assert_eq!(snapshot_position(&first), Some(0), "{first:?}");

        // One answer carries the whole file: the engine writes it and asks
        // for the install, and the election state is written after that.
        let (started, release) = node.hold_the_next_election_write();
        let whole_file = RequestOutcome {
            from: LEADER,
            correlation_id: first.correlation_id,
            result: Ok(chunk_answer(id, &file, 0, file.len())),
        };
        node.quorum
            .send(AnswerThenPersistElection(whole_file))
            .await
            .expect("the observer is running");
        heard(started, "the install ends and the election state is written").await;
        node.wire.send(Drained).await.expect("the wire is up");
        if let Ok(early) = node.sent.try_recv() {
            panic!(
                "{:?} was sent while the election state ordered before it was not yet durable",
                early.request
            );
        }

        // Once it is durable, the Fetch the install asked for goes out.
        drop(release);
        let after_install = node.next_request().await;
        assert_fetches_from_the_end_of(id, &after_install);
        node.stop().await;
    }
}
