//! Embedding: start a kraft node's actors inside the caller's actix System
//! and drive it through a [`NodeHandle`]. The server binary is a thin user
//! of this API plus the HTTP layer in [`crate::api`].
//!
//! ```no_run
//! # async fn example(config: kraft::config::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let node = kraft::node::start(config).await?;
//! let appended = node.append(vec![b"hello".to_vec()]).await?; // resolves at commit
//! let page = node.read_committed(appended.base_offset, 10).await?;
//! assert_eq!(page.records[0].value.as_deref(), Some("hello"));
//! node.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! [`start`] runs every actor on the caller's arbiter (one thread: a request
//! costs no thread hop between the transport, QuorumState, the purgatory and
//! the listeners) and the storage on a thread of its own. It must be called
//! inside an actix `System`. Nothing it or the handle does blocks the
//! arbiter: opening the store runs on a blocking-pool thread.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext, Context, Recipient};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info, warn};

pub use crate::actors::controller::Answer;
use crate::actors::controller::{Controller, Operate};
use crate::actors::controller_client::{ControllerClient, Forward, ForwardReadIndex};
use crate::actors::fetch_purgatory::{FetchPurgatory, GetCommitStats, StopPurgatory};
use crate::actors::log_appender::{LogAppender, StorageEvent, StorageWorker};
use crate::actors::metadata_listeners::{MetadataListeners, RegisterListener, StopListeners};
pub use crate::actors::quorum_state::SnapshotInfo;
use crate::actors::quorum_state::{
    CreateSnapshot, Describe, GetMetrics, Propose, ProposeMany, QuorumPeers, QuorumState, ReadCommitted, ReadIndex,
    Shutdown, StopReason, WaitCommitted,
};
use crate::actors::request_manager::RequestManager;
pub use crate::actors::state_machine::StateMachine;
use crate::actors::state_machine::StateMachineRunner;
use crate::actors::transport::{self, RaftServer};
use crate::broker::BrokerSide;
use crate::config::{Config, StateMachineKind};
pub use crate::messages::actor::{Committed, LeaderChanged, Listener, LoadSnapshot};
use crate::messages::actor::{InboundRequest, RequestOutcome, SendRequest};
pub use crate::messages::controller::{HeartbeatAnswer, Operation, OperationAnswer};
pub use crate::messages::records::{CommittedRecord, LogEntry, LogPage, RecordPage};
use crate::messages::SnapshotId;
pub use crate::metadata::controller::ControllerError;
pub use crate::metadata::image::MetadataImage;
pub use crate::metadata::replay::MetadataUpdate;
use crate::metadata::replay::{MetadataPublisher, MetadataStateMachine};
use crate::raft::snapshot_policy::{HeldSnapshot, SnapshotPolicy};
use crate::raft::{ElectionState, LogView, NodeId, Offset, RaftConfig, RaftNode};
use crate::storage::AppenderStore;
use crate::storage::{snapshot, LogStore, SledStore, StorageError};
use crate::types::AppendReply;
pub use crate::types::{AppendError, Appended, MetricsSnapshot, NodeError, QuorumStatus, ReplicaStatus};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A [`Config`] built in code breaks a rule a `config.toml` is held to
    /// (see [`Config::check`]).
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("storage: {0}")]
    Storage(#[from] crate::storage::StorageError),
    /// The `security.tls_*` files could not be used.
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot bind {what} listener on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

// ---------------------------------------------------------------------
// Starting a node
// ---------------------------------------------------------------------

/// A running node. Cheap to clone; every clone drives the same node, from
/// any thread (HTTP worker threads, when configured, use it from theirs).
#[derive(Clone)]
pub struct NodeHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    node_id: NodeId,
    raft_addr: SocketAddr,
    quorum: Addr<QuorumState>,
    purgatory: Addr<FetchPurgatory>,
    listeners: Addr<MetadataListeners>,
    /// The images of a node in `"metadata"` mode.
    metadata: Option<MetadataPublisher>,
    /// The controller of a voter in `"metadata"` mode.
    controller: Option<Addr<Controller>>,
    /// How this node reaches the active controller (`"metadata"` mode).
    /// Forwards controller operations and read index requests to the leader.
    controller_client: Addr<ControllerClient>,
    request_timeout_ms: u64,
    /// The broker side of a node whose roles hold "broker" (metadata mode).
    broker: Option<Arc<BrokerSide>>,
    /// Becomes true once every actor, the raft listener and the storage
    /// thread have stopped.
    stopped: watch::Receiver<bool>,
}

/// Starts a node: opens its store (checking the data dir belongs to this
/// cluster and node), recovers its election state and log, binds the raft
/// listener (`listeners.raft`; port 0 picks a free port, see
/// [`NodeHandle::raft_addr`]) and starts the actors on the current arbiter.
pub async fn start(config: Config) -> Result<NodeHandle, StartError> {
    start_node(config, None).await
}

