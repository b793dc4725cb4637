//! MetadataListeners: delivery of committed records and leader changes to
//! registered [`Listener`]s (docs/ARCHITECTURE.md, "Actors and threads" and "Protocol rules").
//!
//! Each listener has a cursor that starts at the log start. When the high
//! watermark moves, the committed range `[cursor, hw)` is read in chunks and
//! delivered as [`Committed`] messages, in log order, each record exactly
//! once per registration. Delivery runs here, off the QuorumState actor, so a
//! slow listener never delays heartbeats or elections; each listener has at
//! most one delivery in flight (`send`, awaited), so a slow listener only
//! falls behind, costing one chunk of memory.
//!
//! Reads go through the storage thread ([`LogAppender::read`]), not through a
//! separate reader: a read queued there runs after every append and
//! truncation QuorumState queued before it announced the high watermark, so
//! it never sees a stale tail that a truncation is about to replace (a
//! reader that bypassed the queue could serve a follower's old divergent
//! batch at an offset that is now below the high watermark). Reads never
//! block this actor: the reply arrives on a oneshot.
//!
//! A read that fails (the storage thread answers it with the error: say a
//! snapshot file below the log start is damaged or unreadable for a while)
//! is retried for that listener alone, after a backoff that starts at
//! [`READ_RETRY_INITIAL_MS`] and doubles up to [`READ_RETRY_MAX_MS`], with a
//! warning each time; the node itself is healthy. Delivery to a listener
//! stops for good only when a committed record does not decode (retrying
//! cannot fix that) or the storage thread has stopped (the node is
//! stopping).
//!
//! [`LeaderChanged`] follows Kafka's `ListenerContext.maybeFireLeaderChange`:
//! for a leader other than this node it is delivered when the role change is
//! seen; for this node's own leadership only once the listener's record
//! stream has reached the LeaderChange control record of the current epoch
//! (its epoch start offset), so a listener never acts as leader on a stale
//! image.

use std::collections::HashMap;

use actix::prelude::*;
use std::time::Duration;

use tracing::{debug, error, warn};

use crate::actors::log_appender::{AppenderError, LogAppender};
use crate::messages::actor::{Committed, LeaderChanged, Listener, LoadSnapshot};
use crate::messages::records::CommittedRecord;
use crate::messages::SnapshotId;
use crate::raft::announce::{leader_change_in_stream, leader_change_on_role, Leadership};
use crate::raft::{Epoch, NodeId, Offset, RoleInfo};
use crate::types::NodeError;

/// Most bytes read for one delivery.
pub const MAX_DELIVERY_BYTES: usize = 1024 * 1024;
/// Wait before retrying a read the storage thread had no room for.
const OVERLOAD_RETRY_MS: u64 = 20;
/// Wait before retrying a read that failed; doubled after every failure
/// in a row, up to [`READ_RETRY_MAX_MS`].
pub const READ_RETRY_INITIAL_MS: u64 = 100;
/// Longest wait between two retries of a failing read.
pub const READ_RETRY_MAX_MS: u64 = 5_000;
/// Most listeners registered at once.
pub const MAX_LISTENERS: usize = 1024;

/// Register a listener; it receives every committed record from the log start.
#[derive(Message)]
#[rtype(result = "Result<(), NodeError>")]
pub struct RegisterListener(pub Listener);

/// The high watermark moved forward.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct CommittedUpTo(pub Offset);

/// This node's role, epoch or leader changed.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ListenersRoleUpdate(pub RoleInfo);

/// Where the log starts and which snapshot is the newest, when either
/// changed (a snapshot written or installed, a compaction).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct LogBounds {
    pub log_start: Offset,
    pub latest_snapshot: Option<SnapshotId>,
}

/// Stop delivering and stop the actor (node shutdown).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct StopListeners;

struct ListenerState {
    listener: Listener,
    /// Next offset to deliver. Invariant: every record below it was delivered.
    cursor: Offset,
    /// A read or a send is in flight (the per-listener bound is one).
    busy: bool,
    /// The last (epoch, leader) queued or delivered as LeaderChanged: the
    /// same leader is never announced twice in a row.
    last_leader: Option<(Epoch, Option<NodeId>)>,
    /// A LeaderChanged to deliver before any more records.
    pending_leader: Option<LeaderChanged>,
    /// The wait before the last retry of a failed read; 0 once a delivery
    /// succeeds. At most [`READ_RETRY_MAX_MS`].
    read_retry_ms: u64,
    /// Delivery stopped for good: a committed record does not decode, or
    /// the storage thread has stopped.
    stalled: bool,
}

