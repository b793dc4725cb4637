//! The state machine seam: what a node replays its committed log into, and
//! the actor that drives it (docs/ARCHITECTURE.md, "State machines").
//!
//! The raft layer replicates opaque records; a [`StateMachine`] gives them
//! a meaning. It is applied every committed record once, in log order
//! ([`StateMachine::apply`]); it is asked for a snapshot of its state as
//! of what it applied ([`StateMachine::snapshot`]), which is written to a
//! KIP-630 file on another thread while replay goes on; and it replaces
//! its state with a snapshot's ([`StateMachine::load`]) at start and when
//! the node installs one from the leader. The node's snapshots then hold
//! the state's records, not the log's history, so their size follows the
//! state's.
//!
//! [`StateMachineRunner`] is a listener of the node's MetadataListeners
//! (so it gets committed records and snapshots in order, off the
//! QuorumState actor) and answers QuorumState's [`TakeSnapshot`]. A state
//! machine that fails to apply a record stops there, loudly: it never
//! skips a record, and it takes no more until the node restarts.

use actix::prelude::*;
use tracing::error;

use crate::messages::actor::{Committed, LeaderChanged, LoadSnapshot};
use crate::messages::records::CommittedRecord;
use crate::messages::{Record, SnapshotId};
use crate::storage::StateRecords;

/// What a node replays its committed log into. Runs on the node's thread;
/// each call should take time in proportion to its input, not to the
/// state (write the snapshot's records lazily, in the iterator).
pub trait StateMachine: 'static {
    /// Applies committed records, in log order, each exactly once. Control
    /// records (LeaderChange, NoOp) are included: they take offsets too. An
    /// error stops the state machine at that record.
    fn apply(&mut self, records: &[CommittedRecord]) -> Result<(), String>;

    /// Replaces the state with the one snapshot `id` holds (its data
    /// records, as [`StateMachine::snapshot`] wrote them).
    fn load(&mut self, id: SnapshotId, records: &[Record]) -> Result<(), String>;

    /// The state as of everything applied so far: the snapshot's id (the
    /// offset after the last record applied, and that record's epoch) and
    /// its records, made on the thread that writes the file. None before
    /// anything was applied.
    fn snapshot(&self) -> Option<(SnapshotId, StateRecords)>;

    /// The leader changed, in order with the records: on the leader itself
    /// only once every record before its epoch was applied.
    fn leader_changed(&mut self, _change: &LeaderChanged) {}
}

/// QuorumState asks for a snapshot of the state (see
/// [`StateMachine::snapshot`]).
#[derive(Message)]
#[rtype(result = "Option<(SnapshotId, StateRecords)>")]
pub struct TakeSnapshot;

/// Runs a [`StateMachine`] as a listener of the node.
pub struct StateMachineRunner {
    machine: Box<dyn StateMachine>,
    /// Why it stopped taking records, once it did.
    failed: Option<String>,
}

impl StateMachineRunner {
    pub fn new(machine: Box<dyn StateMachine>) -> StateMachineRunner {
        StateMachineRunner { machine, failed: None }
    }

    fn fail(&mut self, why: String) {
        error!("the state machine stops: {why}; it takes no more records until the node restarts");
        self.failed = Some(why);
    }
}

impl Actor for StateMachineRunner {
    type Context = Context<Self>;
}

impl Handler<Committed> for StateMachineRunner {
    type Result = ();

    fn handle(&mut self, msg: Committed, _ctx: &mut Self::Context) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.machine.apply(&msg.records) {
            self.fail(e);
        }
    }
}

impl Handler<LoadSnapshot> for StateMachineRunner {
    type Result = ();

    fn handle(&mut self, msg: LoadSnapshot, _ctx: &mut Self::Context) {
        // A snapshot replaces the state wholesale, so it also heals a
        // machine that stopped on a record the snapshot is past.
        match self.machine.load(msg.id, &msg.records) {
            Ok(()) => self.failed = None,
            Err(e) => self.fail(format!("snapshot {:?} does not load: {e}", msg.id)),
        }
    }
}

impl Handler<LeaderChanged> for StateMachineRunner {
    type Result = ();

    fn handle(&mut self, msg: LeaderChanged, _ctx: &mut Self::Context) {
        self.machine.leader_changed(&msg);
    }
}

impl Handler<TakeSnapshot> for StateMachineRunner {
    type Result = Option<(SnapshotId, StateRecords)>;

    fn handle(&mut self, _msg: TakeSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        if self.failed.is_some() {
            return None;
        }
        self.machine.snapshot()
    }
}