/// [`start`] with a state machine of the embedder's own in place of the
/// one `node.state_machine` names: it is applied the committed records
/// and its snapshots are what the node's snapshot files hold (see
/// [`StateMachine`]). Appends are raw records, as in `"log"` mode.
pub async fn start_with_state_machine(
    config: Config,
    machine: Box<dyn StateMachine>,
) -> Result<NodeHandle, StartError> {
    start_node(config, Some(machine)).await
}

async fn start_node(config: Config, machine: Option<Box<dyn StateMachine>>) -> Result<NodeHandle, StartError> {
    config.check()?;
    let node_id = config.node.id;
    let cluster_id = config.node.cluster_id.clone();
    let tls = config.security.tls.as_ref().map(crate::tls::Tls::load).transpose()?;

    // sled's open recovers the log and fsyncs: never on the arbiter.
    let dir = config.node.data_dir.clone();
    let open_cluster_id = cluster_id.clone();
    let (store, held, election, log, committed) = tokio::task::spawn_blocking(move || -> Result<_, StorageError> {
        std::fs::create_dir_all(&dir)?;
        let mut store = SledStore::open(&dir, &open_cluster_id, node_id)?;
        let held = recover_snapshots(&dir, &mut store)?;
        let election = store.election_state()?;
        let log = LogView::new(
            store.start_offset(),
            store.start_epoch(),
            store.end_offset(),
            store.epoch_cache(),
        );
        let committed = store.high_watermark_hint();
        Ok((store, held, election, log, committed))
    })
    .await
    .map_err(|e| StartError::Other(format!("the task opening the store failed: {e}")))??;
    info!(
        node_id,
        epoch = election.epoch,
        log_end_offset = log.end_offset(),
        dir = %config.node.data_dir.display(),
        "store opened"
    );

    // The QuorumState actor's address exists before the actor does, so the
    // listener can be bound (and its failure reported) before anything runs.
    let quorum_ctx: Context<QuorumState> = Context::new();
    let quorum = quorum_ctx.address();
    let server = match transport::serve(
        config.listeners.raft,
        cluster_id.clone(),
        node_id,
        config.listeners.max_frame_bytes,
        quorum.clone().recipient(),
        tls.as_ref().map(|tls| tls.peer_acceptor.clone()),
    )
    .await
    {
        Ok(server) => server,
        Err(source) => {
            // Close sled off the arbiter too.
            let _ = tokio::task::spawn_blocking(move || drop(store)).await;
            return Err(StartError::Bind {
                what: "raft",
                addr: config.listeners.raft.to_string(),
                source,
            });
        }
    };
    let raft_addr = server.local_addr();

    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (appender, storage_thread) =
        LogAppender::spawn(node_id, Box::new(store), Some(config.node.data_dir.clone()), events_tx)
            .map_err(|e| StartError::Other(format!("cannot start the storage thread: {e}")))?;
    let voters = config.quorum.voters.clone();
    let max_frame_bytes = config.listeners.max_frame_bytes;
    let request_timeout_ms = config.quorum.request_timeout_ms;
    let tcp_cluster_id = cluster_id.clone();
    let connect = move |outcomes: Recipient<RequestOutcome>| {
        RequestManager::new(
            node_id,
            tcp_cluster_id.clone(),
            voters.clone(),
            request_timeout_ms,
            max_frame_bytes,
            outcomes,
            tls.as_ref().map(|tls| tls.peer_connector.clone()),
        )
        .start()
        .recipient()
    };
    let handle = launch(Launch {
        config: &config,
        quorum_ctx,
        election,
        log,
        storage: (appender, events_rx, StorageWorker::Thread(storage_thread)),
        held,
        committed,
        server: Some(server),
        raft_addr,
        connect: &connect,
        seed: rand::random(),
        machine,
    });
    info!(node_id, %raft_addr, "node started");
    Ok(handle)
}

/// A node over a store and a network of the caller's choosing, for
/// embedders with their own transport and for the actor-level simulator
/// (`tests/actor_simulation.rs`), which runs whole nodes — the actors of
/// [`start`], with its own network in place of the TCP transport and the
/// storage loop on a task — on one thread with a paused tokio clock. Must be
/// called inside an actix System.
pub struct CustomNode {
    /// The `node`, `quorum`, `log` and `metadata` keys are used; the
    /// listeners are not (there is no TCP).
    pub config: Config,
    /// Opened and recovered already. It runs on a task of the current
    /// runtime (never on a thread), so it must not block.
    pub store: Box<dyn AppenderStore>,
    /// Where snapshot files live; None keeps none (snapshots are refused).
    pub snapshot_dir: Option<PathBuf>,
    /// How long a group of storage commands that holds a flush takes to
    /// become durable, in the runtime's time (the disk's fsync latency):
    /// the group is applied at once, its flush completes after this delay.
    pub flush_delay: Duration,
    /// Makes a sender of requests to the voters whose outcomes go to the
    /// recipient given; called twice for the QuorumState: for its engine's
    /// requests and for the appends it forwards.
    pub connect: Box<dyn Fn(Recipient<RequestOutcome>) -> Recipient<SendRequest>>,
    /// Seeds the engine's randomness (election timeouts).
    pub seed: u64,
}