/// The wait before the next retry of a read that failed, after a wait of
/// `last_ms` (0: the first failure in a row).
fn next_read_retry_ms(last_ms: u64) -> u64 {
    if last_ms == 0 {
        READ_RETRY_INITIAL_MS
    } else {
        last_ms.saturating_mul(2).min(READ_RETRY_MAX_MS)
    }
}

fn leader_changed(leadership: Leadership) -> LeaderChanged {
    LeaderChanged {
        epoch: leadership.epoch,
        leader_id: leadership.leader_id,
    }
}

impl ListenerState {
    /// Queues `change` unless it is the leader last queued or delivered (or
    /// the listener does not take leader changes).
    fn queue_leader_change(&mut self, change: LeaderChanged) {
        let key = (change.epoch, change.leader_id);
        if self.listener.leader_changed.is_some() && self.last_leader != Some(key) {
            self.last_leader = Some(key);
            self.pending_leader = Some(change);
        }
    }
}

pub struct MetadataListeners {
    node_id: NodeId,
    appender: LogAppender,
    log_start: Offset,
    /// The snapshots hold a state machine's state, not the log's records:
    /// nothing below the log start can be read, and a listener that takes
    /// snapshots loads the newest one instead.
    hold_state: bool,
    latest_snapshot: Option<SnapshotId>,
    high_watermark: Offset,
    role: Option<RoleInfo>,
    listeners: HashMap<u64, ListenerState>,
    next_id: u64,
}

impl MetadataListeners {
    /// Listeners start at offset 0. On a node whose snapshots hold the
    /// log's records (`hold_state` false) the records below the log start
    /// are read from the newest snapshot, which holds every one of them;
    /// otherwise a listener that takes snapshots loads the newest one, and
    /// any other starts at the log start.
    pub fn new(
        node_id: NodeId,
        appender: LogAppender,
        log_start: Offset,
        hold_state: bool,
        latest_snapshot: Option<SnapshotId>,
    ) -> Self {
        MetadataListeners {
            node_id,
            appender,
            log_start,
            hold_state,
            latest_snapshot,
            high_watermark: log_start,
            role: None,
            listeners: HashMap::new(),
            next_id: 0,
        }
    }

    /// The LeaderChanged a listener should see for the current role, when
    /// the engine's rule tells it at once ([`leader_change_on_role`]).
    fn remote_leader(&self) -> Option<LeaderChanged> {
        leader_change_on_role(self.role.as_ref()?, self.node_id).map(leader_changed)
    }

    fn queue_leader_change(&mut self, id: u64, change: LeaderChanged) {
        if let Some(state) = self.listeners.get_mut(&id) {
            state.queue_leader_change(change);
        }
    }

    /// Starts the next delivery for listener `id` if none is in flight.
    fn pump(&mut self, id: u64, ctx: &mut Context<Self>) {
        let high_watermark = self.high_watermark;
        let Some(state) = self.listeners.get_mut(&id) else {
            return;
        };
        if state.busy || state.stalled {
            return;
        }
        if let Some(change) = state.pending_leader.take() {
            let Some(recipient) = state.listener.leader_changed.clone() else {
                return;
            };
            state.busy = true;
            ctx.spawn(recipient.send(change).into_actor(self).map(move |result, act, ctx| {
                act.on_sent(id, result.is_ok(), ctx, |_| {});
            }));
            return;
        }
        if self.hold_state {
            let newer = self.latest_snapshot.filter(|s| state.cursor < s.end_offset);
            match (&state.listener.load_snapshot, newer) {
                (Some(recipient), Some(snapshot)) => {
                    let recipient = recipient.clone();
                    return self.load_snapshot(id, snapshot, recipient, ctx);
                }
                _ if state.cursor < self.log_start => {
                    debug!(
                        listener = id,
                        from = state.cursor,
                        to = self.log_start,
                        "nothing below the log start to deliver"
                    );
                    state.cursor = self.log_start;
                }
                _ => {}
            }
        }
        if state.cursor >= high_watermark {
            return;
        }
        let from = state.cursor;
        match self.appender.read(from, high_watermark, MAX_DELIVERY_BYTES) {
            Ok(reply) => {
                state.busy = true;
                ctx.spawn(reply.into_actor(self).map(move |result, act, ctx| match result {
                    Ok(Ok(batches)) => act.on_read(id, from, high_watermark, batches, ctx),
                    Ok(Err(e)) => act.retry_later(id, format!("reading [{from}, {high_watermark}) failed: {e}"), ctx),
                    Err(_) => {
                        // The storage thread stopped; it reported why to
                        // QuorumState, which stops the node.
                        if let Some(state) = act.listeners.get_mut(&id) {
                            state.busy = false;
                            state.stalled = true;
                        }
                    }
                }));
            }
            Err(AppenderError::Overloaded(behind)) => {
                // A busy storage thread is no reason to give up on a
                // listener: try again shortly.
                debug!(listener = id, behind, "storage busy; delivery retried");
                state.busy = true;
                ctx.run_later(Duration::from_millis(OVERLOAD_RETRY_MS), move |act, ctx| {
                    if let Some(state) = act.listeners.get_mut(&id) {
                        state.busy = false;
                    }
                    act.pump(id, ctx);
                });
            }
            Err(e) => {
                warn!(listener = id, "cannot read committed records: {e}");
                state.stalled = true;
            }
        }
    }

