//! The QuorumState's snapshots: writing one where the snapshot policy says
//! (`SnapshotPolicy::snapshot_point`), on request (`CreateSnapshot`) or when
//! due, and carrying out the cleaner's compaction.

use super::*;
use crate::messages::SnapshotId;

impl QuorumState {
    /// The committed prefix that is also flushed here: what a snapshot may
    /// hold and the log may be compacted below.
    pub(super) fn snapshot_end(&self) -> Offset {
        SnapshotPolicy::committed_flushed_end(self.executed_high_watermark, self.node.log())
    }

    /// Starts writing a snapshot: of the log at the engine's snapshot point
    /// ([`SnapshotPolicy::snapshot_point`]), or, on a node whose snapshots
    /// hold a state machine's state, of that state as of what it applied
    /// (which is committed; it must be flushed here too). The receiver gets
    /// it once it is durable. None when one is being written already or
    /// nothing is newer than the latest.
    pub(super) fn write_snapshot(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> Option<oneshot::Receiver<Result<SnapshotInfo, StorageError>>> {
        if self.snapshotting {
            return None;
        }
        let point = self
            .snapshots
            .snapshot_point(self.executed_high_watermark, self.node.log())?;
        let (tx, rx) = oneshot::channel();
        let Some(machine) = self.state_machine.clone() else {
            match self.appender.create_snapshot(point, self.snapshots.latest()) {
                Ok(created) => self.finish_snapshot(point, created, tx, ctx),
                Err(e) => warn!(id = ?point, "cannot queue a snapshot: {e}"),
            }
            return Some(rx);
        };
        self.snapshotting = true;
        ctx.spawn(machine.send(TakeSnapshot).into_actor(self).map(move |taken, act, ctx| {
            act.snapshotting = false;
            let (id, records) = match taken {
                Ok(Some(taken)) => taken,
                Ok(None) => return drop(tx.send(Err(nothing_to_snapshot("the state machine has applied nothing")))),
                Err(_) => return drop(tx.send(Err(nothing_to_snapshot("the state machine has stopped")))),
            };
            let newer = act.snapshots.latest().is_none_or(|latest| id.end_offset > latest.end_offset);
            if !newer || id.end_offset > act.snapshot_end() {
                let why = format!(
                    "the state machine stands at {id:?}, which is not both newer than the latest snapshot and flushed here"
                );
                return drop(tx.send(Err(nothing_to_snapshot(&why))));
            }
            match act.appender.write_state_snapshot(id, records) {
                Ok(created) => act.finish_snapshot(id, created, tx, ctx),
                Err(e) => warn!(?id, "cannot queue a snapshot: {e}"),
            }
        }));
        Some(rx)
    }

    /// Waits for the snapshot `id` being written, then records it and tells
    /// the engine and the listeners.
    fn finish_snapshot(
        &mut self,
        id: SnapshotId,
        created: oneshot::Receiver<Result<crate::storage::SnapshotMeta, StorageError>>,
        tx: oneshot::Sender<Result<SnapshotInfo, StorageError>>,
        ctx: &mut Context<Self>,
    ) {
        self.snapshotting = true;
        ctx.spawn(wrap_future::<_, Self>(created).map(move |result, act, ctx| {
            act.snapshotting = false;
            let now = act.tick();
            let outcome = match result {
                Ok(Ok(meta)) => {
                    info!(?id, size_bytes = meta.size_bytes, "snapshot written");
                    act.snapshots.on_created(id, meta.size_bytes, now);
                    act.node.on_snapshot_created(now, id);
                    act.announce_log_bounds();
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
    }

    /// Tells the listeners where the log starts and which snapshot is the
    /// newest (a listener that takes snapshots loads a newer one).
    pub(super) fn announce_log_bounds(&self) {
        if self.listeners.connected() {
            self.listeners.do_send(LogBounds {
                log_start: self.node.log().start_offset(),
                latest_snapshot: self.snapshots.latest(),
            });
        }
    }

    /// Runs the cleaner's decision. The engine's log start moves first (so
    /// nothing below it is read again); on disk the older snapshot files go
    /// before the log below the newest one, so that the earliest snapshot
    /// never ends below the log start (Kafka's invariant).
    pub(super) fn maybe_compact(&mut self, now: u64, ctx: &mut Context<Self>) {
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
            self.announce_log_bounds();
        }
        self.drive(ctx);
    }
}

impl QuorumState {
    /// Carries out a `WriteSnapshotChunk` of the snapshot being fetched
    /// from the leader. Err: the storage thread is gone, which is fatal.
    pub(super) fn write_snapshot_chunk(
        &mut self,
        snapshot_id: SnapshotId,
        size: u64,
        position: u64,
        bytes: Vec<u8>,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let written = match self.appender.write_snapshot_chunk(snapshot_id, size, position, bytes) {
            Ok(written) => written,
            Err(e) => return Err(format!("cannot queue a snapshot chunk: {e}")),
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
        Ok(())
    }

    /// Carries out an `InstallSnapshot`, holding the actor until the log has
    /// been replaced; then the `actions` after it.
    pub(super) fn install_snapshot(
        &mut self,
        id: SnapshotId,
        actions: std::vec::IntoIter<Action>,
        ctx: &mut Context<Self>,
    ) {
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
                    act.announce_log_bounds();
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
    }
}

/// Why no snapshot of the state was written this time.
fn nothing_to_snapshot(why: &str) -> StorageError {
    StorageError::NoSnapshot(format!("no snapshot written: {why}"))
}

impl Handler<CreateSnapshot> for QuorumState {
    type Result = ResponseFuture<Result<SnapshotInfo, NodeError>>;

    fn handle(&mut self, _msg: CreateSnapshot, ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        self.drive(ctx);
        if let Some(created) = self.write_snapshot(ctx) {
            return Box::pin(async move {
                match created.await {
                    Ok(result) => result.map_err(|e| NodeError::Storage(e.to_string())),
                    Err(_) => Err(NodeError::Stopped(
                        "the node stopped while writing the snapshot".to_string(),
                    )),
                }
            });
        }
        let answer = if self.snapshotting {
            Err(NodeError::Busy("a snapshot is being written; try again".to_string()))
        } else {
            match self.snapshots.latest_held() {
                Some(held) => Ok(SnapshotInfo {
                    end_offset: held.id.end_offset,
                    epoch: held.id.epoch,
                    size_bytes: held.size_bytes,
                    created: false,
                }),
                None => Err(NodeError::NotReady("nothing is committed yet".to_string())),
            }
        };
        Box::pin(ready(answer))
    }
}