/// Starts a [`CustomNode`] on the current arbiter. Returns its handle and
/// the recipient the caller's network delivers inbound requests to.
/// [`NodeHandle::raft_addr`] is the unspecified address `0.0.0.0:0`.
pub fn start_custom(custom: CustomNode) -> Result<(NodeHandle, Recipient<InboundRequest>), StartError> {
    let CustomNode {
        config,
        mut store,
        snapshot_dir,
        flush_delay,
        connect,
        seed,
    } = custom;
    config.check()?;
    let held = match &snapshot_dir {
        Some(dir) => recover_snapshots(dir, &mut *store)?,
        None => Vec::new(),
    };
    let election = store.election_state()?;
    let log = LogView::new(
        store.start_offset(),
        store.start_epoch(),
        store.end_offset(),
        store.epoch_cache(),
    );
    let committed = store.high_watermark_hint();
    let quorum_ctx: Context<QuorumState> = Context::new();
    let inbound = quorum_ctx.address().recipient();
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (appender, task) = LogAppender::spawn_task(store, snapshot_dir, events_tx, flush_delay);
    let handle = launch(Launch {
        config: &config,
        quorum_ctx,
        election,
        log,
        storage: (appender, events_rx, StorageWorker::Task(task)),
        held,
        committed,
        server: None,
        raft_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        connect: &*connect,
        seed,
        machine: None,
    });
    Ok((handle, inbound))
}

/// What [`start`] and [`start_custom`] share: everything after the store
/// is open and the transport chosen.
struct Launch<'a> {
    config: &'a Config,
    quorum_ctx: Context<QuorumState>,
    election: ElectionState,
    log: LogView,
    storage: (LogAppender, mpsc::UnboundedReceiver<StorageEvent>, StorageWorker),
    /// Valid snapshot files found at start (id, size), newest first.
    held: Vec<(SnapshotId, u64)>,
    /// What the store knew committed (its high watermark hint).
    committed: Offset,
    server: Option<RaftServer>,
    raft_addr: SocketAddr,
    connect: &'a dyn Fn(Recipient<RequestOutcome>) -> Recipient<SendRequest>,
    seed: u64,
    /// An embedder's own state machine, in place of `node.state_machine`'s.
    machine: Option<Box<dyn StateMachine>>,
}

/// The engine as the store left it: its newest snapshot restored, and what
/// the store knew committed (its high watermark hint) remembered.
fn recovered_engine(
    raft: RaftConfig,
    election: ElectionState,
    log: LogView,
    newest_snapshot: Option<SnapshotId>,
    committed: Offset,
    seed: u64,
) -> RaftNode {
    let mut engine = RaftNode::new(raft, election, log, 0, seed);
    if let Some(newest) = newest_snapshot {
        engine.restore_snapshot(newest);
    }
    engine.restore_committed(committed);
    engine
}