    /// Reads the snapshot `snapshot` and hands its state to listener `id`,
    /// whose cursor then stands at the snapshot's end.
    fn load_snapshot(
        &mut self,
        id: u64,
        snapshot: SnapshotId,
        recipient: Recipient<LoadSnapshot>,
        ctx: &mut Context<Self>,
    ) {
        let Some(state) = self.listeners.get_mut(&id) else {
            return;
        };
        let read = match self.appender.read_state_snapshot(snapshot) {
            Ok(read) => read,
            Err(AppenderError::Overloaded(_)) => {
                return self.retry_later(
                    id,
                    format!("the storage thread is busy; snapshot {snapshot:?} not read"),
                    ctx,
                )
            }
            Err(e) => {
                warn!(listener = id, "cannot read snapshot {snapshot:?}: {e}");
                state.stalled = true;
                return;
            }
        };
        state.busy = true;
        ctx.spawn(read.into_actor(self).map(move |result, act, ctx| match result {
            Ok(Ok(records)) => {
                let message = LoadSnapshot {
                    id: snapshot,
                    records: std::sync::Arc::new(records),
                };
                ctx.spawn(recipient.send(message).into_actor(act).map(move |result, act, ctx| {
                    act.on_sent(id, result.is_ok(), ctx, |state| {
                        state.cursor = state.cursor.max(snapshot.end_offset);
                    });
                }));
            }
            Ok(Err(e)) => act.retry_later(id, format!("reading snapshot {snapshot:?} failed: {e}"), ctx),
            Err(_) => {
                if let Some(state) = act.listeners.get_mut(&id) {
                    state.busy = false;
                    state.stalled = true;
                }
            }
        }));
    }

    /// Delivery to listener `id` could not go on for now: warn, and pump it
    /// again after the next backoff.
    fn retry_later(&mut self, id: u64, why: String, ctx: &mut Context<Self>) {
        let Some(state) = self.listeners.get_mut(&id) else {
            return;
        };
        let delay_ms = next_read_retry_ms(state.read_retry_ms);
        state.read_retry_ms = delay_ms;
        warn!(
            listener = id,
            cursor = state.cursor,
            retry_in_ms = delay_ms,
            "{why}; delivery to this listener is retried"
        );
        // Busy until the retry: nothing else starts a read for it meanwhile.
        state.busy = true;
        ctx.run_later(Duration::from_millis(delay_ms), move |act, ctx| {
            if let Some(state) = act.listeners.get_mut(&id) {
                state.busy = false;
            }
            act.pump(id, ctx);
        });
    }

    fn on_read(
        &mut self,
        id: u64,
        from: Offset,
        until: Offset,
        batches: Vec<crate::messages::Batch>,
        ctx: &mut Context<Self>,
    ) {
        let current_epoch = self.role.as_ref().map(|r| r.epoch);
        let Some(state) = self.listeners.get_mut(&id) else {
            return;
        };
        let mut records = Vec::new();
        let mut leader_change = None;
        let mut expected = from;
        for batch in &batches {
            let decoded = match batch.records() {
                Ok(decoded) => decoded,
                Err(e) => {
                    error!(
                        listener = id,
                        offset = batch.base_offset,
                        "committed batch does not decode: {e}; delivery to this listener stops"
                    );
                    state.busy = false;
                    state.stalled = true;
                    return;
                }
            };
            for (i, record) in decoded.into_iter().enumerate() {
                let offset = batch.base_offset + i as Offset;
                if offset < expected {
                    continue;
                }
                if offset >= until {
                    break;
                }
                if offset != expected {
                    // Reads are ordered with the log's writes, so this is a
                    // bug rather than a race; retrying (with the backoff)
                    // keeps it loud and lets it heal if it was transient.
                    error!(listener = id, expected, offset, "gap in the committed log");
                    return self.retry_later(id, format!("the read from {from} skipped to {offset}"), ctx);
                }
                if let Some(change) = leader_change_in_stream(&record, batch.epoch, current_epoch) {
                    leader_change = Some(leader_changed(change));
                }
                records.push(CommittedRecord {
                    offset,
                    epoch: batch.epoch,
                    record,
                });
                expected += 1;
            }
        }
        if records.is_empty() {
            // The store returned nothing for a committed range: a bug, like
            // a gap; retried with the backoff, never in a spin.
            error!(listener = id, from, until, "no committed records could be read");
            return self.retry_later(id, format!("the read of [{from}, {until}) returned nothing"), ctx);
        }
        state.read_retry_ms = 0;
        let next = expected;
        let message = Committed {
            records,
            high_watermark: self.high_watermark,
        };
        let recipient = state.listener.committed.clone();
        ctx.spawn(recipient.send(message).into_actor(self).map(move |result, act, ctx| {
            act.on_sent(id, result.is_ok(), ctx, |state| {
                state.cursor = next;
                if let Some(change) = leader_change {
                    state.queue_leader_change(change);
                }
            });
        }));
    }