/// Starts the actors on the current arbiter and the supervisor that tears
/// them down.
fn launch(parts: Launch<'_>) -> NodeHandle {
    let Launch {
        config,
        quorum_ctx,
        election,
        log,
        storage: (appender, events_rx, storage_worker),
        held,
        committed,
        server,
        raft_addr,
        connect,
        seed,
        machine,
    } = parts;
    let node_id = config.node.id;
    let cluster_id = config.node.cluster_id.clone();
    let quorum = quorum_ctx.address();

    let purgatory = FetchPurgatory::new().start();
    // The state machine the snapshots hold, if any; with none they hold
    // the log's records, and listeners read below the log start from them.
    let metadata =
        (machine.is_none() && config.node.state_machine == StateMachineKind::Metadata).then(MetadataPublisher::new);
    let machine = match (machine, &metadata) {
        (Some(machine), _) => Some(machine),
        (None, Some(publisher)) => {
            Some(Box::new(MetadataStateMachine::new(publisher.clone())) as Box<dyn StateMachine>)
        }
        (None, None) => None,
    };
    let newest = held.first().map(|(id, _)| *id);
    if machine.is_some() {
        // Before anything can read: nothing below the log start is a record.
        if let Err(e) = appender.snapshots_hold_state() {
            error!(node_id, "cannot reach the storage thread: {e}");
        }
    }
    let listeners =
        MetadataListeners::new(node_id, appender.clone(), log.start_offset(), machine.is_some(), newest).start();
    let state_machine = machine.map(|machine| {
        let runner = StateMachineRunner::new(machine).start();
        listeners.do_send(RegisterListener(Listener {
            committed: runner.clone().recipient(),
            leader_changed: Some(runner.clone().recipient()),
            load_snapshot: Some(runner.clone().recipient()),
        }));
        runner.recipient()
    });
    // The controller runs on every voter of a metadata quorum and acts
    // while its node leads.
    let controller = match &metadata {
        Some(publisher) if config.is_controller() => {
            let controller = Controller::new(
                node_id,
                quorum.clone(),
                config.broker.session_timeout_ms,
                seed ^ 0x6b72_6166_7463_726c,
            )
            .start();
            publisher.subscribe_with_leadership(controller.clone().recipient(), controller.clone().recipient());
            Some(controller)
        }
        _ => None,
    };
    let request_timeout_ms = config.quorum.request_timeout_ms;
    let controller_client =
        ControllerClient::create(|ctx| ControllerClient::new(connect(ctx.address().recipient()), request_timeout_ms));
    let requests = connect(quorum.clone().recipient());
    let forward_requests = connect(quorum.clone().recipient());

    let (on_stopped, quorum_stopped) = oneshot::channel();
    let log_end = log.end_offset();
    let engine = recovered_engine(config.raft_config(), election, log, newest, committed, seed);
    let held = held
        .into_iter()
        .map(|(id, size_bytes)| HeldSnapshot {
            id,
            size_bytes,
            made_ms: 0,
        })
        .collect();
    let snapshots = SnapshotPolicy::new(config.snapshot_settings(), held, log_end, 0);
    let peers = QuorumPeers {
        appender: appender.clone(),
        storage_events: events_rx,
        requests,
        forward_requests,
        purgatory: purgatory.clone(),
        listeners: listeners.clone(),
        snapshots,
        state_machine,
        controller: controller.clone().map(Addr::recipient),
        on_stopped,
    };
    quorum_ctx.run(QuorumState::new(cluster_id, engine, peers));

    let broker = (metadata.is_some() && config.is_broker())
        .then(|| Arc::new(BrokerSide::new(config, config.listeners.http, seed)));
    let (stopped_tx, stopped) = watch::channel(false);
    actix_rt::spawn(supervise(Supervised {
        node_id,
        quorum_stopped,
        server,
        purgatory: purgatory.clone(),
        listeners: listeners.clone(),
        appender,
        storage_worker,
        stopped: stopped_tx,
    }));
    let handle = NodeHandle {
        inner: Arc::new(HandleInner {
            node_id,
            raft_addr,
            quorum,
            purgatory,
            listeners,
            metadata,
            controller,
            controller_client,
            request_timeout_ms,
            broker: broker.clone(),
            stopped,
        }),
    };
    if let Some(side) = broker {
        actix_rt::spawn(crate::broker::run(handle.clone(), side));
    }
    handle
}