    fn on_sent(&mut self, id: u64, delivered: bool, ctx: &mut Context<Self>, update: impl FnOnce(&mut ListenerState)) {
        if !delivered {
            // The listener's actor stopped: that is the listener's business,
            // not a node failure.
            warn!(listener = id, "listener's mailbox is closed; it is unregistered");
            self.listeners.remove(&id);
            return;
        }
        if let Some(state) = self.listeners.get_mut(&id) {
            state.busy = false;
            update(state);
        }
        self.pump(id, ctx);
    }

    fn pump_all(&mut self, ctx: &mut Context<Self>) {
        let ids: Vec<u64> = self.listeners.keys().copied().collect();
        for id in ids {
            self.pump(id, ctx);
        }
    }
}

impl Actor for MetadataListeners {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // QuorumState pushes notifications with do_send after checking the
        // mailbox is open (FIFO, never parked); a larger buffer only matters
        // to the embedding application's `send`s.
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<RegisterListener> for MetadataListeners {
    type Result = Result<(), NodeError>;

    fn handle(&mut self, msg: RegisterListener, ctx: &mut Self::Context) -> Self::Result {
        if self.listeners.len() >= MAX_LISTENERS {
            return Err(NodeError::Busy(format!(
                "at most {MAX_LISTENERS} listeners can be registered"
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.listeners.insert(
            id,
            ListenerState {
                listener: msg.0,
                cursor: 0,
                busy: false,
                last_leader: None,
                pending_leader: None,
                read_retry_ms: 0,
                stalled: false,
            },
        );
        debug!(listener = id, "listener registered");
        if let Some(change) = self.remote_leader() {
            self.queue_leader_change(id, change);
        }
        self.pump(id, ctx);
        Ok(())
    }
}

impl Handler<CommittedUpTo> for MetadataListeners {
    type Result = ();

    fn handle(&mut self, msg: CommittedUpTo, ctx: &mut Self::Context) {
        if msg.0 > self.high_watermark {
            self.high_watermark = msg.0;
            self.pump_all(ctx);
        }
    }
}

impl Handler<ListenersRoleUpdate> for MetadataListeners {
    type Result = ();

    fn handle(&mut self, msg: ListenersRoleUpdate, ctx: &mut Self::Context) {
        self.role = Some(msg.0);
        if let Some(change) = self.remote_leader() {
            let ids: Vec<u64> = self.listeners.keys().copied().collect();
            for id in ids {
                self.queue_leader_change(id, change.clone());
            }
        } else {
            // This node leads (or is about to announce it): a LeaderChanged
            // queued for an earlier leader is stale, and the new one comes
            // from the record stream.
            for state in self.listeners.values_mut() {
                state.pending_leader = None;
            }
        }
        self.pump_all(ctx);
    }
}

impl Handler<LogBounds> for MetadataListeners {
    type Result = ();

    fn handle(&mut self, msg: LogBounds, ctx: &mut Self::Context) {
        self.log_start = msg.log_start;
        self.latest_snapshot = msg.latest_snapshot;
        self.pump_all(ctx);
    }
}

impl Handler<StopListeners> for MetadataListeners {
    type Result = ();

    fn handle(&mut self, _msg: StopListeners, ctx: &mut Self::Context) {
        self.listeners.clear();
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_reads_are_retried_after_a_backoff_that_doubles_up_to_a_bound() {
        let mut waits = Vec::new();
        let mut last = 0;
        for _ in 0..8 {
            last = next_read_retry_ms(last);
            waits.push(last);
        }
        assert_eq!(waits, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