/// Snapshot files at start (KIP-630). Partial transfers are removed and the
/// newest valid snapshot is found (damaged newer ones are skipped, loudly,
/// and kept for inspection). The log is then reconciled with it: a log
/// that does not continue the snapshot (it ends below the snapshot's end,
/// or holds the snapshot's last offset in another epoch: see
/// [`log_continues_snapshot`]) is what a crash during an install leaves, so
/// it is reset to start at the snapshot's end; a log that starts above the
/// newest valid snapshot has lost the records in between, which refuses to
/// start.
/// Returns the valid snapshots (id, size): the newest first, then older
/// files for the cleaner to delete.
fn recover_snapshots(dir: &Path, store: &mut dyn LogStore) -> Result<Vec<(SnapshotId, u64)>, StorageError> {
    let snapshot_error = |e: crate::storage::SnapshotError| StorageError::Invalid(format!("snapshot files: {e}"));
    let removed = snapshot::remove_partial(dir).map_err(snapshot_error)?;
    if removed > 0 {
        warn!(removed, "removed partial snapshot files left by a crash");
    }
    let scan = snapshot::scan(dir).map_err(snapshot_error)?;
    let skipped: Vec<String> = scan.skipped.iter().map(|(id, why)| format!("{id:?}: {why}")).collect();
    for why in &skipped {
        warn!("skipping a damaged snapshot: {why}");
    }
    let start = store.start_offset();
    let Some(newest) = scan.newest else {
        if start > 0 {
            return Err(StorageError::Damaged(format!(
                "{}: the log starts at {start} but no valid snapshot holds the records below it (damaged: {skipped:?})",
                dir.display()
            )));
        }
        return Ok(Vec::new());
    };
    let id = newest.id();
    if id.end_offset < start {
        return Err(StorageError::Damaged(format!(
            "{}: the newest valid snapshot ends at {} but the log starts at {start}: the records between are lost (damaged: {skipped:?})",
            dir.display(),
            id.end_offset
        )));
    }
    if let Some(why) = log_continues_snapshot(&*store, id).err() {
        warn!(
            ?id,
            log_start_offset = start,
            log_end_offset = store.end_offset(),
            "the log restarts at an installed snapshot's end: {why}"
        );
        store.reset(id.end_offset, id.epoch)?;
    }
    // Older snapshots that end below the log start were superseded (a
    // compaction or an install that stopped before deleting them): the
    // earliest snapshot never ends below the log start.
    let start = store.start_offset();
    let mut held = vec![(id, newest.size_bytes())];
    for older in snapshot::list(dir).map_err(snapshot_error)? {
        if older.end_offset >= id.end_offset {
            continue;
        }
        if older.end_offset < start {
            snapshot::delete(dir, older).map_err(snapshot_error)?;
        } else {
            held.push((older, 0));
        }
    }
    // A log that starts above 0 starts where its earliest snapshot ends.
    // The cleaner deletes the older snapshots before it compacts the log to
    // the newer one; a crash in between leaves the log starting below the
    // earliest snapshot left, with the records in between in both. Finish
    // that compaction.
    let earliest = held.iter().map(|(id, _)| id.end_offset).min().unwrap_or(id.end_offset);
    if start > 0 && start < earliest {
        warn!(
            log_start_offset = start,
            earliest_snapshot_end = earliest,
            "finishing a compaction a crash interrupted"
        );
        store.delete_before(earliest)?;
    }
    Ok(held)
}

/// Whether the log continues the snapshot `id` (which ends at or above the
/// log start): it must reach the snapshot's end and hold the snapshot's
/// last record, at `id.end_offset - 1`, in the snapshot's epoch. By Raft's
/// log matching (same offset and epoch, same prefix) the log below the
/// snapshot's end is then the snapshot's history, and the records above it
/// follow it. Otherwise (Err says why) the log is another history: an
/// install (file renamed into place, then the log reset, KIP-630) that a
/// crash cut in between leaves the follower's old log beside the leader's
/// snapshot, and that log may hold uncommitted records of an older epoch
/// below the snapshot's end, which must never be taken for committed.
///
/// When the log starts at the snapshot's end, the record at
/// `id.end_offset - 1` was compacted away and the log's start epoch is its
/// epoch; the epoch cache only knows the epochs of the batches in the log.
fn log_continues_snapshot(store: &dyn LogStore, id: SnapshotId) -> Result<(), String> {
    let (start, end) = (store.start_offset(), store.end_offset());
    debug_assert!(id.end_offset >= start, "checked by the caller");
    if id.end_offset > end {
        return Err(format!("the snapshot ends past the log end {end}"));
    }
    if id.end_offset == 0 {
        // An empty snapshot: nothing to agree on.
        return Ok(());
    }
    let log = LogView::new(start, store.start_epoch(), end, store.epoch_cache());
    let epoch = log.epoch_before(id.end_offset);
    if epoch != id.epoch {
        return Err(format!(
            "the log holds offset {} in epoch {epoch}, the snapshot in epoch {}",
            id.end_offset - 1,
            id.epoch
        ));
    }
    Ok(())
}

/// What the supervisor tears down once QuorumState stops.
struct Supervised {
    node_id: NodeId,
    quorum_stopped: oneshot::Receiver<StopReason>,
    server: Option<RaftServer>,
    purgatory: Addr<FetchPurgatory>,
    listeners: Addr<MetadataListeners>,
    appender: LogAppender,
    storage_worker: StorageWorker,
    stopped: watch::Sender<bool>,
}

/// Waits for QuorumState to stop (graceful shutdown or a fatal error), then
/// stops the rest in dependency order, the storage thread last so that
/// everything QuorumState queued is applied and flushed.
async fn supervise(parts: Supervised) {
    let Supervised {
        node_id,
        quorum_stopped,
        server,
        purgatory,
        listeners,
        appender,
        storage_worker,
        stopped,
    } = parts;
    let reason = quorum_stopped
        .await
        .unwrap_or_else(|_| StopReason::Fatal("the quorum state actor vanished".to_string()));
    if let StopReason::Fatal(why) = &reason {
        error!(node_id, "node stopping after a fatal error: {why}");
    }
    if let Some(server) = server {
        server.shutdown();
    }
    // Mailbox errors below mean the actor is already gone: nothing to stop.
    let reason_text = match &reason {
        StopReason::Shutdown => "the node is shutting down".to_string(),
        StopReason::Fatal(why) => format!("the node failed: {why}"),
    };
    let _ = purgatory.send(StopPurgatory { reason: reason_text }).await;
    let _ = listeners.send(StopListeners).await;
    if let Ok(flushed) = appender.shutdown() {
        let _ = flushed.await;
    }
    drop(appender);
    if !storage_worker.join().await {
        error!(node_id, "the storage worker panicked");
    }
    info!(node_id, ?reason, "node stopped");
    stopped.send_replace(true);
}

impl NodeHandle {
    /// Appends `records` as one batch of data records. Resolves when they
    /// are committed (the high watermark passed them). On a follower the
    /// batch is forwarded to the leader and its answer relayed.
    pub async fn append(&self, records: Vec<Vec<u8>>) -> Result<Appended, AppendError> {
        if self.inner.metadata.is_some() {
            return Err(raw_appends_unsupported());
        }
        match self.inner.quorum.send(Propose { records }).await {
            Ok(result) => result,
            // The message was never handled: nothing was proposed.
            Err(e) => Err(AppendError::Unavailable(format!("the node is stopped ({e})"))),
        }
    }

    /// Several appends handed to the node in one message, proposed in
    /// order; each outcome is sent to its own reply as [`NodeHandle::append`]
    /// would resolve. The HTTP API uses it to hand many requests over at
    /// once (one crossing to the node's thread, when it runs on a worker). Appends a stopped node never took are
    /// answered [`AppendError::Unavailable`]; a reply dropped unanswered
    /// means the node stopped after taking them: the outcome is unknown.
    pub fn append_each(&self, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
        if self.inner.metadata.is_some() {
            for (_, reply) in groups {
                let _ = reply.send(Err(raw_appends_unsupported()));
            }
            return;
        }
        self.inner.quorum.do_send(ProposeMany { groups });
    }

    /// This node's view of the quorum (replica lists only on the leader).
    pub async fn describe(&self) -> Result<QuorumStatus, NodeError> {
        self.inner.quorum.send(Describe).await.map_err(unavailable)
    }

    /// Committed records from `from` (raised to the log start), at most
    /// `max` (capped at 10 000), contiguous, control records included,
    /// never at or past the high watermark.
    pub async fn read_committed(&self, from: Offset, max: usize) -> Result<LogPage, NodeError> {
        self.read_records(from, max).await.map(LogPage::from)
    }

    /// [`NodeHandle::read_committed`] with the records as the log holds
    /// them: a data record's bytes exactly as appended (not as text), and
    /// control records whole.
    pub async fn read_records(&self, from: Offset, max: usize) -> Result<RecordPage, NodeError> {
        self.inner
            .quorum
            .send(ReadCommitted { from, max })
            .await
            .map_err(unavailable)?
    }

    /// Registers a listener: it receives every committed record from the
    /// log start, in order, and leader changes.
    pub async fn register_listener(&self, listener: Listener) -> Result<(), NodeError> {
        self.inner
            .listeners
            .send(RegisterListener(listener))
            .await
            .map_err(unavailable)?
    }

    /// The newest metadata image this node replayed (its `offset` is the
    /// last offset it reflects); None unless `node.state_machine` is
    /// `"metadata"`.
    pub fn metadata_image(&self) -> Option<MetadataImage> {
        self.inner.metadata.as_ref().map(MetadataPublisher::image)
    }

    /// Waits until a linearizable read may be served here (etcd's
    /// ReadIndex): asks the leader (this node, or the one it knows, over
    /// the raft listener) for a read index, an offset below which every
    /// record committed before the call lies, then waits until this node's
    /// own log, and its metadata image if it keeps one, reach it. A read
    /// of this node's log or image afterwards sees every write acknowledged
    /// before the call, by any node. NOT_LEADER when no leader is known or
    /// the leader lost its role meanwhile; UNAVAILABLE when it took longer
    /// than a request timeout. Either way nothing was done: ask again.
    pub async fn read_barrier(&self) -> Result<Offset, AppendError> {
        let wait = Duration::from_millis(self.inner.request_timeout_ms);
        let timed_out = || AppendError::Unavailable(format!("no read index within {wait:?}"));
        let stopped = |e: actix::MailboxError| AppendError::Unavailable(format!("the node is stopped ({e})"));
        let local = self.inner.quorum.send(ReadIndex).await.map_err(stopped)?;
        let index = match local {
            Err(AppendError::NotLeader {
                leader_id: Some(leader),
                ..
            }) if leader != self.inner.node_id => {
                let forwarded = self.inner.controller_client.send(ForwardReadIndex { to: leader });
                tokio::time::timeout(wait, forwarded)
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(stopped)??
            }
            other => other?,
        };
        let committed = self.inner.quorum.send(WaitCommitted(index));
        tokio::time::timeout(wait, committed)
            .await
            .map_err(|_| timed_out())?
            .map_err(stopped)?
            .map_err(|e| AppendError::Unavailable(e.to_string()))?;
        if let Some(publisher) = &self.inner.metadata {
            let mut images = publisher.watch();
            let replayed = images.wait_for(|image| image.offset + 1 >= index);
            tokio::time::timeout(wait, replayed)
                .await
                .map_err(|_| timed_out())?
                .map_err(|_| AppendError::Unavailable("the node is stopping".to_string()))?;
        }
        Ok(index)
    }

    /// Subscribes to the metadata images: the newest at once, then each
    /// new one in order, with what changed ([`MetadataUpdate`]). Err unless
    /// `node.state_machine` is `"metadata"`.
    pub fn subscribe_metadata(&self, recipient: Recipient<MetadataUpdate>) -> Result<(), NodeError> {
        match &self.inner.metadata {
            Some(publisher) => {
                publisher.subscribe(recipient);
                Ok(())
            }
            None => Err(NodeError::Unsupported(
                "this node keeps no metadata image (node.state_machine is not \"metadata\")".to_string(),
            )),
        }
    }

    /// Runs a controller operation and resolves once its records are
    /// committed and this node's own image reflects them (at most a request
    /// timeout longer), so that what follows reads its result here. On a
    /// node that is not the active controller (a follower, a broker) the
    /// operation is forwarded to the one that is. NOT_CONTROLLER when no
    /// active controller is known.
    pub async fn operate(&self, operation: Operation) -> Result<Answer, ControllerError> {
        let (Some(publisher), client) = (&self.inner.metadata, &self.inner.controller_client) else {
            return Err(ControllerError::InvalidRequest(
                "this node keeps no metadata (node.state_machine is not \"metadata\")".to_string(),
            ));
        };
        let leader = match &self.inner.controller {
            Some(controller) => match controller.send(Operate(operation.clone())).await {
                Ok(Err(ControllerError::NotController {
                    leader_id: Some(leader),
                    ..
                })) if leader != self.inner.node_id => Some(leader),
                Ok(Ok(answer)) => return self.replayed(publisher, answer.remote()).await,
                Ok(Err(refused)) => return Err(refused),
                Err(e) => return Err(ControllerError::Unavailable(format!("the node is stopped ({e})"))),
            },
            None => self.describe().await.ok().and_then(|s| s.leader_id),
        };
        let Some(leader) = leader else {
            return Err(ControllerError::NotController {
                leader_id: None,
                message: "no active controller is known yet; retry".to_string(),
            });
        };
        let answer = client
            .send(Forward { to: leader, operation })
            .await
            .map_err(|e| ControllerError::Unavailable(format!("the node is stopped ({e})")))??;
        self.replayed(publisher, answer).await
    }

    /// `answer` once this node's image has reached its offset. The active
    /// controller's own image runs ahead of the one its node publishes, by
    /// the turn the listeners take to replay the same commit.
    async fn replayed(
        &self,
        publisher: &MetadataPublisher,
        answer: OperationAnswer,
    ) -> Result<Answer, ControllerError> {
        let mut images = publisher.watch();
        let wait = Duration::from_millis(self.inner.request_timeout_ms);
        let caught_up = tokio::time::timeout(wait, images.wait_for(|image| image.offset >= answer.offset)).await;
        let image = match caught_up {
            Ok(Ok(image)) => image.clone(),
            _ => {
                return Err(ControllerError::Unavailable(format!(
                    "the operation committed at offset {}, which this node has not replayed within {wait:?}",
                    answer.offset
                )))
            }
        };
        Ok(Answer {
            image,
            broker_epoch: answer.broker_epoch,
            heartbeat: answer.heartbeat,
            refusals: answer.refusals,
        })
    }

    /// Writes a snapshot now at the committed (and locally flushed) end of
    /// the log; when nothing was committed since the latest snapshot, that
    /// one is returned (`created: false`).
    pub async fn create_snapshot(&self) -> Result<SnapshotInfo, NodeError> {
        self.inner.quorum.send(CreateSnapshot).await.map_err(unavailable)?
    }

    pub async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
        let mut snapshot = self.inner.quorum.send(GetMetrics).await.map_err(unavailable)?;
        let commits = self.inner.purgatory.send(GetCommitStats).await.map_err(unavailable)?;
        snapshot.commits_total = commits.commits_total;
        snapshot.commit_latency_avg_ms = commits.commit_latency_avg_ms;
        snapshot.commit_latency_max_ms = commits.commit_latency_max_ms;
        Ok(snapshot)
    }

    /// The bound raft listener address (the real port when configured as 0).
    pub fn raft_addr(&self) -> SocketAddr {
        self.inner.raft_addr
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// True once the node has stopped (after [`NodeHandle::shutdown`] or a
    /// fatal error).
    pub fn is_stopped(&self) -> bool {
        *self.inner.stopped.borrow()
    }

    /// Graceful shutdown: a leader resigns (EndQuorumEpoch to the voters,
    /// waited for at most a second), then the actors stop, the raft
    /// listener closes and the storage thread flushes and exits. Returns
    /// when all of that is done; safe to call more than once.
    pub async fn shutdown(&self) {
        if let Some(side) = &self.inner.broker {
            if !self.is_stopped() {
                crate::broker::controlled_shutdown(self, side).await;
            }
        }
        // A mailbox error means QuorumState has already stopped.
        let _ = self.inner.quorum.send(Shutdown).await;
        let mut stopped = self.inner.stopped.clone();
        // An error means the supervisor is gone (the System is stopping).
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }
}

fn raw_appends_unsupported() -> AppendError {
    AppendError::Unsupported(
        "this node's log holds metadata records, written by its controller; raw appends need node.state_machine = \"log\""
            .to_string(),
    )
}

fn unavailable(e: actix::MailboxError) -> NodeError {
    NodeError::Stopped(format!("the node is stopped ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{Batch, Record};
    use crate::storage::MemoryStore;
    use crate::types::Epoch;

    fn id(end_offset: Offset, epoch: Epoch) -> SnapshotId {
        SnapshotId { end_offset, epoch }
    }

    /// A flushed log with one single-record batch per offset in `[0, end)`:
    /// epoch 1 below 3, epoch 2 from there.
    fn log(end: Offset) -> MemoryStore {
        let mut store = MemoryStore::new();
        for offset in 0..end {
            let epoch = if offset < 3 { 1 } else { 2 };
            store.append(&Batch::new(offset, epoch, &[Record::NoOp])).unwrap();
        }
        store.flush().unwrap();
        store
    }

    /// A starting node's engine gets its newest snapshot and the store's
    /// high watermark hint.
    #[test]
    fn the_recovered_engine_remembers_the_snapshot_and_what_the_store_knew_committed() {
        let store = log(10);
        let view = || LogView::new(0, 0, store.end_offset(), store.epoch_cache());
        let voters: std::collections::BTreeMap<NodeId, String> =
            (1..=3).map(|id| (id, format!("127.0.0.1:{}", 9092 + id))).collect();
        let raft = || RaftConfig::new(1, voters.clone(), "127.0.0.1:9093".to_string());
        let election = ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(2),
        };
        let engine = recovered_engine(raft(), election.clone(), view(), None, 6, 1);
        assert_eq!((engine.high_watermark(), engine.committed_floor()), (0, 6));
        let engine = recovered_engine(raft(), election, view(), Some(id(8, 2)), 6, 1);
        assert_eq!((engine.high_watermark(), engine.committed_floor()), (8, 8));
    }

    #[test]
    fn the_log_continues_a_snapshot_whose_last_offset_it_holds_in_the_same_epoch() {
        let store = log(10);
        assert_eq!(log_continues_snapshot(&store, id(3, 1)), Ok(()));
        assert_eq!(log_continues_snapshot(&store, id(4, 2)), Ok(()));
        assert!(log_continues_snapshot(&store, id(3, 2)).is_err(), "offset 2 is epoch 1");
        assert!(log_continues_snapshot(&store, id(4, 3)).is_err(), "offset 3 is epoch 2");
        assert_eq!(log_continues_snapshot(&store, id(0, 0)), Ok(()), "an empty snapshot");
    }

    #[test]
    fn a_snapshot_ending_at_the_log_end_is_matched_on_the_last_record_and_one_past_it_never() {
        let store = log(10);
        assert_eq!(log_continues_snapshot(&store, id(10, 2)), Ok(()));
        assert!(log_continues_snapshot(&store, id(10, 3)).is_err());
        assert!(log_continues_snapshot(&store, id(11, 2)).is_err(), "past the log end");
    }

    #[test]
    fn a_log_starting_at_the_snapshot_end_is_matched_on_its_start_epoch() {
        // Compacted below 5: offset 4 (epoch 2) is gone from the log and
        // its epoch cache; the start epoch remembers it.
        let mut store = log(10);
        store.delete_before(5).unwrap();
        assert_eq!((store.start_offset(), store.start_epoch()), (5, 2));
        assert_eq!(log_continues_snapshot(&store, id(5, 2)), Ok(()));
        assert!(log_continues_snapshot(&store, id(5, 1)).is_err());
        // Reset to an installed snapshot: empty, starting at its end.
        store.reset(20, 4).unwrap();
        assert_eq!(log_continues_snapshot(&store, id(20, 4)), Ok(()));
        assert!(log_continues_snapshot(&store, id(20, 3)).is_err());
    }
}
